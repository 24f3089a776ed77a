// Random op definitions and user-facing functions. The ops take no inputs
// (dispatch_input = -1: the kernel is chosen by the output dtype); the shape, dtype,
// distribution parameters and the Philox stream travel as attributes:
//
//   random_uniform   {shape, dtype, lo, hi, key, offset}
//   random_normal    {shape, dtype, mean, stddev, key, offset}
//   truncated_normal {shape, dtype, mean, stddev, key, offset}
//   bernoulli        {shape, p, key, offset}                      (output bool)
//
// key is the Philox key (the seed, as int64 bits); offset the first 128-bit counter.
// Kernels: src/backends/cpu/random_kernels.cc, which documents the counter layout.
#include "kiln/ops/random.h"

#include <cmath>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/core/random.h"
#include "op_util.h"

namespace kiln::ops {
namespace {

std::string num(double v) { return kiln::detail::str_cat(v); }

void require_finite(const char* op, std::initializer_list<std::pair<const char*, double>> params) {
  for (auto& [name, v] : params)
    if (!std::isfinite(v)) throw InvalidArgumentError(std::string(op) + ": " + name + " must be finite, got " + num(v));
}

Shape shape_attr(const Attrs& a) { return Shape(a.get_ints("shape")); }

// The smallest value of floating dtype t that is >= lo, as a double.
double lowest_at_least(double lo, DType t) {
  if (t == DType::kF64) return lo;
  if (t == DType::kF32) {
    float l = static_cast<float>(lo);
    if (l < lo) l = std::nextafter(l, INFINITY);
    return l;
  }
  uint16_t bits;
  convert_buffer(&lo, DType::kF64, &bits, t, 1);
  double back;
  convert_buffer(&bits, t, &back, DType::kF64, 1);
  if (back < lo) {
    bits = bits == 0x8000 ? 0x0001 : (bits & 0x8000) ? bits - 1 : bits + 1;  // one step toward +inf
    convert_buffer(&bits, t, &back, DType::kF64, 1);
  }
  return back;
}

std::pair<double, double> int_limits(DType t) {
  switch (t) {
    case DType::kU8: return {0, 255};
    case DType::kI8: return {-128, 127};
    case DType::kI32: return {-2147483648.0, 2147483647.0};
    default: return {-9223372036854775808.0, 9223372036854775807.0};
  }
}

std::vector<TensorMeta> infer_uniform(std::span<const TensorMeta>, const Attrs& a) {
  const DType t = a.get_dtype("dtype");
  const double lo = a.get_float("lo"), hi = a.get_float("hi");
  KILN_CHECK_ARG(t != DType::kBool, "random_uniform: dtype bool is not supported (use bernoulli)");
  require_finite("random_uniform", {{"lo", lo}, {"hi", hi}});
  KILN_CHECK_ARG(lo < hi, "random_uniform: lo (", lo, ") must be < hi (", hi, ")");
  if (is_integral(t)) {
    auto [mn, mx] = int_limits(t);
    KILN_CHECK_ARG(std::floor(lo) == lo && std::floor(hi) == hi, "random_uniform: integer dtype ", dtype_name(t),
                   " needs integer bounds, got [", lo, ", ", hi, ")");
    KILN_CHECK_ARG(lo >= mn && hi - 1 <= mx, "random_uniform: [", lo, ", ", hi, ") is outside the range of ",
                   dtype_name(t));
  } else {
    KILN_CHECK_ARG(lowest_at_least(lo, t) < hi, "random_uniform: no ", dtype_name(t), " value lies in [", lo, ", ",
                   hi, ")");
  }
  return {{shape_attr(a), t}};
}

template <const char* Name>
std::vector<TensorMeta> infer_normal(std::span<const TensorMeta>, const Attrs& a) {
  const DType t = a.get_dtype("dtype");
  const double mean = a.get_float("mean"), stddev = a.get_float("stddev");
  KILN_CHECK_ARG(is_floating(t), Name, ": dtype must be floating, got ", dtype_name(t));
  require_finite(Name, {{"mean", mean}, {"stddev", stddev}});
  KILN_CHECK_ARG(stddev >= 0, Name, ": stddev must be >= 0, got ", stddev);
  return {{shape_attr(a), t}};
}

std::vector<TensorMeta> infer_bernoulli(std::span<const TensorMeta>, const Attrs& a) {
  const double p = a.get_float("p");
  KILN_CHECK_ARG(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got ", p);
  return {{shape_attr(a), DType::kBool}};
}

std::vector<AttrSpec> random_attrs(std::initializer_list<AttrSpec> params) {
  std::vector<AttrSpec> v = {{"shape", AttrType::kInts, "output shape"}};
  v.insert(v.end(), params);
  v.push_back({"key", AttrType::kInt, "Philox key (the seed's bits)"});
  v.push_back({"offset", AttrType::kInt, "first Philox counter"});
  v.push_back({"seeded", AttrType::kBool, "the caller gave the seed (a traced graph then does not redraw it)"});
  return v;
}

// 32-bit words each element consumes (the kernels' layout; see random_kernels.cc).
int64_t words_per_element(const std::string& op, DType t) {
  if (op == "truncated_normal") return 4;
  if (t == DType::kF64 || is_integral(t)) return 2;
  return 1;
}

// A traced graph's run: the default generator's seed with fresh counters (OpDef::redraw).
template <const char* Op>
void redraw_stream(Attrs& a) {
  if (a.get_bool("seeded", false)) return;  // an explicit seed: the same numbers every run
  const DType t = a.get_dtype("dtype", DType::kBool);
  const int64_t n = Shape(a.get_ints("shape")).numel() * words_per_element(Op, t);
  Generator& g = default_generator();
  a.set("key", static_cast<int64_t>(g.seed()));
  a.set("offset", static_cast<int64_t>(g.reserve(static_cast<uint64_t>(n))));
}

OpDef random_def(const char* name, const char* doc, InferFn infer, std::vector<AttrSpec> attrs,
                 void (*redraw)(Attrs&)) {
  OpDef d = detail::make_def(name, doc, 0, infer, std::move(attrs), Differentiable::kNo, -1);
  d.redraw = redraw;
  return d;
}

constexpr char kUniform[] = "random_uniform", kNormal[] = "random_normal", kTruncated[] = "truncated_normal",
               kBernoulli[] = "bernoulli";
const AttrSpec kDTypeAttr{"dtype", AttrType::kDType, "output dtype"};

KILN_REGISTER_OP(random_def(kUniform, "uniform on [lo, hi)", infer_uniform,
                            random_attrs({kDTypeAttr,
                                          {"lo", AttrType::kFloat, "inclusive lower bound"},
                                          {"hi", AttrType::kFloat, "exclusive upper bound"}}),
                            redraw_stream<kUniform>));
KILN_REGISTER_OP(random_def(kNormal, "normal (Box-Muller)", infer_normal<kNormal>,
                            random_attrs({kDTypeAttr,
                                          {"mean", AttrType::kFloat, "mean"},
                                          {"stddev", AttrType::kFloat, "standard deviation (>= 0)"}}),
                            redraw_stream<kNormal>));
KILN_REGISTER_OP(random_def(kTruncated, "normal redrawn beyond 2 stddev", infer_normal<kTruncated>,
                            random_attrs({kDTypeAttr,
                                          {"mean", AttrType::kFloat, "mean"},
                                          {"stddev", AttrType::kFloat, "standard deviation (>= 0)"}}),
                            redraw_stream<kTruncated>));
KILN_REGISTER_OP(random_def(kBernoulli, "bool, true with probability p", infer_bernoulli,
                            random_attrs({{"p", AttrType::kFloat, "probability of true, in [0, 1]"}}),
                            redraw_stream<kBernoulli>));


// Runs op d with the stream attributes: the seed's own stream (counters from 0), or
// the default generator's seed with counters reserved from it.
Tensor draw(const OpDef& d, const Shape& shape, Attrs attrs, std::optional<DType> dtype,
            std::optional<uint64_t> seed) {
  attrs.set("shape", shape.vec());
  if (dtype) attrs.set("dtype", *dtype);
  // Validate before reserving counters, so that a bad call leaves the stream alone.
  attrs.set("key", int64_t{0});
  attrs.set("offset", int64_t{0});
  d.infer({}, attrs);
  uint64_t key = 0, offset = 0;
  if (seed) {
    key = *seed;
    attrs.set("seeded", true);
  } else {
    Generator& g = default_generator();
    key = g.seed();
    offset = g.reserve(static_cast<uint64_t>(shape.numel() * words_per_element(d.name, dtype.value_or(DType::kBool))));
  }
  attrs.set("key", static_cast<int64_t>(key));
  attrs.set("offset", static_cast<int64_t>(offset));
  return call_op1(d, {}, attrs, Device::cpu());
}

}  // namespace

Tensor random_uniform(const Shape& shape, double lo, double hi, DType dtype, std::optional<uint64_t> seed) {
  return draw(KILN_OP("random_uniform"), shape, {{"lo", lo}, {"hi", hi}}, dtype, seed);
}
Tensor random_normal(const Shape& shape, double mean, double stddev, DType dtype, std::optional<uint64_t> seed) {
  return draw(KILN_OP("random_normal"), shape, {{"mean", mean}, {"stddev", stddev}}, dtype, seed);
}
Tensor truncated_normal(const Shape& shape, double mean, double stddev, DType dtype, std::optional<uint64_t> seed) {
  return draw(KILN_OP("truncated_normal"), shape, {{"mean", mean}, {"stddev", stddev}}, dtype, seed);
}
Tensor bernoulli(const Shape& shape, double p, std::optional<uint64_t> seed) {
  return draw(KILN_OP("bernoulli"), shape, {{"p", p}}, std::nullopt, seed);
}

}  // namespace kiln::ops
