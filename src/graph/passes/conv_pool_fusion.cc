// Fusion: max_pool2d(conv2d or fused_conv2d) with a 2x2 window, stride 2 and no padding
// (NHWC, f32) becomes fused_conv2d with attr max_pool = 2: the convolution's output is
// pooled where it is computed and never written whole (CPU: an L2-sized scratch per
// image or band of rows, src/backends/cpu/conv_kernels.cc). When the convolution's
// output has other readers, all after the pool (a training graph: the pool's gradient
// reads it), the fused node also writes it as a second output (attr conv_output) and
// they read that: the pool still reads the rows from cache, not memory. When those
// readers are all the pool's gradient (max_pool2d_backward with the ReLU folded in as
// the forward has it, or fused_conv2d_backward_filter), the second output is the pool's
// argmax mask instead (attr pool_mask, u8 of the pooled shape) and they read that
// (max_pool2d_backward_mask; fused_conv2d_backward_filter with pool_mask): the
// convolution's output is never written (PassOptions::pool_mask false, or that output
// also a graph output or an assigned value: conv_output). Level 2, after
// matmul_bias_activation_fusion (which makes the fused_conv2d of conv2d -> relu) and
// the pool-backward fusions (which match the unfused convolution), before dead-code
// elimination (which drops the convolution the fused node replaces).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/op_def.h"
#include "kiln/graph/passes.h"
#include "backends/common/nn_geometry.h"
#include "pass_util.h"

namespace kiln::graph {
namespace {

using pass_util::is_op;

// A live reader of the convolution's output cv that the pool's mask can serve: the
// pool's gradient (max_pool2d_backward of this 2x2/2 pool, or the fused filter gradient
// that contains it) reading cv as the pool's input only, with the ReLU folded in as the
// forward's (relu attr == the convolution's relu).
bool mask_serves(const Node& r, ValueRef cv, bool relu) {
  if (r.attrs.get_bool("relu", false) != relu) return false;
  size_t slot;
  if (is_op(r, "max_pool2d_backward")) {
    if (r.inputs.size() != 2 || r.outputs[0].dtype != DType::kF32 ||
        !nn_geometry::pool2d_geometry("max_pool2d_backward", r.outputs[0].shape, r.attrs).nhwc_2x2_stride_2())
      return false;
    slot = 0;
  } else if (is_op(r, "fused_conv2d_backward_filter")) {
    if (r.inputs.size() != 3 || r.attrs.get_bool("pool_mask", false)) return false;
    slot = 1;
  } else {
    return false;
  }
  for (size_t q = 0; q < r.inputs.size(); ++q)
    if ((r.inputs[q] == cv) != (q == slot)) return false;
  return true;
}

// Points such a reader at the mask (value m) instead of the convolution's output.
void read_mask(Node& r, ValueRef m, const OpDef& backward_mask) {
  if (is_op(r, "max_pool2d_backward")) {
    Attrs a;
    a.set("bias_grad", r.attrs.get_bool("bias_grad", false));
    r.op = &backward_mask;
    r.attrs = std::move(a);
    r.inputs[0] = m;
  } else {
    r.attrs.set("pool_mask", true);
    r.attrs.set("relu", false);
    r.inputs[1] = m;
  }
}

}  // namespace

void fuse_conv_pool(Graph& g, bool masks) {
  const std::map<ValueRef, int> uses = count_live_uses(g);
  const std::vector<bool> live = live_nodes(g);
  const OpDef& backward_mask = OpRegistry::global().get("max_pool2d_backward_mask");
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
    const nn_geometry::Pool2dGeometry p =
        nn_geometry::pool2d_geometry("max_pool2d", conv.outputs[0].shape, pool.attrs);
    if (!p.nhwc_2x2_stride_2() || p.win.oh != p.h / 2 || p.win.ow != p.w / 2 || p.win.oh < 1 || p.win.ow < 1) continue;
    // The kernel computes only the rows and columns the pool reads: all of them when even.
    if (keep && (p.h % 2 != 0 || p.w % 2 != 0)) continue;
    // Readers that are all the pool's gradient take its mask (1 byte per pooled value)
    // instead of the convolution's output (4 per convolution value): a train step then
    // never writes that output.
    const bool relu = conv.attrs.get_string("activation", "") == "relu";
    std::vector<size_t> readers;  // the live readers of cv, all after the pool
    for (size_t j = i + 1; keep && j < g.nodes.size(); ++j)
      if (live[j] && std::find(g.nodes[j].inputs.begin(), g.nodes[j].inputs.end(), cv) != g.nodes[j].inputs.end())
        readers.push_back(j);
    // A graph output or assigned value needs the convolution's output itself: with the
    // mask the unfused convolution would stay alive for it and run a second time.
    const bool external =
        std::find(g.outputs.begin(), g.outputs.end(), cv) != g.outputs.end() ||
        std::any_of(g.assignments.begin(), g.assignments.end(), [&](const Assignment& a) { return a.value == cv; });
    const bool mask =
        keep && !external && masks &&
        std::all_of(readers.begin(), readers.end(), [&](size_t j) { return mask_serves(g.nodes[j], cv, relu); });
    Node f = conv;
    f.op = &fused;
    f.attrs.set("max_pool", int64_t{2});
    f.outputs = pool.outputs;
    if (mask) {
      f.attrs.set("pool_mask", true);
      f.outputs.push_back({pool.outputs[0].shape, DType::kU8});
    } else if (keep) {
      f.attrs.set("conv_output", true);
      f.outputs.push_back(conv.outputs[0]);
    }
    pool = std::move(f);  // in the pool's place: every input comes earlier
    const ValueRef second{static_cast<int>(i), 1};
    if (mask) {
      for (size_t j : readers) read_mask(g.nodes[j], second, backward_mask);
    } else if (keep) {
      replace_uses(g, cv, second);
    }
  }
}

}  // namespace kiln::graph
