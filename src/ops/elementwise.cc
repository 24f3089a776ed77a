#include "kiln/core/op_def.h"
#include "kiln/ops/elementwise.h"

#include "op_util.h"

namespace kiln::ops {
namespace {
using detail::call1;

std::vector<TensorMeta> infer_where(std::span<const TensorMeta> in, const Attrs&) {
  if (in[0].dtype != DType::kBool)
    throw InvalidArgumentError("where: condition must be bool, got " + detail::dtype_str(in[0].dtype));
  if (in[1].dtype != in[2].dtype)
    throw InvalidArgumentError("where: x and y must have one dtype, got " + detail::dtype_str(in[1].dtype) + " and " +
                               detail::dtype_str(in[2].dtype));
  return {{broadcast_shapes(broadcast_shapes(in[0].shape, in[1].shape), in[2].shape), in[1].dtype}};
}

std::vector<TensorMeta> infer_cast(std::span<const TensorMeta> in, const Attrs& a) {
  return {{in[0].shape, a.get_dtype("dtype")}};
}

std::vector<TensorMeta> infer_bool_unary(std::span<const TensorMeta> in, const Attrs&) {
  if (in[0].dtype != DType::kBool)
    throw InvalidArgumentError("logical_not: expected bool, got " + detail::dtype_str(in[0].dtype));
  return {in[0]};
}

std::vector<TensorMeta> infer_clip(std::span<const TensorMeta> in, const Attrs& a) {
  double lo = a.get_float("min"), hi = a.get_float("max");
  if (!(lo <= hi))
    throw InvalidArgumentError("clip: min (" + std::to_string(lo) + ") must be <= max (" + std::to_string(hi) + ")");
  return {in[0]};
}

// relu_grad(g, y): g and y of one floating dtype and shape.
std::vector<TensorMeta> infer_relu_grad(std::span<const TensorMeta> in, const Attrs&) {
  detail::require_floating("relu_grad", in[0]);
  if (in[1].shape != in[0].shape || in[1].dtype != in[0].dtype)
    throw InvalidArgumentError("relu_grad: the gradient is " + detail::dtype_str(in[0].dtype) + in[0].shape.str() +
                               " but the ReLU output is " + detail::dtype_str(in[1].dtype) + in[1].shape.str());
  return {in[0]};
}

OpDef unary(const char* name, const char* doc, Differentiable d = Differentiable::kYes,
            std::vector<AttrSpec> attrs = {}) {
  return detail::make_def(name, doc, 1, detail::infer_same, std::move(attrs), d);
}
OpDef binary(const char* name, const char* doc, InferFn infer = detail::infer_broadcast,
             Differentiable d = Differentiable::kYes) {
  return detail::make_def(name, doc, 2, infer, {}, d);
}

// Every input may be overwritten by the output (OpDef::overwritable): the kernels read
// element i of each operand before writing element i (where shapes match; not
// floor/ceil/round, whose integer kernels are a memcpy; not the comparisons).
OpDef elementwise_in_place(OpDef d) {
  for (int j = 0; j < d.num_inputs; ++j) d.overwritable.emplace_back(0, j);
  return d;
}

KILN_REGISTER_OP(elementwise_in_place(binary("add", "a + b")));
KILN_REGISTER_OP(elementwise_in_place(binary("sub", "a - b")));
KILN_REGISTER_OP(elementwise_in_place(binary("mul", "a * b")));
KILN_REGISTER_OP(elementwise_in_place(binary("div", "a / b")));
KILN_REGISTER_OP(elementwise_in_place(binary("pow", "a ** b")));
KILN_REGISTER_OP(elementwise_in_place(binary("maximum", "elementwise max (NaN propagates)")));
KILN_REGISTER_OP(elementwise_in_place(binary("minimum", "elementwise min (NaN propagates)")));
KILN_REGISTER_OP(binary("equal", "a == b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP(binary("not_equal", "a != b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP(binary("less", "a < b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP(binary("less_equal", "a <= b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP(binary("greater", "a > b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP(binary("greater_equal", "a >= b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP(binary("logical_and", "a && b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP(binary("logical_or", "a || b", detail::infer_broadcast_bool, Differentiable::kNo));
KILN_REGISTER_OP([] {
  OpDef o = unary("logical_not", "!x", Differentiable::kNo);
  o.infer = infer_bool_unary;
  return o;
}());
KILN_REGISTER_OP(elementwise_in_place(unary("neg", "-x")));
KILN_REGISTER_OP([] {
  OpDef o = unary("stop_gradient", "x, cut from every gradient (tf.stop_gradient)", Differentiable::kNo);
  o.infer = detail::infer_same;
  return o;
}());
KILN_REGISTER_OP(elementwise_in_place(unary("abs", "|x|")));
KILN_REGISTER_OP(elementwise_in_place(unary("sign", "-1, 0 or 1", Differentiable::kNo)));
KILN_REGISTER_OP(elementwise_in_place(unary("square", "x * x")));
KILN_REGISTER_OP(elementwise_in_place(unary("exp", "e^x")));
KILN_REGISTER_OP(elementwise_in_place(unary("log", "natural log")));
KILN_REGISTER_OP(elementwise_in_place(unary("log1p", "log(1 + x)")));
KILN_REGISTER_OP(elementwise_in_place(unary("sqrt", "square root")));
KILN_REGISTER_OP(elementwise_in_place(unary("rsqrt", "1 / sqrt(x)")));
KILN_REGISTER_OP(elementwise_in_place(unary("reciprocal", "1 / x")));
KILN_REGISTER_OP(elementwise_in_place(unary("sin", "sine")));
KILN_REGISTER_OP(elementwise_in_place(unary("cos", "cosine")));
KILN_REGISTER_OP(elementwise_in_place(unary("tanh", "hyperbolic tangent")));
KILN_REGISTER_OP(elementwise_in_place(unary("sigmoid", "1 / (1 + e^-x)")));
KILN_REGISTER_OP(elementwise_in_place(unary("relu", "max(x, 0)")));
KILN_REGISTER_OP(elementwise_in_place(detail::make_def("relu_grad",
                                                       "the ReLU's backward: g where y > 0, else 0 (one pass)", 2,
                                                       infer_relu_grad, {}, Differentiable::kYes)));
KILN_REGISTER_OP(elementwise_in_place(unary("relu6", "min(max(x, 0), 6)")));
KILN_REGISTER_OP(elementwise_in_place(unary("leaky_relu", "x > 0 ? x : alpha * x", Differentiable::kYes,
                                            {{"alpha", AttrType::kFloat, "slope for x < 0"}})));
KILN_REGISTER_OP(elementwise_in_place(unary("elu", "x > 0 ? x : alpha * (e^x - 1)", Differentiable::kYes,
                                            {{"alpha", AttrType::kFloat, "scale for x < 0"}})));
KILN_REGISTER_OP(elementwise_in_place(unary("gelu", "x * Phi(x)", Differentiable::kYes,
                                            {{"approximate", AttrType::kBool, "tanh approximation"}})));
KILN_REGISTER_OP(elementwise_in_place(unary("silu", "x * sigmoid(x)")));
KILN_REGISTER_OP(elementwise_in_place(unary("softplus", "log(1 + e^x)")));
KILN_REGISTER_OP(elementwise_in_place(unary("erf", "error function")));
KILN_REGISTER_OP(unary("floor", "round down", Differentiable::kNo));
KILN_REGISTER_OP(unary("ceil", "round up", Differentiable::kNo));
KILN_REGISTER_OP(unary("round", "round half to even", Differentiable::kNo));
KILN_REGISTER_OP([] {
  OpDef o = unary("clip", "min(max(x, min), max)", Differentiable::kYes,
                  {{"min", AttrType::kFloat, "lower bound"}, {"max", AttrType::kFloat, "upper bound"}});
  o.infer = infer_clip;
  return elementwise_in_place(o);
}());
KILN_REGISTER_OP([] {
  OpDef o;
  o.name = "where";
  o.doc = "cond ? x : y with broadcasting";
  o.num_inputs = 3;
  o.dispatch_input = 1;
  o.infer = infer_where;
  o.differentiable = Differentiable::kYes;
  return o;
}());
KILN_REGISTER_OP([] {
  OpDef o = unary("cast", "dtype conversion", Differentiable::kYes, {{"dtype", AttrType::kDType, "target dtype"}});
  o.infer = infer_cast;
  return o;
}());

DType float_of(DType t) { return is_floating(t) ? t : DType::kF32; }

Tensor binary_op(const OpDef& d, const Tensor& a, const Tensor& b, bool float_only = false) {
  DType t = promote_types(a.dtype(), b.dtype());
  if (float_only) t = float_of(t);
  return call1(d, {a.dtype() == t ? a : cast(a, t), b.dtype() == t ? b : cast(b, t)});
}

Tensor float_unary(const OpDef& d, const Tensor& x, const Attrs& attrs = {}) {
  DType t = float_of(x.dtype());
  return call1(d, {x.dtype() == t ? x : cast(x, t)}, attrs);
}

Tensor as_bool(const Tensor& x) { return x.dtype() == DType::kBool ? x : cast(x, DType::kBool); }

}  // namespace

Tensor scalar(double value, DType dt) {
  Tensor t = Tensor::scalar<double>(value);
  return dt == DType::kF64 ? t : t.to(dt);
}

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("add"), a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("sub"), a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("mul"), a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("div"), a, b, true); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("pow"), a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("maximum"), a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("minimum"), a, b); }
Tensor equal(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("equal"), a, b); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("not_equal"), a, b); }
Tensor less(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("less"), a, b); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("less_equal"), a, b); }
Tensor greater(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("greater"), a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) { return binary_op(KILN_OP("greater_equal"), a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return call1(KILN_OP("logical_and"), {as_bool(a), as_bool(b)}); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return call1(KILN_OP("logical_or"), {as_bool(a), as_bool(b)}); }
Tensor logical_not(const Tensor& x) { return call1(KILN_OP("logical_not"), {as_bool(x)}); }

Tensor neg(const Tensor& x) { return call1(KILN_OP("neg"), {x}); }
Tensor stop_gradient(const Tensor& x) { return call1(KILN_OP("stop_gradient"), {x}); }
Tensor abs(const Tensor& x) { return call1(KILN_OP("abs"), {x}); }
Tensor sign(const Tensor& x) { return call1(KILN_OP("sign"), {x}); }
Tensor square(const Tensor& x) { return call1(KILN_OP("square"), {x}); }
Tensor relu(const Tensor& x) { return call1(KILN_OP("relu"), {x}); }
Tensor relu_grad(const Tensor& g, const Tensor& y) { return call1(KILN_OP("relu_grad"), {g, y}); }
Tensor exp(const Tensor& x) { return float_unary(KILN_OP("exp"), x); }
Tensor log(const Tensor& x) { return float_unary(KILN_OP("log"), x); }
Tensor log1p(const Tensor& x) { return float_unary(KILN_OP("log1p"), x); }
Tensor sqrt(const Tensor& x) { return float_unary(KILN_OP("sqrt"), x); }
Tensor rsqrt(const Tensor& x) { return float_unary(KILN_OP("rsqrt"), x); }
Tensor reciprocal(const Tensor& x) { return float_unary(KILN_OP("reciprocal"), x); }
Tensor sin(const Tensor& x) { return float_unary(KILN_OP("sin"), x); }
Tensor cos(const Tensor& x) { return float_unary(KILN_OP("cos"), x); }
Tensor tanh(const Tensor& x) { return float_unary(KILN_OP("tanh"), x); }
Tensor sigmoid(const Tensor& x) { return float_unary(KILN_OP("sigmoid"), x); }
Tensor relu6(const Tensor& x) { return float_unary(KILN_OP("relu6"), x); }
Tensor leaky_relu(const Tensor& x, double alpha) { return float_unary(KILN_OP("leaky_relu"), x, {{"alpha", alpha}}); }
Tensor elu(const Tensor& x, double alpha) { return float_unary(KILN_OP("elu"), x, {{"alpha", alpha}}); }
Tensor gelu(const Tensor& x, bool approximate) { return float_unary(KILN_OP("gelu"), x, {{"approximate", approximate}}); }
Tensor silu(const Tensor& x) { return float_unary(KILN_OP("silu"), x); }
Tensor softplus(const Tensor& x) { return float_unary(KILN_OP("softplus"), x); }
Tensor erf(const Tensor& x) { return float_unary(KILN_OP("erf"), x); }
Tensor floor(const Tensor& x) { return call1(KILN_OP("floor"), {x}); }
Tensor ceil(const Tensor& x) { return call1(KILN_OP("ceil"), {x}); }
Tensor round(const Tensor& x) { return call1(KILN_OP("round"), {x}); }
Tensor clip(const Tensor& x, double lo, double hi) { return call1(KILN_OP("clip"), {x}, {{"min", lo}, {"max", hi}}); }
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y) {
  DType t = promote_types(x.dtype(), y.dtype());
  return call1(KILN_OP("where"), {as_bool(cond), x.dtype() == t ? x : cast(x, t), y.dtype() == t ? y : cast(y, t)});
}
Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return call1(KILN_OP("cast"), {x}, {{"dtype", dtype}});
}

}  // namespace kiln::ops

namespace kiln {
using ops::scalar;
Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, double b) { return ops::add(a, scalar(b, a.dtype())); }
Tensor operator-(const Tensor& a, double b) { return ops::sub(a, scalar(b, a.dtype())); }
Tensor operator*(const Tensor& a, double b) { return ops::mul(a, scalar(b, a.dtype())); }
Tensor operator/(const Tensor& a, double b) {
  return ops::div(a, scalar(b, is_floating(a.dtype()) ? a.dtype() : DType::kF32));
}
Tensor operator+(double a, const Tensor& b) { return ops::add(scalar(a, b.dtype()), b); }
Tensor operator-(double a, const Tensor& b) { return ops::sub(scalar(a, b.dtype()), b); }
Tensor operator*(double a, const Tensor& b) { return ops::mul(scalar(a, b.dtype()), b); }
Tensor operator/(double a, const Tensor& b) {
  return ops::div(scalar(a, is_floating(b.dtype()) ? b.dtype() : DType::kF32), b);
}
}  // namespace kiln
