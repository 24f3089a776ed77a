// Vjps of the reductions. The cotangent of a reduction is first re-expanded to
// broadcast against the input (expand_reduced: a free reshape), so each vjp is a few
// broadcasting elementwise ops.
//
// Conventions:
//   max/min: the gradient is shared equally among the tied extreme elements (as
//     TensorFlow and PyTorch do), so it sums to the cotangent.
//   prod: exact with zeros in the input (the gradient of an element is the product
//     of the others; with two or more zeros in a slice all of them are 0).
//   var/std with N - ddof <= 0, std of a constant slice, logsumexp of an all -inf
//     slice: the gradient is inf/NaN, like the value's derivative.
// all, any, argmax and argmin are non-differentiable.
#include "../op_util.h"
#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;

struct Reduction {
  std::vector<int64_t> axes;  // as given (empty = all)
  bool keepdims;
  int64_t count;  // elements reduced into each output
};

Reduction reduction(const VjpContext& c) {
  Reduction r{c.attrs.get_ints("axes", {}), c.attrs.get_bool("keepdims", false), 1};
  const Shape& in = c.inputs[0].shape();
  for (int a : detail::normalize_axes(r.axes, in.rank(), "grad")) r.count *= in[a];
  return r;
}

// The cotangent (or output) re-expanded to broadcast against the input.
Tensor expand(const VjpContext& c, const Reduction& r, const Tensor& t) {
  return expand_reduced(t, c.inputs[0].shape(), r.axes, r.keepdims);
}

Tensor broadcast_like(const Tensor& t, const Tensor& x) {
  return t.shape() == x.shape() ? t : ops::broadcast_to(t, x.shape().vec());
}

V sum_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  if (!is_floating(x.dtype())) return {Tensor()};
  return {broadcast_like(expand(c, reduction(c), c.cotangents[0]), x)};
}

V mean_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  if (!is_floating(x.dtype())) return {Tensor()};
  Reduction r = reduction(c);
  // Scale the (small) reduced cotangent before broadcasting it.
  Tensor g = ops::mul(c.cotangents[0], scalar_like(c.cotangents[0], 1.0 / static_cast<double>(r.count)));
  return {broadcast_like(expand(c, r, g), x)};
}

// Shared by max and min: the cotangent split equally among the elements equal to the result.
V extreme_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  if (!is_floating(x.dtype())) return {Tensor()};
  Reduction r = reduction(c);
  Tensor hit = ops::cast(ops::equal(x, expand(c, r, c.outputs[0])), x.dtype());
  Tensor ties = ops::sum(hit, r.axes, /*keepdims=*/true);
  return {ops::mul(hit, ops::div(expand(c, r, c.cotangents[0]), ties))};
}

// d prod / d x_i = product of the other elements. With zeros: let p be the product of
// the nonzero elements and z the number of zeros in the slice; x_i's gradient is
// p / x_i when z == 0, p for the zero itself when z == 1, and 0 otherwise, i.e.
// p / (x_i or 1) where z == [x_i == 0], else 0.
V prod_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  if (!is_floating(x.dtype())) return {Tensor()};
  Reduction r = reduction(c);
  const Tensor zero = scalar_like(x, 0);
  Tensor is_zero = ops::equal(x, zero);
  Tensor nonzero = ops::where(is_zero, scalar_like(x, 1), x);
  Tensor zf = ops::cast(is_zero, x.dtype());
  Tensor zeros_in_slice = ops::sum(zf, r.axes, /*keepdims=*/true);
  Tensor others = ops::div(ops::prod(nonzero, r.axes, /*keepdims=*/true), nonzero);
  Tensor d = ops::where(ops::equal(zeros_in_slice, zf), others, zero);
  return {ops::mul(d, expand(c, r, c.cotangents[0]))};
}

// var = sum((x - m)^2) / (N - ddof): d var / d x = 2 (x - m) / (N - ddof).
V var_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  Reduction r = reduction(c);
  const double denom = static_cast<double>(r.count - c.attrs.get_int("ddof", 0));
  Tensor centered = ops::sub(x, ops::mean(x, r.axes, /*keepdims=*/true));
  const Tensor& g = c.cotangents[0];
  return {ops::mul(centered, expand(c, r, ops::mul(g, scalar_like(g, 2.0 / denom))))};
}

// std = sqrt(var): d std / d x = (x - m) / ((N - ddof) std).
V std_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  Reduction r = reduction(c);
  const double denom = static_cast<double>(r.count - c.attrs.get_int("ddof", 0));
  Tensor centered = ops::sub(x, ops::mean(x, r.axes, /*keepdims=*/true));
  const Tensor& y = c.outputs[0];
  Tensor scale = ops::div(c.cotangents[0], ops::mul(y, scalar_like(y, denom)));
  return {ops::mul(centered, expand(c, r, scale))};
}

// d lse / d x = softmax(x) = exp(x - lse).
V logsumexp_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  Reduction r = reduction(c);
  Tensor p = ops::exp(ops::sub(x, expand(c, r, c.outputs[0])));
  return {ops::mul(p, expand(c, r, c.cotangents[0]))};
}

KILN_REGISTER_VJP("sum", sum_vjp);
KILN_REGISTER_VJP("mean", mean_vjp);
KILN_REGISTER_VJP("max", extreme_vjp);
KILN_REGISTER_VJP("min", extreme_vjp);
KILN_REGISTER_VJP("prod", prod_vjp);
KILN_REGISTER_VJP("var", var_vjp);
KILN_REGISTER_VJP("std", std_vjp);
KILN_REGISTER_VJP("logsumexp", logsumexp_vjp);

}  // namespace
}  // namespace kiln::ops::grad
