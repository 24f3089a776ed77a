// Vjps of the normalisation ops, composed of elementwise ops and reductions (a fused
// backward kernel would save passes over the activations; these are the reference).
#include <cmath>

#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;

// Every axis of a rank-r tensor but `axis`.
std::vector<int64_t> all_but(int rank, int axis) {
  std::vector<int64_t> r;
  for (int i = 0; i < rank; ++i)
    if (i != axis) r.push_back(i);
  return r;
}

std::vector<int64_t> range(int lo, int hi) {
  std::vector<int64_t> r;
  for (int i = lo; i < hi; ++i) r.push_back(i);
  return r;
}

// Sum over `axes` (no keepdims); no axes means nothing to reduce (not "all").
Tensor sum_over(const Tensor& t, const std::vector<int64_t>& axes) { return axes.empty() ? t : ops::sum(t, axes); }

// A [C] per-channel tensor shaped to broadcast along `axis` of a rank-r tensor.
Tensor along(const Tensor& p, int rank, int axis) {
  std::vector<int64_t> s(static_cast<size_t>(rank), 1);
  s[axis] = p.numel();
  return ops::reshape(p, s);
}

// The contract: each gradient in its input's dtype (f32 parameters of a 16-bit
// input promote the arithmetic to f32).
V fit(V r, const VjpContext& c) {
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i].defined() && r[i].dtype() != c.inputs[i].dtype()) r[i] = ops::cast(r[i], c.inputs[i].dtype());
  return r;
}

double count_except(const Tensor& x, int axis) {
  return x.dim(axis) == 0 ? 0.0 : static_cast<double>(x.numel()) / static_cast<double>(x.dim(axis));
}

// ---- batch norm ----------------------------------------------------------------------------

// y = (x - m) * r * gamma + beta with m, v = batch mean and biased variance over
// R (all axes but the channel), r = 1 / sqrt(v + eps), n = |R|. With k = r * gamma,
// xc = x - m and cotangents gy, gm (of the mean), gv (of the variance):
//   dbeta = sum_R gy,  dgamma = r * sum_R(gy * xc)
//   dx = k * gy + xc * (2 gv / n - k r^2 sum_R(gy * xc) / n) + (gm - k dbeta) / n
V batch_norm_training_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1];
  const Tensor &gy = c.cotangents[0], &gm = c.cotangents[1], &gv = c.cotangents[2];
  const int rank = x.rank();
  const int axis = normalize_axis(c.attrs.get_int("axis"), rank);
  const double eps = c.attrs.get_float("eps");
  const std::vector<int64_t> R = all_but(rank, axis);
  const double n = count_except(x, axis);
  V r(3);
  if (x.numel() == 0) {
    for (size_t i = 0; i < 3; ++i)
      if (c.needs(i)) r[i] = ops::zeros_like(c.inputs[i]);
    return r;
  }
  const Tensor rstd = ops::rsqrt(ops::add(c.outputs[2], scalar_like(c.outputs[2], eps)));  // [C]
  const Tensor xc = ops::sub(x, along(c.outputs[1], rank, axis));
  const Tensor dbeta = sum_over(gy, R);
  const Tensor gxc = sum_over(ops::mul(gy, xc), R);  // sum_R(gy * xc)
  if (c.needs(2)) r[2] = dbeta;
  if (c.needs(1)) r[1] = ops::mul(gxc, rstd);
  if (c.needs(0)) {
    const Tensor k = ops::mul(rstd, gamma);
    const double inv_n = 1.0 / n;
    // a = 2 gv / n - k r^2 gxc / n;  b = (gm - k dbeta) / n   (all [C])
    Tensor a = ops::mul(ops::sub(ops::mul(gv, scalar_like(gv, 2.0)), ops::mul(ops::mul(k, ops::square(rstd)), gxc)),
                        scalar_like(rstd, inv_n));
    Tensor b = ops::mul(ops::sub(gm, ops::mul(k, dbeta)), scalar_like(rstd, inv_n));
    r[0] = ops::add(ops::add(ops::mul(gy, along(k, rank, axis)), ops::mul(xc, along(a, rank, axis))),
                    along(b, rank, axis));
  }
  return fit(std::move(r), c);
}

// y = (x - mean) * r * gamma + beta, r = 1 / sqrt(var + eps), statistics given.
V batch_norm_inference_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &mean = c.inputs[1], &var = c.inputs[2], &gamma = c.inputs[3];
  const Tensor& gy = c.cotangents[0];
  const int rank = x.rank();
  const int axis = normalize_axis(c.attrs.get_int("axis"), rank);
  const std::vector<int64_t> R = all_but(rank, axis);
  const Tensor rstd = ops::rsqrt(ops::add(var, scalar_like(var, c.attrs.get_float("eps"))));
  const Tensor k = ops::mul(rstd, gamma);
  V r(5);
  if (c.needs(0)) r[0] = ops::mul(gy, along(k, rank, axis));
  const bool need_db = c.needs(1) || c.needs(4), need_gxc = c.needs(2) || c.needs(3);
  const Tensor dbeta = need_db ? sum_over(gy, R) : Tensor();
  const Tensor gxc = need_gxc ? sum_over(ops::mul(gy, ops::sub(x, along(mean, rank, axis))), R) : Tensor();
  if (c.needs(1)) r[1] = ops::neg(ops::mul(dbeta, k));
  if (c.needs(2))  // d r / d var = -r^3 / 2
    r[2] = ops::mul(ops::mul(gxc, gamma), ops::mul(ops::mul(rstd, ops::square(rstd)), scalar_like(rstd, -0.5)));
  if (c.needs(3)) r[3] = ops::mul(gxc, rstd);
  if (c.needs(4)) r[4] = dbeta;
  return fit(std::move(r), c);
}

// ---- layer norm, RMS norm ----------------------------------------------------------------

// Over the trailing axes N from begin_axis, leading axes L:
//   xhat = (x - mean_N x) * r, dxh = g * gamma,
//   dx = r * (dxh - mean_N dxh - xhat * mean_N(dxh * xhat)),
//   dgamma = sum_L(g * xhat), dbeta = sum_L g.
V layer_norm_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1];
  const Tensor& g = c.cotangents[0];
  const int rank = x.rank();
  const int begin = normalize_axis(c.attrs.get_int("begin_axis"), rank);
  const std::vector<int64_t> N = range(begin, rank), L = range(0, begin);
  V r(3);
  if (c.needs(2)) r[2] = sum_over(g, L);
  if (!c.needs(0) && !c.needs(1)) return fit(std::move(r), c);
  if (x.numel() == 0) {
    for (size_t i = 0; i < 2; ++i)
      if (c.needs(i)) r[i] = ops::zeros_like(c.inputs[i]);
    return r;
  }
  const Tensor xc = ops::sub(x, ops::mean(x, N, true));
  const Tensor rstd =
      ops::rsqrt(ops::add(ops::mean(ops::square(xc), N, true), scalar_like(x, c.attrs.get_float("eps"))));
  const Tensor xhat = ops::mul(xc, rstd);
  if (c.needs(1)) r[1] = sum_over(ops::mul(g, xhat), L);
  if (c.needs(0)) {
    const Tensor dxh = ops::mul(g, gamma);
    const Tensor inner = ops::add(ops::mean(dxh, N, true), ops::mul(xhat, ops::mean(ops::mul(dxh, xhat), N, true)));
    r[0] = ops::mul(rstd, ops::sub(dxh, inner));
  }
  return fit(std::move(r), c);
}

// y = x * r * gamma over the last axis, r = 1 / sqrt(mean(x^2) + eps):
//   dx = r * dxh - x * r^3 * mean(dxh * x),  dxh = g * gamma;  dgamma = sum_L(g * x * r).
V rms_norm_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1];
  const Tensor& g = c.cotangents[0];
  if (x.numel() == 0) {
    V r(2);
    for (size_t i = 0; i < 2; ++i)
      if (c.needs(i)) r[i] = ops::zeros_like(c.inputs[i]);
    return r;
  }
  const Tensor rr =
      ops::rsqrt(ops::add(ops::mean(ops::square(x), {-1}, true), scalar_like(x, c.attrs.get_float("eps"))));
  V r(2);
  if (c.needs(1)) r[1] = sum_over(ops::mul(g, ops::mul(x, rr)), range(0, x.rank() - 1));
  if (c.needs(0)) {
    const Tensor dxh = ops::mul(g, gamma);
    const Tensor corr = ops::mul(ops::mul(rr, ops::square(rr)), ops::mean(ops::mul(dxh, x), {-1}, true));
    r[0] = ops::sub(ops::mul(rr, dxh), ops::mul(x, corr));
  }
  return fit(std::move(r), c);
}

KILN_REGISTER_VJP("batch_norm_training", batch_norm_training_vjp);
KILN_REGISTER_VJP("batch_norm_inference", batch_norm_inference_vjp);
KILN_REGISTER_VJP("layer_norm", layer_norm_vjp);
KILN_REGISTER_VJP("rms_norm", rms_norm_vjp);

}  // namespace
}  // namespace kiln::ops::grad
