// Vjps of the elementwise ops (binary ones sum broadcast dimensions back down).
#include "grad_util.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;

V add_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  return {c.needs(0) ? sum_to(g, c.inputs[0].shape()) : Tensor(), c.needs(1) ? sum_to(g, c.inputs[1].shape()) : Tensor()};
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

V neg_vjp(const VjpContext& c) { return {ops::neg(c.cotangents[0])}; }
V exp_vjp(const VjpContext& c) { return {ops::mul(c.cotangents[0], c.outputs[0])}; }
V log_vjp(const VjpContext& c) { return {ops::div(c.cotangents[0], c.inputs[0])}; }
V tanh_vjp(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {ops::mul(c.cotangents[0], ops::sub(scalar_like(y, 1), ops::square(y)))};
}
V relu_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {ops::where(ops::greater(x, scalar_like(x, 0)), c.cotangents[0], ops::zeros_like(x))};
}
V square_vjp(const VjpContext& c) {
  return {ops::mul(c.cotangents[0], ops::mul(c.inputs[0], scalar_like(c.inputs[0], 2)))};
}

KILN_REGISTER_VJP("add", add_vjp);
KILN_REGISTER_VJP("sub", sub_vjp);
KILN_REGISTER_VJP("mul", mul_vjp);
KILN_REGISTER_VJP("div", div_vjp);
KILN_REGISTER_VJP("neg", neg_vjp);
KILN_REGISTER_VJP("exp", exp_vjp);
KILN_REGISTER_VJP("log", log_vjp);
KILN_REGISTER_VJP("tanh", tanh_vjp);
KILN_REGISTER_VJP("relu", relu_vjp);
KILN_REGISTER_VJP("square", square_vjp);

}  // namespace
}  // namespace kiln::ops::grad
