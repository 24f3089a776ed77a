// CPU kernels for elementwise ops: broadcasting binary ops, unary math (vectorised
// through libmvec), where, cast.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernel_util.h"
#include "loops.h"
#include "vecmath.h"

namespace kiln::cpu {
namespace {

// ---- binary ------------------------------------------------------------------------

template <typename T, typename O, typename F>
inline void binary_row(const T* a, int64_t sa, const T* b, int64_t sb, O* o, int64_t n, F f) {
  if (sa == 1 && sb == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (sa == 0 && sb == 1) {
    const T x = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(x, b[i]);
  } else if (sa == 1 && sb == 0) {
    const T y = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], y);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i * sa], b[i * sb]);
  }
}

template <typename T, typename O, typename F>
void binary_apply(OpContext& ctx, F f) {
  const Tensor &A = ctx.in[0], &B = ctx.in[1];
  Tensor& Out = ctx.out[0];
  const Shape* shapes[2] = {&A.shape(), &B.shape()};
  BroadcastPlan<2> plan(Out.shape(), shapes);
  const T* a = static_cast<const T*>(A.raw_data());
  const T* b = static_cast<const T*>(B.raw_data());
  O* o = static_cast<O*>(Out.raw_data());
  const int64_t sa = plan.inner_stride(0), sb = plan.inner_stride(1);
  plan.run([&](const int64_t* off, int64_t oo, int64_t n) { binary_row(a + off[0], sa, b + off[1], sb, o + oo, n, f); });
}

template <typename T>
T int_pow(T base, T e) {
  if constexpr (std::is_same_v<T, bool>) {
    return base || !e;
  } else {
    if (e < 0) return base == 1 ? 1 : (base == T(-1) ? ((e & 1) ? T(-1) : T(1)) : T(0));
    T r = 1;
    while (e) {
      if (e & 1) r = static_cast<T>(r * base);
      base = static_cast<T>(base * base);
      e >>= 1;
    }
    return r;
  }
}

#define KILN_BINARY_KERNEL(NAME, EXPR)                                  \
  template <typename T>                                                 \
  void NAME(OpContext& ctx) {                                           \
    binary_apply<T, T>(ctx, [](T x, T y) -> T { return EXPR; });        \
  }
KILN_BINARY_KERNEL(k_add, static_cast<T>(x + y))
KILN_BINARY_KERNEL(k_sub, static_cast<T>(x - y))
KILN_BINARY_KERNEL(k_mul, static_cast<T>(x * y))
KILN_BINARY_KERNEL(k_div, static_cast<T>(x / y))
KILN_BINARY_KERNEL(k_maximum, (x > y || x != x) ? x : y)
KILN_BINARY_KERNEL(k_minimum, (x < y || x != x) ? x : y)

template <typename T>
void k_pow(OpContext& ctx) {
  if constexpr (std::is_floating_point_v<T>)
    binary_apply<T, T>(ctx, [](T x, T y) -> T { return vm::pow(x, y); });
  else
    binary_apply<T, T>(ctx, [](T x, T y) -> T { return int_pow<T>(x, y); });
}

#define KILN_COMPARE_KERNEL(NAME, EXPR)                                 \
  template <typename T>                                                 \
  void NAME(OpContext& ctx) {                                           \
    binary_apply<T, bool>(ctx, [](T x, T y) -> bool { return EXPR; });  \
  }
KILN_COMPARE_KERNEL(k_equal, x == y)
KILN_COMPARE_KERNEL(k_not_equal, x != y)
KILN_COMPARE_KERNEL(k_less, x < y)
KILN_COMPARE_KERNEL(k_less_equal, x <= y)
KILN_COMPARE_KERNEL(k_greater, x > y)
KILN_COMPARE_KERNEL(k_greater_equal, x >= y)

void k_logical_and(OpContext& ctx) { binary_apply<bool, bool>(ctx, [](bool x, bool y) { return x && y; }); }
void k_logical_or(OpContext& ctx) { binary_apply<bool, bool>(ctx, [](bool x, bool y) { return x || y; }); }

// ---- unary -------------------------------------------------------------------------

template <typename T, typename O, typename F>
void unary_apply(OpContext& ctx, F f) {
  const T* x = static_cast<const T*>(ctx.in[0].raw_data());
  O* o = static_cast<O*>(ctx.out[0].raw_data());
  parallel_for(ctx.in[0].numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) o[i] = f(x[i]);
  });
}

#define KILN_UNARY_KERNEL(NAME, EXPR)                                   \
  template <typename T>                                                 \
  void NAME(OpContext& ctx) {                                           \
    unary_apply<T, T>(ctx, [](T x) -> T { return EXPR; });              \
  }
KILN_UNARY_KERNEL(k_neg, static_cast<T>(-x))
KILN_UNARY_KERNEL(k_square, static_cast<T>(x * x))
KILN_UNARY_KERNEL(k_exp, vm::exp(x))
KILN_UNARY_KERNEL(k_log, vm::log(x))
KILN_UNARY_KERNEL(k_log1p, vm::log1p(x))
KILN_UNARY_KERNEL(k_sqrt, std::sqrt(x))
KILN_UNARY_KERNEL(k_rsqrt, T(1) / std::sqrt(x))
KILN_UNARY_KERNEL(k_reciprocal, T(1) / x)
KILN_UNARY_KERNEL(k_sin, vm::sin(x))
KILN_UNARY_KERNEL(k_cos, vm::cos(x))
KILN_UNARY_KERNEL(k_tanh, vm::tanh(x))
KILN_UNARY_KERNEL(k_sigmoid, T(1) / (T(1) + vm::exp(-x)))
KILN_UNARY_KERNEL(k_relu6, x < T(0) ? T(0) : (x > T(6) ? T(6) : x))
KILN_UNARY_KERNEL(k_silu, x / (T(1) + vm::exp(-x)))
KILN_UNARY_KERNEL(k_softplus, (x > T(0) ? x : T(0)) + vm::log1p(vm::exp(-std::abs(x))))
KILN_UNARY_KERNEL(k_erf, vm::erf(x))
KILN_UNARY_KERNEL(k_floor, std::floor(x))
KILN_UNARY_KERNEL(k_ceil, std::ceil(x))
KILN_UNARY_KERNEL(k_round, std::nearbyint(x))

template <typename T>
void k_abs(OpContext& ctx) {
  if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>)
    unary_apply<T, T>(ctx, [](T x) { return x; });
  else
    unary_apply<T, T>(ctx, [](T x) -> T { return x < T(0) ? static_cast<T>(-x) : x; });
}
template <typename T>
void k_sign(OpContext& ctx) {
  unary_apply<T, T>(ctx, [](T x) -> T { return x != x ? x : static_cast<T>((T(0) < x) - (x < T(0))); });
}
template <typename T>
void k_relu(OpContext& ctx) {
  unary_apply<T, T>(ctx, [](T x) -> T { return x > T(0) ? x : T(0); });
}
template <typename T>
void k_identity(OpContext& ctx) {
  std::memcpy(ctx.out[0].raw_data(), ctx.in[0].raw_data(), ctx.in[0].nbytes());
}
template <typename T>
void k_leaky_relu(OpContext& ctx) {
  const T a = static_cast<T>(ctx.attrs.get_float("alpha"));
  unary_apply<T, T>(ctx, [a](T x) -> T { return x > T(0) ? x : a * x; });
}
template <typename T>
void k_elu(OpContext& ctx) {
  const T a = static_cast<T>(ctx.attrs.get_float("alpha"));
  unary_apply<T, T>(ctx, [a](T x) -> T { return x > T(0) ? x : a * vm::expm1(x); });
}
template <typename T>
void k_gelu(OpContext& ctx) {
  if (ctx.attrs.get_bool("approximate", false)) {
    const T c = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
    unary_apply<T, T>(ctx, [c](T x) -> T { return T(0.5) * x * (T(1) + vm::tanh(c * (x + T(0.044715) * x * x * x))); });
  } else {
    const T r = static_cast<T>(0.7071067811865476);  // 1/sqrt(2)
    unary_apply<T, T>(ctx, [r](T x) -> T { return T(0.5) * x * (T(1) + vm::erf(x * r)); });
  }
}
template <typename T>
void k_clip(OpContext& ctx) {
  const T lo = static_cast<T>(ctx.attrs.get_float("min")), hi = static_cast<T>(ctx.attrs.get_float("max"));
  unary_apply<T, T>(ctx, [lo, hi](T x) -> T { return x < lo ? lo : (x > hi ? hi : x); });
}
void k_logical_not(OpContext& ctx) {
  unary_apply<bool, bool>(ctx, [](bool x) { return !x; });
}

// ---- where / cast ------------------------------------------------------------------

template <typename T>
void k_where(OpContext& ctx) {
  const Shape* shapes[3] = {&ctx.in[0].shape(), &ctx.in[1].shape(), &ctx.in[2].shape()};
  BroadcastPlan<3> plan(ctx.out[0].shape(), shapes);
  const bool* c = static_cast<const bool*>(ctx.in[0].raw_data());
  const T* x = static_cast<const T*>(ctx.in[1].raw_data());
  const T* y = static_cast<const T*>(ctx.in[2].raw_data());
  T* o = static_cast<T*>(ctx.out[0].raw_data());
  const int64_t sc = plan.inner_stride(0), sx = plan.inner_stride(1), sy = plan.inner_stride(2);
  plan.run([&](const int64_t* off, int64_t oo, int64_t n) {
    const bool* cc = c + off[0];
    const T* xx = x + off[1];
    const T* yy = y + off[2];
    T* out = o + oo;
    for (int64_t i = 0; i < n; ++i) out[i] = cc[i * sc] ? xx[i * sx] : yy[i * sy];
  });
}

void k_cast(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& o = ctx.out[0];
  const size_t si = x.itemsize(), so = o.itemsize();
  parallel_for(x.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    convert_buffer(static_cast<const char*>(x.raw_data()) + b * si, x.dtype(),
                   static_cast<char*>(o.raw_data()) + b * so, o.dtype(), e - b);
  });
}

// ---- registration ------------------------------------------------------------------

#define KILN_REG_FLOAT(op, K)                                                              \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF32, K<float>);                                   \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF64, K<double>);                                  \
  KILN_REGISTER_KERNEL(op, kCPU, (std::initializer_list<DType>{DType::kF16, DType::kBF16}), via_f32<K<float>>)
#define KILN_REG_INT(op, K)                                  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kU8, K<uint8_t>);    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI8, K<int8_t>);     \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI32, K<int32_t>);   \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI64, K<int64_t>)
#define KILN_REG_NUMERIC(op, K) \
  KILN_REG_FLOAT(op, K);        \
  KILN_REG_INT(op, K)
#define KILN_REG_ALL(op, K) \
  KILN_REG_NUMERIC(op, K);  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBool, K<bool>)

KILN_REG_NUMERIC("add", k_add);
KILN_REG_NUMERIC("sub", k_sub);
KILN_REG_NUMERIC("mul", k_mul);
KILN_REG_FLOAT("div", k_div);
KILN_REG_NUMERIC("pow", k_pow);
KILN_REG_ALL("maximum", k_maximum);
KILN_REG_ALL("minimum", k_minimum);
KILN_REG_ALL("equal", k_equal);
KILN_REG_ALL("not_equal", k_not_equal);
KILN_REG_ALL("less", k_less);
KILN_REG_ALL("less_equal", k_less_equal);
KILN_REG_ALL("greater", k_greater);
KILN_REG_ALL("greater_equal", k_greater_equal);
KILN_REGISTER_KERNEL("logical_and", kCPU, DType::kBool, k_logical_and);
KILN_REGISTER_KERNEL("logical_or", kCPU, DType::kBool, k_logical_or);
KILN_REGISTER_KERNEL("logical_not", kCPU, DType::kBool, k_logical_not);

KILN_REGISTER_KERNEL("neg", kCPU, DType::kF32, k_neg<float>);
KILN_REGISTER_KERNEL("neg", kCPU, DType::kF64, k_neg<double>);
KILN_REGISTER_KERNEL("neg", kCPU, (std::initializer_list<DType>{DType::kF16, DType::kBF16}), via_f32<k_neg<float>>);
KILN_REGISTER_KERNEL("neg", kCPU, DType::kI8, k_neg<int8_t>);
KILN_REGISTER_KERNEL("neg", kCPU, DType::kI32, k_neg<int32_t>);
KILN_REGISTER_KERNEL("neg", kCPU, DType::kI64, k_neg<int64_t>);
KILN_REG_NUMERIC("abs", k_abs);
KILN_REG_NUMERIC("sign", k_sign);
KILN_REG_NUMERIC("square", k_square);
KILN_REG_NUMERIC("relu", k_relu);
KILN_REG_FLOAT("exp", k_exp);
KILN_REG_FLOAT("log", k_log);
KILN_REG_FLOAT("log1p", k_log1p);
KILN_REG_FLOAT("sqrt", k_sqrt);
KILN_REG_FLOAT("rsqrt", k_rsqrt);
KILN_REG_FLOAT("reciprocal", k_reciprocal);
KILN_REG_FLOAT("sin", k_sin);
KILN_REG_FLOAT("cos", k_cos);
KILN_REG_FLOAT("tanh", k_tanh);
KILN_REG_FLOAT("sigmoid", k_sigmoid);
KILN_REG_FLOAT("relu6", k_relu6);
KILN_REG_FLOAT("leaky_relu", k_leaky_relu);
KILN_REG_FLOAT("elu", k_elu);
KILN_REG_FLOAT("gelu", k_gelu);
KILN_REG_FLOAT("silu", k_silu);
KILN_REG_FLOAT("softplus", k_softplus);
KILN_REG_FLOAT("erf", k_erf);
KILN_REG_FLOAT("floor", k_floor);
KILN_REG_FLOAT("ceil", k_ceil);
KILN_REG_FLOAT("round", k_round);
KILN_REG_INT("floor", k_identity);
KILN_REG_INT("ceil", k_identity);
KILN_REG_INT("round", k_identity);
KILN_REG_NUMERIC("clip", k_clip);
KILN_REG_ALL("where", k_where);
KILN_REGISTER_KERNEL("cast", kCPU, KILN_ALL_DTYPES, k_cast);

}  // namespace
}  // namespace kiln::cpu
