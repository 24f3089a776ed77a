#pragma once
// Automatic mixed precision as a graph pass, after TensorFlow grappler's
// auto_mixed_precision: ops on an allow list compute in a 16-bit type, ops on an infer
// list follow when they sit between such ops, clear ops (data movement) follow their
// inputs, and every other op (deny: exp, log, softmax, reductions, losses, norms,
// optimizer updates, ...) stays in f32. Casts are inserted where precisions meet
// (once per value); a 16-bit value read by an f32 op, a graph output or a variable
// assignment is cast back to f32, so the graph's outputs and variables keep their
// dtypes (variables stay f32 master weights). Constants read by 16-bit ops are
// converted at rewrite time instead of cast on every run.
//
// An op is converted only when its float inputs are all f32 and the CPU backend has a
// kernel for the 16-bit type (CUDA covers the same ops: kernels/coverage tests). f16
// training needs loss scaling (train::LossScaleOptimizer), which the pass does not add;
// bf16 needs none.
//
// In the pipeline (kiln/graph/passes.h) it runs at level 2 before the fusions when
// PassOptions::auto_mixed_precision is kBF16 or kF16 (FunctionOptions::passes for traced
// functions, LoadOptions::passes for model packages, `kiln serve
// --auto_mixed_precision`); kF32 (the default) leaves graphs in f32.
#include <set>
#include <string>

#include "kiln/graph/graph.h"

namespace kiln::graph {

struct AmpLists {
  std::set<std::string> allow;  // always 16-bit: matmul, conv2d and its gradients
  std::set<std::string> infer;  // 16-bit between 16-bit ops: elementwise, activations, pooling
  std::set<std::string> clear;  // follow their inputs: reshape, transpose, concat, pad, stop_gradient
};
// The ops' own classes (OpTraits::amp, src/ops/op_traits.cc).
const AmpLists& default_amp_lists();

// Rewrites `g` as described above; `low` is DType::kBF16 or kF16. Returns how many op
// nodes now compute in `low`.
int auto_mixed_precision(Graph& g, DType low = DType::kBF16, const AmpLists& lists = default_amp_lists());

}  // namespace kiln::graph
