// Random ops and dropout on CUDA: parameters prepared on the host exactly as the CPU
// kernels do (src/backends/cpu/random_kernels.cc, softmax_kernels.cc), numbers drawn
// by random_kernels.cu on the same Philox counters.
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "../common/uniform_bounds.h"
#include "kernel_util.h"
#include "random_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

uint64_t attr_bits(const Attrs& a, const char* name) {
  const int64_t v = a.get_int(name);
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}


template <typename T>
void uniform_float(OpContext& ctx, const KernelScope& s) {
  // Every parameter rounded to the computation type (f64 for f64, else f32) here, as
  // the CPU does; the kernel's conversions back from double are then exact.
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const double lo = ctx.attrs.get_float("lo"), hi = ctx.attrs.get_float("hi");
  const auto [lt, ht] = backends::uniform_bounds<T>(lo, hi);
  const C lc = static_cast<C>(backends::to_d(lt)), hc = static_cast<C>(backends::to_d(ht));
  const C span = static_cast<C>(hi - lo), base = static_cast<C>(lo);
  Tensor& out = ctx.out[0];
  launch_random_uniform(out.dtype(), out.raw_data(), out.numel(), attr_bits(ctx.attrs, "key"),
                        attr_bits(ctx.attrs, "offset"), base, span, lc, hc, s.stream);
}

void k_uniform(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  switch (out.dtype()) {
    case DType::kF16: return uniform_float<half>(ctx, s);
    case DType::kBF16: return uniform_float<bfloat16>(ctx, s);
    case DType::kF32: return uniform_float<float>(ctx, s);
    case DType::kF64: return uniform_float<double>(ctx, s);
    default: break;
  }
  // Integer bounds (the op checked lo >= min(T), hi <= max(T) + 1), in uint64
  // arithmetic modulo 2^64: hi may be 2^63 for i64, and range 0 stands for 2^64.
  const double lo_d = ctx.attrs.get_float("lo"), hi_d = ctx.attrs.get_float("hi");
  const uint64_t lo = static_cast<uint64_t>(static_cast<int64_t>(lo_d));
  const uint64_t hi =
      hi_d >= 9223372036854775808.0 ? uint64_t{1} << 63 : static_cast<uint64_t>(static_cast<int64_t>(hi_d));
  launch_random_uniform_int(out.dtype(), out.raw_data(), out.numel(), attr_bits(ctx.attrs, "key"),
                            attr_bits(ctx.attrs, "offset"), lo, hi - lo, s.stream);
}

void normal(OpContext& ctx, bool truncated) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  launch_random_normal(out.dtype(), out.raw_data(), out.numel(), attr_bits(ctx.attrs, "key"),
                       attr_bits(ctx.attrs, "offset"), ctx.attrs.get_float("mean"), ctx.attrs.get_float("stddev"),
                       truncated, s.stream);
}
void k_normal(OpContext& ctx) { normal(ctx, false); }
void k_truncated_normal(OpContext& ctx) { normal(ctx, true); }

void k_bernoulli(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const double p = ctx.attrs.get_float("p");
  // true iff word < p * 2^32 (p = 1: always).
  const uint64_t threshold = p >= 1.0 ? (uint64_t{1} << 32) : static_cast<uint64_t>(p * 4294967296.0);
  launch_bernoulli(out.raw_data(), out.numel(), attr_bits(ctx.attrs, "key"), attr_bits(ctx.attrs, "offset"),
                   threshold, s.stream);
}

void k_dropout(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const double rate = ctx.attrs.get_float("rate");
  // u >= rate with u = (w >> 8) / 2^24  <=>  (w >> 8) >= ceil(rate * 2^24) (exact in double).
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(rate * 16777216.0));
  launch_dropout(out.dtype(), ctx.in[0].raw_data(), out.raw_data(), out.numel(), attr_bits(ctx.attrs, "seed"),
                 threshold, 1.0 / (1.0 - rate), s.stream);
}

KILN_REGISTER_KERNEL("random_uniform", kCUDA,
                     (std::initializer_list<DType>{DType::kF16, DType::kBF16, DType::kF32, DType::kF64, DType::kU8,
                                                   DType::kI8, DType::kI32, DType::kI64}),
                     k_uniform);
KILN_REGISTER_KERNEL("random_normal", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_normal);
KILN_REGISTER_KERNEL("truncated_normal", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_truncated_normal);
KILN_REGISTER_KERNEL("bernoulli", kCUDA, DType::kBool, k_bernoulli);
KILN_REGISTER_KERNEL("dropout", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_dropout);

}  // namespace
}  // namespace kiln::cuda
