// Vjps of softmax, log_softmax, dropout, embedding and scaled dot-product attention
// (convolution and pooling: nn_conv_grad.cc; normalisation: nn_norm_grad.cc).
#include <cmath>
#include <limits>

#include "../op_util.h"
#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;
using detail::call1;

// dx = y * (g - sum(g * y)) along the axis.
V softmax_vjp(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  const Tensor gy = ops::mul(c.cotangents[0], y);
  return {ops::sub(gy, ops::mul(y, ops::sum(gy, {c.attrs.get_int("axis", -1)}, true)))};
}

// dx = g - softmax(x) * sum(g), softmax(x) = exp(y).
V log_softmax_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  return {ops::sub(g, ops::mul(ops::exp(c.outputs[0]), ops::sum(g, {c.attrs.get_int("axis", -1)}, true)))};
}

// The mask depends only on (seed, rate, shape), so the same op on g applies the
// same mask and scale.
V dropout_vjp(const VjpContext& c) { return {call1(KILN_OP("dropout"), {c.cotangents[0]}, c.attrs)}; }

// out = gather(table, ids, axis 0): the adjoint scatters rows back, duplicates adding.
V embedding_vjp(const VjpContext& c) {
  const Tensor &table = c.inputs[0], &ids = c.inputs[1];
  if (!c.needs(0)) return {Tensor(), Tensor()};
  return {ops::scatter_add(ops::zeros_like(table), ids, c.cotangents[0], 0), Tensor()};
}

// Each gradient in its input's dtype (an f32 mask of a 16-bit q promotes the
// arithmetic to f32).
V fit(V r, const VjpContext& c) {
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i].defined() && r[i].dtype() != c.inputs[i].dtype()) r[i] = ops::cast(r[i], c.inputs[i].dtype());
  return r;
}

// Recomputes P = softmax(S), S = scale * Q K^T (+ float mask, masked-out entries
// -inf), with the kernel's conventions (causal is top-left aligned; a row with
// every key masked gives P = 0). Then with G the output cotangent:
//   dV = P^T G,  dP = G V^T,  dS = P * (dP - rowsum(dP * P)),
//   dQ = scale * dS K,  dK = scale * dS^T Q,  d(float mask) = dS,
// each summed over the batch dims the operand was broadcast along.
V attention_vjp(const VjpContext& c) {
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const Tensor mask = c.inputs.size() == 4 ? c.inputs[3] : Tensor();
  const Tensor& g = c.cotangents[0];
  const int64_t lq = q.dim(-2), d = q.dim(-1), lk = k.dim(-2);
  V r(c.inputs.size());
  if (g.numel() == 0 || lk == 0 || q.numel() == 0) {
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (c.needs(i)) r[i] = ops::zeros_like(c.inputs[i]);
    return r;
  }
  const double scale =
      c.attrs.has("scale") ? c.attrs.get_float("scale") : (d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0);
  const bool causal = c.attrs.get_bool("causal", false);
  Tensor s = ops::mul(ops::matmul(q, k, false, true), scalar_like(q, scale));
  Tensor keep;                    // bool, broadcasts to S
  bool maybe_empty_rows = false;  // only masks empty a row (causal row i keeps key 0)
  if (mask.defined()) {
    if (mask.dtype() == DType::kBool)
      keep = mask;
    else
      s = ops::add(s, mask);
    maybe_empty_rows = true;
  }
  if (causal) {
    Tensor ck = ops::less_equal(ops::reshape(ops::arange(static_cast<double>(lk), DType::kI64), {1, lk}),
                                ops::reshape(ops::arange(static_cast<double>(lq), DType::kI64), {lq, 1}));
    keep = keep.defined() ? ops::logical_and(keep, ck) : ck;
  }
  const Tensor neg_inf = ops::scalar(-std::numeric_limits<double>::infinity(), s.dtype());
  if (keep.defined()) s = ops::where(keep, s, neg_inf);
  Tensor p = ops::softmax(s, -1);
  if (maybe_empty_rows) p = ops::where(ops::greater(ops::max(s, {-1}, true), neg_inf), p, scalar_like(p, 0));

  if (c.needs(2)) r[2] = sum_to(ops::matmul(p, g, true, false), v.shape());
  const bool need_ds = c.needs(0) || c.needs(1) || (mask.defined() && c.needs(3));
  if (!need_ds) return fit(std::move(r), c);
  const Tensor dp = ops::matmul(g, v, false, true);
  const Tensor ds = ops::mul(p, ops::sub(dp, ops::sum(ops::mul(dp, p), {-1}, true)));
  if (c.needs(0)) r[0] = sum_to(ops::mul(ops::matmul(ds, k), scalar_like(ds, scale)), q.shape());
  if (c.needs(1)) r[1] = sum_to(ops::mul(ops::matmul(ds, q, true, false), scalar_like(ds, scale)), k.shape());
  if (mask.defined() && mask.dtype() != DType::kBool && c.needs(3)) r[3] = sum_to(ds, mask.shape());
  return fit(std::move(r), c);
}

KILN_REGISTER_VJP("softmax", softmax_vjp);
KILN_REGISTER_VJP("log_softmax", log_softmax_vjp);
KILN_REGISTER_VJP("dropout", dropout_vjp);
KILN_REGISTER_VJP("embedding", embedding_vjp);
KILN_REGISTER_VJP("scaled_dot_product_attention", attention_vjp);

}  // namespace
}  // namespace kiln::ops::grad
