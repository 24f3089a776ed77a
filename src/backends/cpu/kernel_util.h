#pragma once
// Kernel registration helpers for the CPU backend (internal).
#include <type_traits>
#include <vector>

#include "kiln/core/half.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {

inline constexpr DeviceType kCPU = DeviceType::kCPU;

// 16-bit float storage types compute in float, converted in chunks of kChunk
// elements that stay in L1 (no whole-tensor conversion passes).
template <typename T>
inline constexpr bool kIs16 = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;
template <typename T>
using compute_t = std::conditional_t<kIs16<T>, float, T>;
constexpr int64_t kChunk = 512;

// Runs a float kernel for f16/bf16 tensors: inputs of 16-bit float dtype are
// widened to f32, the f32 kernel runs, and 16-bit float outputs are rounded back.
template <KernelFn F32Kernel>
void via_f32(OpContext& ctx) {
  std::vector<Tensor> in, out;
  in.reserve(ctx.in.size());
  for (const Tensor& t : ctx.in)
    in.push_back(t.dtype() == DType::kF16 || t.dtype() == DType::kBF16 ? t.to(DType::kF32) : t);
  out.reserve(ctx.out.size());
  for (const Tensor& t : ctx.out)
    out.push_back(t.dtype() == DType::kF16 || t.dtype() == DType::kBF16 ? Tensor::empty(t.shape(), DType::kF32) : t);
  OpContext c2{ctx.op, in, out, ctx.attrs};
  F32Kernel(c2);
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].is_same(ctx.out[i]))
      convert_buffer(out[i].raw_data(), DType::kF32, ctx.out[i].raw_data(), ctx.out[i].dtype(), out[i].numel());
}

#define KILN_ALL_DTYPES                                                                                 \
  {DType::kBool, DType::kU8, DType::kI8, DType::kI32, DType::kI64, DType::kF16, DType::kBF16, DType::kF32, \
   DType::kF64}

}  // namespace kiln::cpu
