#pragma once
// Graph passes: one per file (src/graph/passes/), composed in one ordered list with
// levels (ONNX Runtime's layout). Each pass rewrites a Graph in place and keeps its
// meaning: the same outputs (to rounding where a pass says so) and the same variable
// assignments.
//
// Level 1: dead-code elimination, common-subexpression elimination, constant
// folding, algebraic simplification (identity ops, x*1, x+0, double transpose,
// reshape chains, cast round trips through a wider type, stop_gradient), shape
// simplification with the traced shapes (broadcast_to/tile/pad/slice/concat/split
// that change nothing, reductions and transposes that only move size-1 dims become
// reshapes (views), broadcast_to feeding a binary op that broadcasts anyway).
// Level 2 (default): conv2d + batch_norm_inference folding (constant filter and
// statistics), the automatic mixed-precision pass (only when PassOptions asks:
// kiln/graph/auto_mixed_precision.h), softmax / log_softmax / layer_norm written
// out of primitive ops into the fused op, fusion (matmul + bias + ReLU into
// fused_matmul, conv2d + ReLU into fused_conv2d, max_pool2d_backward + relu_grad, a
// convolution's bias gradient into the max_pool2d_backward before it, that backward
// into the filter gradient of a convolution whose input needs no gradient
// (fused_conv2d_backward_filter), conv2d + 2x2 max_pool2d in inference graphs,
// trees of f32 elementwise ops into fused_elementwise: one loop, with inputs of the
// output's shape, single elements, or broadcast along leading dims such as a bias).
#include <map>
#include <string>
#include <vector>

#include "kiln/graph/graph.h"
#include "kiln/graph/pass_options.h"

namespace kiln::graph {

struct Pass {
  const char* name;
  int level;  // runs when the pipeline's level >= level
  void (*run)(Graph& g, const PassOptions& options);
};

// Every pass in pipeline order.
const std::vector<Pass>& passes();

// Runs the passes of level <= options.level in order (dumping graphs as
// options.dump_dir says).
void optimize(Graph& g, const PassOptions& options = {});

// The passes, callable alone (tests).
void eliminate_dead_code(Graph& g);
void eliminate_common_subexpressions(Graph& g);
void fold_constants(Graph& g);
void simplify_algebra(Graph& g);
void fold_conv_batch_norm(Graph& g);
void simplify_shapes(Graph& g);
void fuse_normalization_patterns(Graph& g);
void fuse_matmul_bias_activation(Graph& g);
void fuse_pool_backward_relu(Graph& g);
void fuse_pool_backward_bias(Graph& g);
void fuse_pool_backward_filter(Graph& g);
// masks: keep the pool's argmax mask in train steps (PassOptions::pool_mask).
void fuse_conv_pool(Graph& g, bool masks = true);
void fuse_elementwise(Graph& g);

// Helpers for passes: every use of `from` (node inputs, outputs, assignments) now
// reads `to`.
void replace_uses(Graph& g, ValueRef from, ValueRef to);
// How many times each value is read: by node inputs (with repeats), graph outputs and
// assignments.
std::map<ValueRef, int> count_uses(const Graph& g);
// Per node: whether an output or an assignment depends on it (inputs are always live);
// what dead-code elimination keeps.
std::vector<bool> live_nodes(const Graph& g);
// count_uses, counting only the inputs of live nodes (a fusion earlier in the pipeline
// leaves the nodes it replaced reading their inputs until dead-code elimination).
std::map<ValueRef, int> count_live_uses(const Graph& g);

}  // namespace kiln::graph
