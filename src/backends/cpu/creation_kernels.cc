// CPU kernels for creation ops: fill, eye, arange. One template per op, registered
// for every dtype (the output dtype picks the kernel).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernel_util.h"
#include "loops.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {
namespace {

// A double converted to T with cast semantics (16-bit floats round to nearest even).
template <typename T>
T from_double(double v) {
  T out;
  convert_buffer(&v, DType::kF64, &out, dtype_v<T>, 1);
  return out;
}

template <typename T>
void fill_range(T* o, int64_t n, T v) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) { std::fill(o + b, o + e, v); });
}

template <typename T>
void k_fill(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  const double value = ctx.attrs.get_float("value");
  if (value == 0.0) {  // +0.0 and -0.0: all-zero bytes for every dtype but -0.0 floats
    if (!std::signbit(value) || !is_floating(out.dtype())) {
      parallel_for(static_cast<int64_t>(out.nbytes()), kElementwiseGrain * 4, [&](int64_t b, int64_t e) {
        std::memset(static_cast<char*>(out.raw_data()) + b, 0, static_cast<size_t>(e - b));
      });
      return;
    }
  }
  fill_range(static_cast<T*>(out.raw_data()), out.numel(), from_double<T>(value));
}

template <typename T>
void k_eye(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  std::memset(out.raw_data(), 0, out.nbytes());
  const int64_t rows = out.dim(0), cols = out.dim(1);
  T* o = static_cast<T*>(out.raw_data());
  const T one = from_double<T>(1.0);
  for (int64_t i = 0; i < std::min(rows, cols); ++i) o[i * cols + i] = one;
}

template <typename T>
void k_arange(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  const double start = ctx.attrs.get_float("start"), step = ctx.attrs.get_float("step", 1.0);
  T* o = static_cast<T*>(out.raw_data());
  const int64_t n = out.numel();
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (std::floor(start) == start && std::floor(step) == step && std::abs(step) < 9.2e18) {
      // Exact integer steps (the op checked that the first and last values fit T).
      const int64_t s = static_cast<int64_t>(start), d = static_cast<int64_t>(step);
      parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
        for (int64_t i = b; i < e; ++i) o[i] = static_cast<T>(s + i * d);
      });
      return;
    }
  }
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const double v = start + static_cast<double>(i) * step;
      if constexpr (std::is_arithmetic_v<T>) o[i] = static_cast<T>(v);
      else o[i] = T(static_cast<float>(v));  // half, bfloat16
    }
  });
}

#define KILN_REG_CREATION(op, K)                            \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBool, K<bool>);    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kU8, K<uint8_t>);   \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI8, K<int8_t>);    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI32, K<int32_t>);  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kI64, K<int64_t>);  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF16, K<half>);     \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBF16, K<bfloat16>); \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF32, K<float>);    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF64, K<double>)

KILN_REG_CREATION("fill", k_fill);
KILN_REG_CREATION("eye", k_eye);
KILN_REG_CREATION("arange", k_arange);

}  // namespace
}  // namespace kiln::cpu
