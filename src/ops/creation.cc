// Creation op definitions and user-facing functions. The ops take no inputs
// (dispatch_input = -1: the kernel is chosen by the output dtype); everything they need
// travels as attributes. Kernels: src/backends/cpu/creation_kernels.cc.
//
//   fill   {shape: ints, dtype, value: float}          constant tensor
//   eye    {n: int, m: int, dtype}                     n x m identity
//   arange {start, stop, step: float, dtype}           numpy.arange
#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/ops/creation.h"

#include <cmath>
#include <limits>

#include "op_util.h"

namespace kiln::ops {
namespace {

// Inclusive range of an integer dtype, as doubles (exact: the bounds are powers of two
// or small).
std::pair<double, double> int_range(DType t) {
  switch (t) {
    case DType::kU8: return {0, 255};
    case DType::kI8: return {-128, 127};
    case DType::kI32: return {-2147483648.0, 2147483647.0};
    default: return {-9223372036854775808.0, 9223372036854775807.0};  // upper bound rounds to 2^63
  }
}

// Throws unless `value` converts to `t` without changing (integers) or is any number
// (floating, bool).
void check_value(const char* op, double value, DType t) {
  if (!is_integral(t)) return;
  auto [lo, hi] = int_range(t);
  const bool fits = std::isfinite(value) && std::floor(value) == value && value >= lo &&
                    (t == DType::kI64 ? value < hi : value <= hi);
  if (!fits)
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": value ", value, " is not representable in dtype ",
                                               dtype_name(t)));
}

std::vector<TensorMeta> infer_fill(std::span<const TensorMeta>, const Attrs& a) {
  DType t = a.get_dtype("dtype");
  check_value("full", a.get_float("value"), t);
  return {{Shape(a.get_ints("shape")), t}};
}

std::vector<TensorMeta> infer_eye(std::span<const TensorMeta>, const Attrs& a) {
  const int64_t n = a.get_int("n"), m = a.get_int("m", -1);
  KILN_CHECK_ARG(n >= 0, "eye: n must be >= 0, got ", n);
  KILN_CHECK_ARG(m >= -1, "eye: m must be >= 0 (or -1 for m = n), got ", m);
  return {{Shape{n, m < 0 ? n : m}, a.get_dtype("dtype")}};
}

// Length of numpy.arange(start, stop, step); throws on step == 0 and bad bounds.
int64_t arange_length(double start, double stop, double step) {
  KILN_CHECK_ARG(step != 0, "arange: step must be nonzero");
  KILN_CHECK_ARG(std::isfinite(start) && std::isfinite(stop) && std::isfinite(step),
                 "arange: start, stop and step must be finite, got ", start, ", ", stop, ", ", step);
  const double n = std::ceil((stop - start) / step);
  if (!(n > 0)) return 0;
  KILN_CHECK_ARG(n < 9.2e18, "arange: length ", n, " is too large");
  return static_cast<int64_t>(n);
}

std::vector<TensorMeta> infer_arange(std::span<const TensorMeta>, const Attrs& a) {
  const double start = a.get_float("start"), stop = a.get_float("stop"), step = a.get_float("step", 1.0);
  const DType t = a.get_dtype("dtype");
  const int64_t n = arange_length(start, stop, step);
  if (n > 0 && is_integral(t)) {  // the first and last values must fit the dtype
    check_value("arange", std::trunc(start), t);
    check_value("arange", std::trunc(start + static_cast<double>(n - 1) * step), t);
  }
  return {{Shape{n}, t}};
}

OpDef creation_def(const char* name, const char* doc, InferFn infer, std::vector<AttrSpec> attrs) {
  return detail::make_def(name, doc, 0, infer, std::move(attrs), Differentiable::kNo, -1);
}

KILN_REGISTER_OP(creation_def("fill", "a tensor of `shape` filled with `value`", infer_fill,
                              {{"shape", AttrType::kInts, "output shape"},
                               {"dtype", AttrType::kDType, "output dtype"},
                               {"value", AttrType::kFloat, "fill value (integer dtypes: an exact integer)"}}));
KILN_REGISTER_OP(creation_def("eye", "n x m matrix with ones on the diagonal", infer_eye,
                              {{"n", AttrType::kInt, "rows"},
                               {"m", AttrType::kInt, "columns (-1: n)"},
                               {"dtype", AttrType::kDType, "output dtype"}}));
KILN_REGISTER_OP(creation_def("arange", "start + i * step for i in [0, ceil((stop - start) / step))", infer_arange,
                              {{"start", AttrType::kFloat, "first value"},
                               {"stop", AttrType::kFloat, "exclusive end"},
                               {"step", AttrType::kFloat, "increment (nonzero)"},
                               {"dtype", AttrType::kDType, "output dtype"}}));

Tensor fill(const Shape& shape, double value, DType dtype, Device device) {
  return call_op1(KILN_OP("fill"), {}, {{"shape", shape.vec()}, {"dtype", dtype}, {"value", value}}, device);
}

}  // namespace

Tensor zeros(const Shape& shape, DType dtype) { return fill(shape, 0.0, dtype, Device::cpu()); }
Tensor ones(const Shape& shape, DType dtype) { return fill(shape, 1.0, dtype, Device::cpu()); }
Tensor full(const Shape& shape, double value, DType dtype) { return fill(shape, value, dtype, Device::cpu()); }

Tensor full_like(const Tensor& x, double value, std::optional<DType> dtype) {
  KILN_CHECK_ARG(x.defined(), "full_like: x is undefined");
  return fill(x.shape(), value, dtype.value_or(x.dtype()), x.device());
}
Tensor zeros_like(const Tensor& x, std::optional<DType> dtype) { return full_like(x, 0.0, dtype); }
Tensor ones_like(const Tensor& x, std::optional<DType> dtype) { return full_like(x, 1.0, dtype); }

Tensor eye(int64_t n, int64_t m, DType dtype) {
  return call_op1(KILN_OP("eye"), {}, {{"n", n}, {"m", m}, {"dtype", dtype}}, Device::cpu());
}

Tensor arange(double start, double stop, double step, DType dtype) {
  return call_op1(KILN_OP("arange"), {}, {{"start", start}, {"stop", stop}, {"step", step}, {"dtype", dtype}},
                  Device::cpu());
}
Tensor arange(double stop, DType dtype) { return arange(0.0, stop, 1.0, dtype); }

}  // namespace kiln::ops
