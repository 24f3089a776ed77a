// Vjps of the elementwise ops (binary ones sum broadcast dimensions back down).
//
// Conventions at kinks and ties (subgradients, as TensorFlow picks them):
//   kinks: abs'(0) = 0, relu'(0) = relu6'(0) = relu6'(6) = 0,
//     leaky_relu'(0) = elu'(0) = alpha;
//   clip: gradient flows where min <= x <= max (bounds inclusive);
//   maximum/minimum: on a tie (a == b) the whole gradient goes to a;
//   pow: d/db is 0 where a <= 0 (log a undefined there).
// Ops whose outputs are piecewise constant (sign, floor, ceil, round, comparisons,
// logical ops) are declared non-differentiable and stop gradients.
#include <cmath>

#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;

V add_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  return {c.needs(0) ? sum_to(g, c.inputs[0].shape()) : Tensor(),
          c.needs(1) ? sum_to(g, c.inputs[1].shape()) : Tensor()};
}

V sub_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  return {c.needs(0) ? sum_to(g, c.inputs[0].shape()) : Tensor(),
          c.needs(1) ? sum_to(ops::neg(g), c.inputs[1].shape()) : Tensor()};
}

V mul_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  return {c.needs(0) ? sum_to(ops::mul(g, b), a.shape()) : Tensor(),
          c.needs(1) ? sum_to(ops::mul(g, a), b.shape()) : Tensor()};
}

V div_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  Tensor ga = ops::div(g, b);
  return {c.needs(0) ? sum_to(ga, a.shape()) : Tensor(),
          c.needs(1) ? sum_to(ops::neg(ops::mul(ga, c.outputs[0])), b.shape()) : Tensor()};
}

// d(a^b) = b a^(b-1) da + a^b log(a) db.
V pow_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  V r(2);
  if (c.needs(0)) r[0] = sum_to(ops::mul(g, ops::mul(b, ops::pow(a, ops::sub(b, scalar_like(b, 1))))), a.shape());
  if (c.needs(1)) {
    // log(a) where a > 0, else 0: log(1) = 0 keeps the masked lanes (and their second
    // derivatives) finite.
    Tensor log_a = ops::log(ops::where(ops::greater(a, scalar_like(a, 0)), a, scalar_like(a, 1)));
    r[1] = sum_to(ops::mul(ops::mul(g, c.outputs[0]), log_a), b.shape());
  }
  return r;
}

// maximum/minimum: `mask` marks where a was chosen (ties included).
V select_vjp(const VjpContext& c, const Tensor& mask) {
  const Tensor& g = c.cotangents[0];
  const Tensor zero = scalar_like(g, 0);
  return {c.needs(0) ? sum_to(ops::where(mask, g, zero), c.inputs[0].shape()) : Tensor(),
          c.needs(1) ? sum_to(ops::where(mask, zero, g), c.inputs[1].shape()) : Tensor()};
}
V maximum_vjp(const VjpContext& c) { return select_vjp(c, ops::greater_equal(c.inputs[0], c.inputs[1])); }
V minimum_vjp(const VjpContext& c) { return select_vjp(c, ops::less_equal(c.inputs[0], c.inputs[1])); }

V where_vjp(const VjpContext& c) {
  const Tensor& cond = c.inputs[0];
  const Tensor& g = c.cotangents[0];
  const Tensor zero = scalar_like(g, 0);
  return {Tensor(), c.needs(1) ? sum_to(ops::where(cond, g, zero), c.inputs[1].shape()) : Tensor(),
          c.needs(2) ? sum_to(ops::where(cond, zero, g), c.inputs[2].shape()) : Tensor()};
}

// The gradient of a cast is the cotangent cast back; integer/bool inputs get none.
V cast_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  if (!is_floating(x.dtype()) || !c.needs(0)) return {Tensor()};
  return {ops::cast(c.cotangents[0], x.dtype())};
}

// ---- unary -------------------------------------------------------------------------
// A unary op's vjp runs only when its one input needs a gradient.

V neg_vjp(const VjpContext& c) { return {ops::neg(c.cotangents[0])}; }
V abs_vjp(const VjpContext& c) { return {ops::mul(c.cotangents[0], ops::sign(c.inputs[0]))}; }
V exp_vjp(const VjpContext& c) { return {ops::mul(c.cotangents[0], c.outputs[0])}; }
V log_vjp(const VjpContext& c) { return {ops::div(c.cotangents[0], c.inputs[0])}; }
V log1p_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {ops::div(c.cotangents[0], ops::add(x, scalar_like(x, 1)))};
}
V square_vjp(const VjpContext& c) {
  return {ops::mul(c.cotangents[0], ops::mul(c.inputs[0], scalar_like(c.inputs[0], 2)))};
}
// sqrt' = 1 / (2 sqrt(x)).
V sqrt_vjp(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {ops::mul(ops::div(c.cotangents[0], y), scalar_like(y, 0.5))};
}
// rsqrt' = -x^(-3/2) / 2 = -rsqrt(x) / (2 x).
V rsqrt_vjp(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {ops::mul(ops::div(ops::mul(c.cotangents[0], y), c.inputs[0]), scalar_like(y, -0.5))};
}
// (1/x)' = -1/x^2 = -y^2.
V reciprocal_vjp(const VjpContext& c) { return {ops::neg(ops::mul(c.cotangents[0], ops::square(c.outputs[0])))}; }
V sin_vjp(const VjpContext& c) { return {ops::mul(c.cotangents[0], ops::cos(c.inputs[0]))}; }
V cos_vjp(const VjpContext& c) { return {ops::neg(ops::mul(c.cotangents[0], ops::sin(c.inputs[0])))}; }
V tanh_vjp(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {ops::mul(c.cotangents[0], ops::sub(scalar_like(y, 1), ops::square(y)))};
}
V sigmoid_vjp(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {ops::mul(ops::mul(c.cotangents[0], y), ops::sub(scalar_like(y, 1), y))};
}
// One pass (relu_grad), the hot path of every ReLU network. Reads the output (y > 0
// exactly where x > 0), not the input, so a graph can fuse the op that made x into one
// kernel with the ReLU (src/graph/passes/matmul_bias_activation_fusion.cc).
V relu_vjp(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  const Tensor& g = c.cotangents[0];
  if (!is_floating(g.dtype()))  // integer ReLUs: no relu_grad kernel
    return {ops::where(ops::greater(y, scalar_like(y, 0)), g, scalar_like(g, 0))};
  return {ops::relu_grad(g, y)};
}
// Linear in g with the same mask; zero almost everywhere in y.
V relu_grad_vjp(const VjpContext& c) {
  return {c.needs(0) ? ops::relu_grad(c.cotangents[0], c.inputs[1]) : Tensor(), Tensor()};
}
V relu6_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& g = c.cotangents[0];
  Tensor inside = ops::logical_and(ops::greater(x, scalar_like(x, 0)), ops::less(x, scalar_like(x, 6)));
  return {ops::where(inside, g, scalar_like(g, 0))};
}
V leaky_relu_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& g = c.cotangents[0];
  const double alpha = c.attrs.get_float("alpha");
  return {ops::where(ops::greater(x, scalar_like(x, 0)), g, ops::mul(g, scalar_like(g, alpha)))};
}
// For x <= 0, y = alpha (e^x - 1), so y' = alpha e^x = y + alpha.
V elu_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& y = c.outputs[0];
  const Tensor& g = c.cotangents[0];
  const double alpha = c.attrs.get_float("alpha");
  return {ops::where(ops::greater(x, scalar_like(x, 0)), g, ops::mul(g, ops::add(y, scalar_like(y, alpha))))};
}
V gelu_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& g = c.cotangents[0];
  auto k = [&](double v) { return scalar_like(x, v); };
  Tensor x2 = ops::square(x);
  Tensor d;
  if (c.attrs.get_bool("approximate", false)) {
    // y = x/2 (1 + tanh(u)), u = s (x + 0.044715 x^3), s = sqrt(2/pi):
    // y' = (1 + t)/2 + x/2 (1 - t^2) s (1 + 3 * 0.044715 x^2).
    const double s = 0.7978845608028654, a = 0.044715;
    Tensor t = ops::tanh(ops::mul(ops::mul(x, ops::add(ops::mul(x2, k(a)), k(1))), k(s)));
    Tensor du = ops::add(ops::mul(x2, k(3 * a * s)), k(s));
    Tensor left = ops::add(ops::mul(t, k(0.5)), k(0.5));
    Tensor right = ops::mul(ops::mul(ops::mul(x, k(0.5)), ops::sub(k(1), ops::square(t))), du);
    d = ops::add(left, right);
  } else {
    // y = x Phi(x): y' = Phi(x) + x phi(x), Phi(x) = (1 + erf(x/sqrt2))/2, phi = e^(-x^2/2)/sqrt(2 pi).
    Tensor cdf = ops::add(ops::mul(ops::erf(ops::mul(x, k(M_SQRT1_2))), k(0.5)), k(0.5));
    Tensor xpdf = ops::mul(ops::mul(x, ops::exp(ops::mul(x2, k(-0.5)))), k(0.5 * M_2_SQRTPI * M_SQRT1_2));
    d = ops::add(cdf, xpdf);
  }
  return {ops::mul(g, d)};
}
// silu = x s(x): y' = s + x s (1 - s) = s (1 + x (1 - s)).
V silu_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor s = ops::sigmoid(x);
  Tensor d = ops::mul(s, ops::add(ops::mul(x, ops::sub(scalar_like(x, 1), s)), scalar_like(x, 1)));
  return {ops::mul(c.cotangents[0], d)};
}
V softplus_vjp(const VjpContext& c) { return {ops::mul(c.cotangents[0], ops::sigmoid(c.inputs[0]))}; }
// erf' = 2/sqrt(pi) e^(-x^2).
V erf_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor e = ops::exp(ops::neg(ops::square(x)));
  return {ops::mul(ops::mul(c.cotangents[0], e), scalar_like(x, M_2_SQRTPI))};
}
V clip_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& g = c.cotangents[0];
  Tensor inside = ops::logical_and(ops::greater_equal(x, scalar_like(x, c.attrs.get_float("min"))),
                                   ops::less_equal(x, scalar_like(x, c.attrs.get_float("max"))));
  return {ops::where(inside, g, scalar_like(g, 0))};
}

KILN_REGISTER_VJP("add", add_vjp);
KILN_REGISTER_VJP("sub", sub_vjp);
KILN_REGISTER_VJP("mul", mul_vjp);
KILN_REGISTER_VJP("div", div_vjp);
KILN_REGISTER_VJP("pow", pow_vjp);
KILN_REGISTER_VJP("maximum", maximum_vjp);
KILN_REGISTER_VJP("minimum", minimum_vjp);
KILN_REGISTER_VJP("where", where_vjp);
KILN_REGISTER_VJP("cast", cast_vjp);
KILN_REGISTER_VJP("neg", neg_vjp);
KILN_REGISTER_VJP("abs", abs_vjp);
KILN_REGISTER_VJP("exp", exp_vjp);
KILN_REGISTER_VJP("log", log_vjp);
KILN_REGISTER_VJP("log1p", log1p_vjp);
KILN_REGISTER_VJP("square", square_vjp);
KILN_REGISTER_VJP("sqrt", sqrt_vjp);
KILN_REGISTER_VJP("rsqrt", rsqrt_vjp);
KILN_REGISTER_VJP("reciprocal", reciprocal_vjp);
KILN_REGISTER_VJP("sin", sin_vjp);
KILN_REGISTER_VJP("cos", cos_vjp);
KILN_REGISTER_VJP("tanh", tanh_vjp);
KILN_REGISTER_VJP("sigmoid", sigmoid_vjp);
KILN_REGISTER_VJP("relu", relu_vjp);
KILN_REGISTER_VJP("relu_grad", relu_grad_vjp);
KILN_REGISTER_VJP("relu6", relu6_vjp);
KILN_REGISTER_VJP("leaky_relu", leaky_relu_vjp);
KILN_REGISTER_VJP("elu", elu_vjp);
KILN_REGISTER_VJP("gelu", gelu_vjp);
KILN_REGISTER_VJP("silu", silu_vjp);
KILN_REGISTER_VJP("softplus", softplus_vjp);
KILN_REGISTER_VJP("erf", erf_vjp);
KILN_REGISTER_VJP("clip", clip_vjp);

}  // namespace
}  // namespace kiln::ops::grad
