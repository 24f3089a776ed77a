#pragma once
// Launchers of pool_kernels.cu (internal): 2-d max/average pooling, their gradients and
// global pooling, NCHW or NHWC, floating dtypes (16-bit floats compute in float).
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// A pooling problem: input n x c x h x w, output oh x ow, window kh x kw, strides,
// top/left padding (windows clipped to the input; no window is empty).
struct PoolDims {
  bool nchw = false;
  bool relu = false;  // max_pool2d_backward's fused relu_grad: dx = 0 where x <= 0
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, pt = 0, pl = 0;
};

// y = max (NaN wins) or exclude-padding average over each window.
void launch_pool2d(const void* x, void* y, DType dtype, const PoolDims& d, bool max, cudaStream_t stream);
// dx = sum over the windows whose first maximal cell (row-major; the first NaN when
// there is one) is this cell of dy; windows added in row-major order.
void launch_max_pool2d_backward(const void* x, const void* dy, void* dx, DType dtype, const PoolDims& d,
                                cudaStream_t stream);
// dx = sum over the windows holding this cell of dy / (window's cell count).
void launch_avg_pool2d_backward(const void* dy, void* dx, DType dtype, const PoolDims& d, cudaStream_t stream);
// fused_conv2d's pool mask (attr pool_mask, kiln/ops/fused.h) of the 2x2, stride-2 NHWC
// f32 pool over x [n, 2 ph, 2 pw, c]: the winning cell 0-3 per window and channel (the
// first maximum, or the first NaN), 4 with relu where the maximum is not > 0.
void launch_pool_mask_2x2(const float* x, uint8_t* mask, int64_t n, int64_t ph, int64_t pw, int64_t c, bool relu,
                          cudaStream_t stream);
// max_pool2d_backward_mask: dx [n, 2 ph, 2 pw, c] = dy [n, ph, pw, c] at each window's
// winning cell, 0 elsewhere.
void launch_mask_pool_backward_2x2(const uint8_t* mask, const float* dy, float* dx, int64_t n, int64_t ph, int64_t pw,
                                   int64_t c, cudaStream_t stream);
// y[n, c] = max (NaN wins) or mean (accumulated in double) over the hw cells of (n, c).
void launch_global_pool2d(const void* x, void* y, DType dtype, bool nchw, int64_t n, int64_t c, int64_t hw,
                          bool max, cudaStream_t stream);

}  // namespace kiln::cuda
