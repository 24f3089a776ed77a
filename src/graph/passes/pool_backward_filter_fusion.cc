// Fusion: conv2d_backward_filter(x, max_pool2d_backward(y, dp)) with a 2x2 window at
// stride 2 and no padding (NHWC, f32), the pool's input gradient read by nothing else,
// becomes fused_conv2d_backward_filter(x, y, dp) (kiln/ops/fused.h). The pattern is the
// training graph of a network's first convolution followed by max pooling: its input
// needs no gradient, so the filter gradient is the only reader of the pool's dx, which
// the fused kernel then never writes whole. The pool's relu (pool_backward_relu_fusion)
// and bias gradient (pool_backward_bias_fusion) move to the fused node; a reader of
// that bias gradient placed before the filter gradient keeps the graph unfused (the
// fused node takes the filter gradient's place). Level 2, after those two passes; the
// max_pool2d_backward is left for dead-code elimination.
#include <map>

#include "kiln/core/op_def.h"
#include "kiln/graph/passes.h"
#include "backends/common/nn_geometry.h"
#include "pass_util.h"

namespace kiln::graph {

void fuse_pool_backward_filter(Graph& g) {
  using pass_util::is_op;
  const std::map<ValueRef, int> uses = count_live_uses(g);  // the bias fusion's sum still reads dx
  const OpDef& fused = OpRegistry::global().get("fused_conv2d_backward_filter");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& f = g.nodes[i];
    if (!is_op(f, "conv2d_backward_filter") || f.inputs.size() != 2 || f.outputs[0].dtype != DType::kF32 ||
        f.attrs.get_string("data_format", "NHWC") != "NHWC")
      continue;
    const ValueRef dv = f.inputs[1];
    const Node& pool = g.nodes[static_cast<size_t>(dv.node)];
    if (!is_op(pool, "max_pool2d_backward") || dv.index != 0 || uses.count(dv) == 0 || uses.at(dv) != 1) continue;
    if (!nn_geometry::pool2d_geometry("max_pool2d_backward", pool.outputs[0].shape, pool.attrs).nhwc_2x2_stride_2())
      continue;
    const bool bias_grad = pool.outputs.size() > 1;
    const ValueRef db{dv.node, 1};
    if (bias_grad && pass_util::read_between(g, db, static_cast<size_t>(dv.node), i)) continue;
    Node n = f;  // the convolution's attrs and filter_shape
    n.op = &fused;
    n.inputs = {f.inputs[0], pool.inputs[0], pool.inputs[1]};
    n.attrs.set("relu", pool.attrs.get_bool("relu", false));
    if (bias_grad) {
      n.attrs.set("bias_grad", true);
      n.outputs.push_back(pool.outputs[1]);
    }
    f = std::move(n);
    if (bias_grad) replace_uses(g, db, ValueRef{static_cast<int>(i), 1});
  }
}

}  // namespace kiln::graph
