#pragma once
// What one run of the graph optimiser is told (the graph half of ONNX Runtime's
// SessionOptions, TensorFlow's RewriterConfig): the level, the numerics the caller chose,
// and where to dump the graphs. Carried by FunctionOptions (kiln/graph/function.h) and
// the model package's LoadOptions (kiln/package/saved_model.h); passes read nothing
// from the environment.
#include <string>

#include "kiln/core/dtype.h"

namespace kiln::graph {

// Level 0: no passes; 1: cleanups (dead code, CSE, constant folding, algebra, shapes);
// 2 (default): also batch-norm folding, mixed precision when asked, pattern fusions.
inline constexpr int kDefaultLevel = 2;

struct PassOptions {
  int level = kDefaultLevel;
  // Automatic mixed precision (kiln/graph/auto_mixed_precision.h): DType::kF32 leaves
  // the graph in f32 (default); kBF16 or kF16 computes the allowed ops in that type. A
  // choice of numerics, so only the caller makes it: a model package stays as stored
  // unless its loader asks.
  DType auto_mixed_precision = DType::kF32;
  // A conv2d + max_pool2d pair in a train step keeps the pool's argmax mask for the
  // backward pass (true, default: the convolution's output need not stay alive) or the
  // convolution's output (false).
  bool pool_mask = true;
  // Non-empty: write <dump_dir>/<name>.<NN>-<pass>.{txt,dot} before the first pass and
  // after each one. Empty: the runtime flag KILN_DUMP_GRAPH (kiln/core/flags.h), if set.
  std::string dump_dir;
  std::string name = "function";
};

}  // namespace kiln::graph
