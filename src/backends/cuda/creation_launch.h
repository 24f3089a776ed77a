#pragma once
// Launchers of creation_kernels.cu (internal).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// out[i] = the value whose bytes are the low `itemsize` bytes of `bits` (little-endian),
// n elements of itemsize 1, 2, 4 or 8.
void launch_fill(void* out, int64_t n, size_t itemsize, uint64_t bits, cudaStream_t stream);

// A rows x cols identity: zeros, and the value of `one_bits` (as launch_fill) at [i, i].
void launch_eye(void* out, int64_t rows, int64_t cols, size_t itemsize, uint64_t one_bits, cudaStream_t stream);

// out[i] = start + i * step (n elements of `dtype`), as the CPU kernel computes it:
// exact int64 arithmetic (istart + i * istep, wrapping) when `exact_int`; otherwise
// fma(i, step, start) in double, converted with static_cast semantics (f16/bf16 through
// float, as the CPU does).
void launch_arange(DType dtype, void* out, int64_t n, double start, double step, bool exact_int, int64_t istart,
                   int64_t istep, cudaStream_t stream);

}  // namespace kiln::cuda
