// Creation ops on CUDA: fill, eye, arange (every dtype; the output dtype selects the
// kernel). Semantics: src/backends/cpu/creation_kernels.cc.
#include <cmath>
#include <cstring>

#include "creation_launch.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

// The bytes of `v` converted to `dtype` (cast semantics; 16-bit floats round to
// nearest even), in the low bytes of a uint64.
uint64_t value_bits(double v, DType dtype) {
  uint64_t bits = 0;
  convert_buffer(&v, DType::kF64, &bits, dtype, 1);
  return bits;
}

void k_fill(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  // +0.0 gives all-zero bytes for every dtype, -0.0 its sign bit for floats (the CPU
  // kernel's memset / fill split).
  launch_fill(out.raw_data(), out.numel(), out.itemsize(), value_bits(ctx.attrs.get_float("value"), out.dtype()),
              s.stream);
}

void k_eye(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  launch_eye(out.raw_data(), out.dim(0), out.dim(1), out.itemsize(), value_bits(1.0, out.dtype()), s.stream);
}

void k_arange(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const double start = ctx.attrs.get_float("start"), step = ctx.attrs.get_float("step", 1.0);
  // Exact integer steps for integer dtypes (the op checked that the first and last values fit).
  const bool exact = is_integral(out.dtype()) && std::floor(start) == start && std::floor(step) == step &&
                     std::abs(step) < 9.2e18;
  const int64_t istart = exact ? static_cast<int64_t>(start) : 0, istep = exact ? static_cast<int64_t>(step) : 0;
  launch_arange(out.dtype(), out.raw_data(), out.numel(), start, step, exact, istart, istep, s.stream);
}

KILN_REGISTER_KERNEL("fill", kCUDA, KILN_CUDA_ALL_DTYPES, k_fill);
KILN_REGISTER_KERNEL("eye", kCUDA, KILN_CUDA_ALL_DTYPES, k_eye);
KILN_REGISTER_KERNEL("arange", kCUDA, KILN_CUDA_ALL_DTYPES, k_arange);

}  // namespace
}  // namespace kiln::cuda
