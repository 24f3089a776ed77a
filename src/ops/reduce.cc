// Reduction op definitions: attribute schemas, shape/dtype inference, and the
// user-facing functions (dtype promotion). Kernels: src/backends/cpu/reduce_kernels.cc.
//
// Attributes: "axes" (ints, empty = all; already normalised or not, negative allowed),
// "keepdims" (bool); argmax/argmin take "axis" (int) instead of "axes"; var/std take
// "ddof" (int >= 0).
#include "kiln/ops/reduce.h"

#include "kiln/core/op_def.h"
#include "kiln/ops/elementwise.h"
#include "op_util.h"

namespace kiln::ops {
namespace {
using detail::call1;

enum class OutRule { kSame, kSumLike, kFloat, kI64, kBool };

// Output shape of reducing `s` over the (sorted, unique) axes.
Shape reduced_shape(const Shape& s, const std::vector<int>& axes, bool keepdims) {
  Shape out;
  size_t k = 0;
  for (int i = 0; i < s.rank(); ++i) {
    bool reduced = k < axes.size() && axes[k] == i;
    if (reduced) ++k;
    if (!reduced) out.push_back(s[i]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

int64_t reduced_count(const Shape& s, const std::vector<int>& axes) {
  int64_t n = 1;
  for (int a : axes) n *= s[a];
  return n;
}

DType out_dtype(OutRule rule, DType in) {
  switch (rule) {
    case OutRule::kSame: return in;
    case OutRule::kSumLike: return is_floating(in) ? in : DType::kI64;
    case OutRule::kFloat: return is_floating(in) ? in : DType::kF32;
    case OutRule::kI64: return DType::kI64;
    case OutRule::kBool: return DType::kBool;
  }
  return in;
}

template <const char* Name, OutRule Rule, bool NeedsElements, bool FloatOnly>
std::vector<TensorMeta> infer_reduce(std::span<const TensorMeta> in, const Attrs& a) {
  const TensorMeta& x = in[0];
  if constexpr (FloatOnly) detail::require_floating(Name, x);
  std::vector<int> axes = detail::normalize_axes(a.get_ints("axes", {}), x.shape.rank(), Name);
  if (NeedsElements && reduced_count(x.shape, axes) == 0)
    throw InvalidArgumentError(std::string(Name) + ": reduction over an empty axis of " + x.shape.str() +
                               " has no identity");
  if (a.has("ddof") && a.get_int("ddof") < 0)
    throw InvalidArgumentError(std::string(Name) + ": ddof must be >= 0, got " + std::to_string(a.get_int("ddof")));
  return {{reduced_shape(x.shape, axes, a.get_bool("keepdims", false)), out_dtype(Rule, x.dtype)}};
}

template <const char* Name>
std::vector<TensorMeta> infer_arg(std::span<const TensorMeta> in, const Attrs& a) {
  const TensorMeta& x = in[0];
  int axis = normalize_axis(a.get_int("axis"), x.shape.rank(), (std::string(Name) + " axis").c_str());
  if (x.shape[axis] == 0)
    throw InvalidArgumentError(std::string(Name) + ": attempt to reduce the empty axis " + std::to_string(axis) +
                               " of " + x.shape.str());
  return {{reduced_shape(x.shape, {axis}, a.get_bool("keepdims", false)), DType::kI64}};
}

std::vector<AttrSpec> axes_attrs() {
  return {{"axes", AttrType::kInts, "axes to reduce (empty: all); negative counts from the end"},
          {"keepdims", AttrType::kBool, "keep reduced axes as size-1 dimensions"}};
}

OpDef reduce_def(const char* name, const char* doc, InferFn infer, Differentiable d) {
  OpDef o;
  o.name = name;
  o.doc = doc;
  o.num_inputs = 1;
  o.attrs = axes_attrs();
  o.infer = infer;
  o.differentiable = d;
  return o;
}

constexpr char kSum[] = "sum", kMean[] = "mean", kProd[] = "prod", kMax[] = "max", kMin[] = "min",
               kArgmax[] = "argmax", kArgmin[] = "argmin", kVar[] = "var", kStd[] = "std",
               kLogsumexp[] = "logsumexp", kAll[] = "all", kAny[] = "any";
constexpr auto kYes = Differentiable::kYes, kNo = Differentiable::kNo;

KILN_REGISTER_OP(reduce_def(kSum, "sum over axes (bool/int -> i64)",
                            infer_reduce<kSum, OutRule::kSumLike, false, false>, kYes));
KILN_REGISTER_OP(reduce_def(kMean, "arithmetic mean over axes (bool/int -> f32)",
                            infer_reduce<kMean, OutRule::kFloat, false, false>, kYes));
KILN_REGISTER_OP(reduce_def(kProd, "product over axes (bool/int -> i64)",
                            infer_reduce<kProd, OutRule::kSumLike, false, false>, kYes));
KILN_REGISTER_OP(reduce_def(kMax, "maximum over axes (NaN propagates)", infer_reduce<kMax, OutRule::kSame, true, false>,
                            kYes));
KILN_REGISTER_OP(reduce_def(kMin, "minimum over axes (NaN propagates)", infer_reduce<kMin, OutRule::kSame, true, false>,
                            kYes));
KILN_REGISTER_OP(reduce_def(kAll, "logical and over axes", infer_reduce<kAll, OutRule::kBool, false, false>, kNo));
KILN_REGISTER_OP(reduce_def(kAny, "logical or over axes", infer_reduce<kAny, OutRule::kBool, false, false>, kNo));
KILN_REGISTER_OP(reduce_def(kLogsumexp, "log(sum(exp(x))) over axes, max-shifted",
                            infer_reduce<kLogsumexp, OutRule::kSame, false, true>, kYes));
KILN_REGISTER_OP([] {
  OpDef o = reduce_def(kVar, "variance over axes: sum((x - mean)^2) / (N - ddof)",
                       infer_reduce<kVar, OutRule::kSame, false, true>, kYes);
  o.attrs.push_back({"ddof", AttrType::kInt, "delta degrees of freedom (>= 0)"});
  return o;
}());
KILN_REGISTER_OP([] {
  OpDef o = reduce_def(kStd, "standard deviation over axes: sqrt(var)", infer_reduce<kStd, OutRule::kSame, false, true>,
                       kYes);
  o.attrs.push_back({"ddof", AttrType::kInt, "delta degrees of freedom (>= 0)"});
  return o;
}());
OpDef arg_def(const char* name, const char* doc, InferFn infer) {
  OpDef o = reduce_def(name, doc, infer, kNo);
  o.attrs = {{"axis", AttrType::kInt, "axis to reduce; negative counts from the end"},
             {"keepdims", AttrType::kBool, "keep the reduced axis as a size-1 dimension"}};
  return o;
}
KILN_REGISTER_OP(arg_def(kArgmax, "index of the first maximum along an axis (NaN is largest) -> i64",
                         infer_arg<kArgmax>));
KILN_REGISTER_OP(arg_def(kArgmin, "index of the first minimum along an axis (NaN is smallest) -> i64",
                         infer_arg<kArgmin>));

Attrs reduce_attrs(const std::vector<int64_t>& axes, bool keepdims) { return {{"axes", axes}, {"keepdims", keepdims}}; }

// var/std/logsumexp are defined on floating inputs: integers compute in f64 and give f32.
Tensor float_reduce(const OpDef& d, const Tensor& x, const Attrs& attrs) {
  if (!x.defined()) return call1(d, {x}, attrs);  // reports the undefined input
  if (is_floating(x.dtype())) return call1(d, {x}, attrs);
  return cast(call1(d, {cast(x, DType::kF64)}, attrs), DType::kF32);
}

Tensor flat(const Tensor& x) { return x.defined() ? x.reshape(Shape{x.numel()}) : x; }

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return call1(KILN_OP("sum"), {x}, reduce_attrs(axes, keepdims));
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return call1(KILN_OP("mean"), {x}, reduce_attrs(axes, keepdims));
}
Tensor prod(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return call1(KILN_OP("prod"), {x}, reduce_attrs(axes, keepdims));
}
Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return call1(KILN_OP("max"), {x}, reduce_attrs(axes, keepdims));
}
Tensor min(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return call1(KILN_OP("min"), {x}, reduce_attrs(axes, keepdims));
}
Tensor all(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return call1(KILN_OP("all"), {x}, reduce_attrs(axes, keepdims));
}
Tensor any(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return call1(KILN_OP("any"), {x}, reduce_attrs(axes, keepdims));
}
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims) {
  return call1(KILN_OP("argmax"), {x}, {{"axis", axis}, {"keepdims", keepdims}});
}
Tensor argmin(const Tensor& x, int64_t axis, bool keepdims) {
  return call1(KILN_OP("argmin"), {x}, {{"axis", axis}, {"keepdims", keepdims}});
}
Tensor argmax(const Tensor& x) { return argmax(flat(x), 0, false); }
Tensor argmin(const Tensor& x) { return argmin(flat(x), 0, false); }
Tensor var(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims, int64_t ddof) {
  Attrs a = reduce_attrs(axes, keepdims);
  a.set("ddof", ddof);
  return float_reduce(KILN_OP("var"), x, a);
}
Tensor std(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims, int64_t ddof) {
  Attrs a = reduce_attrs(axes, keepdims);
  a.set("ddof", ddof);
  return float_reduce(KILN_OP("std"), x, a);
}
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  return float_reduce(KILN_OP("logsumexp"), x, reduce_attrs(axes, keepdims));
}

}  // namespace kiln::ops
