// CPU kernels for elementwise ops: broadcasting binary ops, unary math (vectorised
// through libmvec), where, cast.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernel_util.h"
#include "loops.h"
#include "vecmath.h"
#include "kiln/core/denormals.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {
namespace {


template <typename T>
inline void load_f32(const T* src, int64_t stride, float* dst, int64_t n) {
  if (stride == 1) {
    if constexpr (std::is_same_v<T, half>)
      convert_half_to_float(src, dst, static_cast<size_t>(n));
    else
      convert_bf16_to_float(src, dst, static_cast<size_t>(n));
  } else {
    const float v = static_cast<float>(src[0]);  // stride 0: broadcast scalar
    for (int64_t i = 0; i < n; ++i) dst[i] = stride == 0 ? v : static_cast<float>(src[i * stride]);
  }
}
template <typename O>
inline void store_from_f32(const float* src, O* dst, int64_t n) {
  if constexpr (std::is_same_v<O, half>)
    convert_float_to_half(src, dst, static_cast<size_t>(n));
  else if constexpr (std::is_same_v<O, bfloat16>)
    convert_float_to_bf16(src, dst, static_cast<size_t>(n));
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<O>(src[i]);
}

// ---- binary ------------------------------------------------------------------------

template <typename T, typename O, typename F>
inline void binary_row(const T* a, int64_t sa, const T* b, int64_t sb, O* o, int64_t n, F f) {
  if constexpr (kIs16<T>) {
    float fa[kChunk], fb[kChunk];
    using R = std::conditional_t<kIs16<O>, float, O>;
    R fo[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      int64_t m = std::min(kChunk, n - i);
      load_f32(a + i * sa, sa, fa, m);
      load_f32(b + i * sb, sb, fb, m);
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) fo[j] = f(fa[j], fb[j]);
      if constexpr (kIs16<O>)
        store_from_f32(fo, o + i, m);
      else
        std::copy(fo, fo + m, o + i);
    }
  } else if (sa == 1 && sb == 1) {
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

// EXPR sees x, y of the compute type C (float for f16/bf16).
#define KILN_BINARY_KERNEL(NAME, EXPR)                                   \
  template <typename T>                                                  \
  void NAME(OpContext& ctx) {                                            \
    using C = compute_t<T>;                                              \
    binary_apply<T, T>(ctx, [](C x, C y) -> C { return EXPR; });         \
  }
KILN_BINARY_KERNEL(k_add, static_cast<C>(x + y))
KILN_BINARY_KERNEL(k_sub, static_cast<C>(x - y))
KILN_BINARY_KERNEL(k_mul, static_cast<C>(x * y))
KILN_BINARY_KERNEL(k_div, static_cast<C>(x / y))
KILN_BINARY_KERNEL(k_maximum, (x > y || x != x) ? x : y)
KILN_BINARY_KERNEL(k_minimum, (x < y || x != x) ? x : y)

template <typename T>
void k_pow(OpContext& ctx) {
  using C = compute_t<T>;
  if constexpr (std::is_floating_point_v<C>)
    binary_apply<T, T>(ctx, [](C x, C y) -> C { return vm::pow(x, y); });
  else
    binary_apply<T, T>(ctx, [](C x, C y) -> C { return int_pow<C>(x, y); });
}

#define KILN_COMPARE_KERNEL(NAME, EXPR)                                  \
  template <typename T>                                                  \
  void NAME(OpContext& ctx) {                                            \
    using C = compute_t<T>;                                              \
    binary_apply<T, bool>(ctx, [](C x, C y) -> bool { return EXPR; });   \
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

template <typename T, typename F>
void unary_apply(OpContext& ctx, F f) {
  const T* x = static_cast<const T*>(ctx.in[0].raw_data());
  T* o = static_cast<T*>(ctx.out[0].raw_data());
  parallel_for(ctx.in[0].numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    if constexpr (kIs16<T>) {
      float buf[kChunk];
      for (int64_t i = b; i < e; i += kChunk) {
        int64_t m = std::min(kChunk, e - i);
        load_f32(x + i, 1, buf, m);
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) buf[j] = f(buf[j]);
        store_from_f32(buf, o + i, m);
      }
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) o[i] = f(x[i]);
    }
  });
}

// EXPR sees x of the compute type C (float for f16/bf16).
#define KILN_UNARY_KERNEL(NAME, EXPR)                                    \
  template <typename T>                                                  \
  void NAME(OpContext& ctx) {                                            \
    using C = compute_t<T>;                                              \
    unary_apply<T>(ctx, [](C x) -> C { return EXPR; });                  \
  }
KILN_UNARY_KERNEL(k_neg, static_cast<C>(-x))
KILN_UNARY_KERNEL(k_square, static_cast<C>(x * x))
KILN_UNARY_KERNEL(k_exp, vm::exp(x))
KILN_UNARY_KERNEL(k_log, vm::log(x))
KILN_UNARY_KERNEL(k_log1p, vm::log1p(x))
KILN_UNARY_KERNEL(k_sqrt, std::sqrt(x))
KILN_UNARY_KERNEL(k_rsqrt, C(1) / std::sqrt(x))
KILN_UNARY_KERNEL(k_reciprocal, C(1) / x)
KILN_UNARY_KERNEL(k_sin, vm::sin(x))
KILN_UNARY_KERNEL(k_cos, vm::cos(x))
KILN_UNARY_KERNEL(k_tanh, vm::tanh(x))
KILN_UNARY_KERNEL(k_sigmoid, C(1) / (C(1) + vm::exp(-x)))
KILN_UNARY_KERNEL(k_relu6, x < C(0) ? C(0) : (x > C(6) ? C(6) : x))
KILN_UNARY_KERNEL(k_silu, x / (C(1) + vm::exp(-x)))
KILN_UNARY_KERNEL(k_softplus, (x > C(0) ? x : C(0)) + vm::log1p(vm::exp(-std::abs(x))))
KILN_UNARY_KERNEL(k_erf, vm::erf(x))
KILN_UNARY_KERNEL(k_floor, std::floor(x))
KILN_UNARY_KERNEL(k_ceil, std::ceil(x))
KILN_UNARY_KERNEL(k_round, std::nearbyint(x))

template <typename T>
void k_abs(OpContext& ctx) {
  using C = compute_t<T>;
  if constexpr (std::is_unsigned_v<C> || std::is_same_v<C, bool>)
    unary_apply<T>(ctx, [](C x) { return x; });
  else
    unary_apply<T>(ctx, [](C x) -> C { return x < C(0) ? static_cast<C>(-x) : x; });
}
template <typename T>
void k_sign(OpContext& ctx) {
  using C = compute_t<T>;
  unary_apply<T>(ctx, [](C x) -> C { return x != x ? x : static_cast<C>((C(0) < x) - (x < C(0))); });
}
// Whether a 16-bit float (bf16 or IEEE half, both sign-magnitude) is > 0 as the f32
// compare of its widened value would say: sign clear, at least `least` (the smallest
// subnormal, or the smallest normal when denormals are flushed: kiln/core/denormals.h),
// not NaN (above the infinity's bit pattern; a set sign bit is above it too).
template <typename T>
inline bool positive16(uint16_t bits, uint16_t least) {
  constexpr uint16_t kInf = std::is_same_v<T, bfloat16> ? 0x7f80 : 0x7c00;
  return bits >= least && bits <= kInf;
}
// The least positive bit pattern an f32 compare sees as > 0 in the current mode. Half's
// subnormals are f32 normals; bf16's are f32 subnormals.
template <typename T>
inline uint16_t least_positive16() {
  return std::is_same_v<T, bfloat16> && flush_denormals() ? 0x0080 : 0x0001;
}

template <typename T>
void k_relu(OpContext& ctx) {
  using C = compute_t<T>;
  if constexpr (kIs16<T>) {
    // On the bits: the result is x or +0, both exact (no round trip through f32).
    const uint16_t* x = static_cast<const uint16_t*>(ctx.in[0].raw_data());
    uint16_t* o = static_cast<uint16_t*>(ctx.out[0].raw_data());
    const uint16_t least = least_positive16<T>();
    parallel_for(ctx.in[0].numel(), kElementwiseGrain, [x, o, least](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) o[i] = positive16<T>(x[i], least) ? x[i] : uint16_t{0};
    });
  } else {
    unary_apply<T>(ctx, [](C x) -> C { return x > C(0) ? x : C(0); });
  }
}
template <typename T>
void k_relu_grad(OpContext& ctx) {
  using C = compute_t<T>;
  const T* g = static_cast<const T*>(ctx.in[0].raw_data());
  const T* y = static_cast<const T*>(ctx.in[1].raw_data());
  T* o = static_cast<T*>(ctx.out[0].raw_data());
  // Pointers by value and both loads unconditional: the select vectorises (a branch
  // on the sign of y mispredicts half the time and ran 5x slower).
  const uint16_t least = kIs16<T> ? least_positive16<T>() : 0;
  parallel_for(ctx.in[0].numel(), kElementwiseGrain, [g, y, o, least](int64_t b, int64_t e) {
    if constexpr (kIs16<T>) {  // on the bits: g or +0, exact
      const uint16_t* gb = reinterpret_cast<const uint16_t*>(g);
      const uint16_t* yb = reinterpret_cast<const uint16_t*>(y);
      uint16_t* ob = reinterpret_cast<uint16_t*>(o);
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const uint16_t gi = gb[i], yi = yb[i];
        ob[i] = positive16<T>(yi, least) ? gi : uint16_t{0};
      }
    } else {
      // No __restrict: the graph executor may pass o == g (in place); the simd
      // pragma vectorises without it.
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const C gi = g[i], yi = y[i];
        o[i] = yi > C(0) ? gi : C(0);
      }
    }
  });
}
template <typename T>
void k_identity(OpContext& ctx) {
  std::memcpy(ctx.out[0].raw_data(), ctx.in[0].raw_data(), ctx.in[0].nbytes());
}
template <typename T>
void k_leaky_relu(OpContext& ctx) {
  using C = compute_t<T>;
  const C a = static_cast<C>(ctx.attrs.get_float("alpha"));
  unary_apply<T>(ctx, [a](C x) -> C { return x > C(0) ? x : a * x; });
}
template <typename T>
void k_elu(OpContext& ctx) {
  using C = compute_t<T>;
  const C a = static_cast<C>(ctx.attrs.get_float("alpha"));
  unary_apply<T>(ctx, [a](C x) -> C { return x > C(0) ? x : a * vm::expm1(x); });
}
template <typename T>
void k_gelu(OpContext& ctx) {
  using C = compute_t<T>;
  if (ctx.attrs.get_bool("approximate", false)) {
    const C c = static_cast<C>(0.7978845608028654);  // sqrt(2/pi)
    unary_apply<T>(ctx, [c](C x) -> C { return C(0.5) * x * (C(1) + vm::tanh(c * (x + C(0.044715) * x * x * x))); });
  } else {
    // x * Phi(x) = 0.5 x erfc(-x/sqrt(2)): no cancellation for negative x.
    const C r = static_cast<C>(0.7071067811865476);  // 1/sqrt(2)
    unary_apply<T>(ctx, [r](C x) -> C { return C(0.5) * x * vm::erfc(-x * r); });
  }
}
template <typename T>
void k_clip(OpContext& ctx) {
  using C = compute_t<T>;
  const C lo = static_cast<C>(ctx.attrs.get_float("min")), hi = static_cast<C>(ctx.attrs.get_float("max"));
  unary_apply<T>(ctx, [lo, hi](C x) -> C { return x < lo ? lo : (x > hi ? hi : x); });
}
void k_logical_not(OpContext& ctx) {
  unary_apply<bool>(ctx, [](bool x) { return !x; });
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
    const bool* __restrict cc = c + off[0];
    const T* __restrict xx = x + off[1];
    const T* __restrict yy = y + off[2];
    T* __restrict out = o + oo;
    // Unit-stride fast paths: same-shape operands, or a scalar branch. Both loads are
    // unconditional so the select vectorises (a data-dependent branch mispredicts on
    // random masks and ran ~5x slower).
    if (sc == 1 && sx == 1 && sy == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const T a = xx[i], b = yy[i];
        out[i] = cc[i] ? a : b;
      }
    } else if (sc == 1 && sx == 1 && sy == 0) {
      const T yv = yy[0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const T a = xx[i];
        out[i] = cc[i] ? a : yv;
      }
    } else if (sc == 1 && sx == 0 && sy == 1) {
      const T xv = xx[0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const T b = yy[i];
        out[i] = cc[i] ? xv : b;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = cc[i * sc] ? xx[i * sx] : yy[i * sy];
    }
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
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF16, K<half>);                                    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBF16, K<bfloat16>)
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
KILN_REGISTER_KERNEL("neg", kCPU, DType::kF16, k_neg<half>);
KILN_REGISTER_KERNEL("neg", kCPU, DType::kBF16, k_neg<bfloat16>);
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
KILN_REG_FLOAT("relu_grad", k_relu_grad);
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
KILN_REG_ALL("stop_gradient", k_identity);

}  // namespace
}  // namespace kiln::cpu
