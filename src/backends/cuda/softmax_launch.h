#pragma once
// Launchers of softmax_kernels.cu (internal). (embedding runs on indexing_launch.h's
// gather.)
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// softmax (log_softmax when `log`) of x viewed as [outer, n, inner] along the middle
// dim, into y (same shape, dtype f32/f64/f16/bf16; 16-bit floats compute in f32):
// y = exp(x - max) * (1 / sum(exp(x - max))), or x - (max + log(sum(exp(x - max)))).
void launch_softmax(const void* x, void* y, DType dtype, int64_t outer, int64_t n, int64_t inner, bool log,
                    cudaStream_t stream);

}  // namespace kiln::cuda
