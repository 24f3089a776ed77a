// Conv + batch-norm folding for inference: batch_norm_inference(conv2d(x, w[, b]))
// with constant filter, bias and statistics (a frozen graph: an exported package)
// becomes conv2d(x, w * s, (b - mean) * s + beta), s = gamma / sqrt(var + eps) per
// output channel: one op and one pass over the activations fewer. Runs before fusion,
// so a ReLU after the batch norm then fuses into the convolution too. The folded
// weights round differently from the two-op form (within f32 rounding).
#include <map>

#include "kiln/graph/passes.h"
#include "kiln/ops.h"
#include "pass_util.h"

namespace kiln::graph {
namespace {

using pass_util::insert_constant;
using pass_util::is_op;

const Tensor* constant(const Graph& g, ValueRef v) {
  const Node& n = g.nodes[static_cast<size_t>(v.node)];
  return n.kind == NodeKind::kConstant && n.constant.dtype() == DType::kF32 ? &n.constant : nullptr;
}


}  // namespace

void fold_conv_batch_norm(Graph& g) {
  bool folded_any = false;
  std::map<ValueRef, int> uses = count_uses(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!is_op(g.nodes[i], "batch_norm_inference")) continue;
    const ValueRef cv = g.nodes[i].inputs[0];
    const Node& conv = g.nodes[static_cast<size_t>(cv.node)];
    if (!is_op(conv, "conv2d") || uses[cv] != 1 || conv.outputs[0].dtype != DType::kF32) continue;
    const bool nhwc = conv.attrs.get_string("data_format", "NHWC") == "NHWC";
    const int rank = conv.outputs[0].shape.rank();
    int64_t axis = g.nodes[i].attrs.get_int("axis");
    if (axis < 0) axis += rank;
    if (axis != (nhwc ? rank - 1 : 1)) continue;  // normalises the conv's output channels
    const Tensor* w = constant(g, conv.inputs[1]);
    const Tensor* b = conv.inputs.size() > 2 ? constant(g, conv.inputs[2]) : nullptr;
    const Tensor *mean = constant(g, g.nodes[i].inputs[1]), *var = constant(g, g.nodes[i].inputs[2]);
    const Tensor *gamma = constant(g, g.nodes[i].inputs[3]), *beta = constant(g, g.nodes[i].inputs[4]);
    if (!w || (conv.inputs.size() > 2 && !b) || !mean || !var || !gamma || !beta) continue;

    Tensor w2, b2;
    {
      pass_util::Untraced compile_time;
      const double eps = g.nodes[i].attrs.get_float("eps");
      const int64_t c = mean->numel();
      Tensor s = ops::mul(*gamma, ops::rsqrt(ops::add(*var, ops::scalar(static_cast<float>(eps)))));
      // HWIO: output channels last; OIHW: first.
      w2 = ops::mul(*w, nhwc ? ops::reshape(s, {1, 1, 1, c}) : ops::reshape(s, {c, 1, 1, 1}));
      b2 = ops::add(ops::mul(b ? ops::sub(*b, *mean) : ops::neg(*mean), s), *beta);
    }

    int conv_at = cv.node, bn_at = static_cast<int>(i);
    const ValueRef wv = insert_constant(g, conv_at, w2);
    const ValueRef bv = insert_constant(g, conv_at + 1, b2);
    conv_at += 2;
    bn_at += 2;
    Node& folded = g.nodes[static_cast<size_t>(conv_at)];
    folded.inputs = {folded.inputs[0], wv, bv};
    replace_uses(g, {bn_at, 0}, {conv_at, 0});
    i = static_cast<size_t>(bn_at);
    folded_any = true;
    uses = count_uses(g);  // the inserts moved the keys (rare: once per folded pair)
  }
  // The batch norms and the old filters are dead: drop them now, so that the fusion
  // passes see the convolutions' single readers.
  if (folded_any) eliminate_dead_code(g);
}

}  // namespace kiln::graph
