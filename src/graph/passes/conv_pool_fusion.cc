// Fusion: max_pool2d(conv2d or fused_conv2d) with a 2x2 window, stride 2 and no padding
// (NHWC, f32) becomes fused_conv2d with attr max_pool = 2: the convolution's output is
// pooled where it is computed and never written whole (CPU: an L2-sized scratch per
// image or band of rows, src/backends/cpu/conv_kernels.cc). When the convolution's
// output has other readers, all after the pool (a training graph: the pool's gradient
// reads it), the fused node also writes it as a second output (attr conv_output) and
// they read that: the pool still reads the rows from cache, not memory. Level 2, after
// matmul_bias_activation_fusion (which makes the fused_conv2d of conv2d -> relu) and
// the pool-backward fusions (which match the unfused convolution), before dead-code
// elimination (which drops the convolution the fused node replaces).
#include <map>

#include "kiln/graph/passes.h"
#include "kiln/ops/nn_geometry.h"
#include "pass_util.h"

namespace kiln::graph {

void fuse_conv_pool(Graph& g) {
  using pass_util::is_op;
  const std::map<ValueRef, int> uses = count_live_uses(g);
  const OpDef& fused = OpRegistry::global().get("fused_conv2d");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& pool = g.nodes[i];
    if (!is_op(pool, "max_pool2d") || pool.inputs.size() != 1 || pool.outputs[0].dtype != DType::kF32) continue;
    const ValueRef cv = pool.inputs[0];
    const Node& conv = g.nodes[static_cast<size_t>(cv.node)];
    if (!(is_op(conv, "conv2d") || is_op(conv, "fused_conv2d")) || conv.attrs.get_int("max_pool", 0) != 0 ||
        conv.attrs.get_string("data_format", "NHWC") != "NHWC")
      continue;
    // Other readers take the second output, which exists from the pool's place on.
    if (pass_util::read_between(g, cv, static_cast<size_t>(cv.node), i)) continue;
    const bool keep = uses.count(cv) && uses.at(cv) > 1;
    const ops::nn_detail::Pool2dGeometry p =
        ops::nn_detail::pool2d_geometry("max_pool2d", conv.outputs[0].shape, pool.attrs);
    if (!p.nhwc_2x2_stride_2() || p.win.oh != p.h / 2 || p.win.ow != p.w / 2 || p.win.oh < 1 || p.win.ow < 1) continue;
    // The kernel computes only the rows and columns the pool reads: all of them when even.
    if (keep && (p.h % 2 != 0 || p.w % 2 != 0)) continue;
    Node f = conv;
    f.op = &fused;
    f.attrs.set("max_pool", int64_t{2});
    f.outputs = pool.outputs;
    if (keep) {
      f.attrs.set("conv_output", true);
      f.outputs.push_back(conv.outputs[0]);
    }
    pool = std::move(f);  // in the pool's place: every input comes earlier
    if (keep) replace_uses(g, cv, ValueRef{static_cast<int>(i), 1});
  }
}

}  // namespace kiln::graph
