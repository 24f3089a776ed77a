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
// y[n, c] = max (NaN wins) or mean (accumulated in double) over the hw cells of (n, c).
void launch_global_pool2d(const void* x, void* y, DType dtype, bool nchw, int64_t n, int64_t c, int64_t hw,
                          bool max, cudaStream_t stream);

}  // namespace kiln::cuda
