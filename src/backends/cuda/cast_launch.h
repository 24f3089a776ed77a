#pragma once
// Launchers of cast_kernels.cu (internal).
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// dst[i] = src[i] converted (static_cast semantics; to bool: != 0; 16-bit floats round
// to nearest even), n elements.
void launch_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream);

}  // namespace kiln::cuda
