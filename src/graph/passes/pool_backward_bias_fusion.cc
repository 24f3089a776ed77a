// Fusion: sum(max_pool2d_backward(x, dy), every axis but the channel one) -> a second
// output of the max_pool2d_backward (attr bias_grad). The pattern is a training graph's
// bias gradient of a convolution followed by max pooling: the pool's backward writes
// dx, the conv's bias gradient sums it, and the filter and data gradients read it too.
// With the fusion the sum is taken while dx is written (CPU: the 2x2 stride-2 NHWC f32
// kernel; the other paths and CUDA run the sum kernel after), so dx is not read again
// for it. Level 2, after pool_backward_relu_fusion (whose fused op is the one a ReLU'd
// convolution's sum reads); the sum is left for dead-code elimination.
#include <algorithm>
#include <map>

#include "kiln/core/tensor_spec.h"
#include "kiln/graph/passes.h"
#include "backends/common/nn_geometry.h"
#include "pass_util.h"

namespace kiln::graph {

void fuse_pool_backward_bias(Graph& g) {
  using pass_util::is_op;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& s = g.nodes[i];
    if (!is_op(s, "sum") || s.inputs.size() != 1 || s.attrs.get_bool("keepdims", false)) continue;
    const ValueRef pv = s.inputs[0];
    Node& pool = g.nodes[static_cast<size_t>(pv.node)];
    if (!is_op(pool, "max_pool2d_backward") || pv.index != 0 || pool.outputs.size() != 1) continue;
    const Shape& dx = pool.outputs[0].shape;
    if (dx.rank() != 4) continue;
    const nn_geometry::Pool2dGeometry p = nn_geometry::pool2d_geometry("max_pool2d_backward", dx, pool.attrs);
    std::vector<int64_t> axes = s.attrs.get_ints("axes");
    for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
    std::sort(axes.begin(), axes.end());
    const TensorMeta db{Shape{p.c}, pool.outputs[0].dtype};
    if (axes != p.non_channel_axes() || s.outputs[0].shape != db.shape || s.outputs[0].dtype != db.dtype) continue;
    pool.attrs.set("bias_grad", true);
    pool.outputs.push_back(db);
    replace_uses(g, ValueRef{static_cast<int>(i), 0}, ValueRef{pv.node, 1});
  }
}

}  // namespace kiln::graph
