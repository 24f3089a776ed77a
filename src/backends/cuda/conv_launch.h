#pragma once
// Launchers of conv_kernels.cu (internal): layout helpers around cuDNN's convolutions.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// dst[n, c, h, w] = src[n, c, h + off_h, w + off_w] where that lies inside src's
// src_h x src_w plane, else 0, for dst of dst_h x dst_w (NCHW, or NHWC when !nchw).
// Zero-pads (negative offsets) or crops (positive) an activation; any dtype of
// `elem_bytes` (2, 4 or 8) bytes.
void launch_window_copy(const void* src, void* dst, size_t elem_bytes, bool nchw, int64_t n, int64_t c, int64_t src_h,
                        int64_t src_w, int64_t dst_h, int64_t dst_w, int64_t off_h, int64_t off_w,
                        cudaStream_t stream);

// dst[j, i] = src[i, j] for a row-major rows x cols matrix (dst: cols x rows) of
// elements of `elem_bytes` (2, 4 or 8) bytes.
void launch_transpose2d(const void* src, void* dst, size_t elem_bytes, int64_t rows, int64_t cols,
                        cudaStream_t stream);

}  // namespace kiln::cuda
