#pragma once
// Launchers of random_kernels.cu (internal): the random ops and dropout, on the CPU
// backend's Philox4x32-10 counter layout (src/backends/cpu/random_kernels.cc), so the
// same key / offset / seed attrs give the same numbers on both backends.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// Uniform floats (f16, bf16, f32, f64): fma(span, u, base) clamped to [lo_clamp,
// hi_clamp]; every parameter is already a value of the compute type (f64 for f64,
// else f32).
void launch_random_uniform(DType dtype, void* out, int64_t n, uint64_t key, uint64_t offset, double base, double span,
                           double lo_clamp, double hi_clamp, cudaStream_t stream);
// Uniform integers (u8, i8, i32, i64): lo + multiply-shift of 64 random bits by range
// (modulo 2^64; range 0: the full 2^64 span).
void launch_random_uniform_int(DType dtype, void* out, int64_t n, uint64_t key, uint64_t offset, uint64_t lo,
                               uint64_t range, cudaStream_t stream);
// mean + stddev * z, z standard normal (Box-Muller); truncated: redrawn while |z| >= 2.
void launch_random_normal(DType dtype, void* out, int64_t n, uint64_t key, uint64_t offset, double mean,
                          double stddev, bool truncated, cudaStream_t stream);
// out[i] = word < threshold (bool), threshold <= 2^32.
void launch_bernoulli(void* out, int64_t n, uint64_t key, uint64_t offset, uint64_t threshold, cudaStream_t stream);
// y[i] = (word >> 8) >= threshold ? x[i] * scale : 0, word i % 4 of block (0, i / 4)
// under `key`; scale rounded to the compute type first.
void launch_dropout(DType dtype, const void* x, void* y, int64_t n, uint64_t key, uint32_t threshold, double scale,
                    cudaStream_t stream);

}  // namespace kiln::cuda
