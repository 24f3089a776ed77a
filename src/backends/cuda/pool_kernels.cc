// Pooling on CUDA: max_pool2d, avg_pool2d, global_avg_pool2d, global_max_pool2d and the
// gradients max_pool2d_backward, max_pool2d_backward_mask, avg_pool2d_backward (kernels
// in pool_kernels.cu).
//
// kiln's own kernels rather than cuDNN's: cuDNN pads symmetrically only, and its
// max-pooling gradient does not promise the CPU's tie-breaking (the first maximal cell
// of a window, row-major; the first NaN when the window holds one). Max propagates
// NaN; averages exclude the padding from the count; global averages accumulate in
// double, as on the CPU. The gradients gather (one thread per input cell, windows in
// row-major order): deterministic, no atomics.
#include "cuda_error.h"
#include "kernel_util.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/kernel.h"
#include "../common/nn_geometry.h"
#include "pool_launch.h"

namespace kiln::cuda {
namespace {

using nn_geometry::Pool2dGeometry;
using nn_geometry::pool2d_geometry;

PoolDims dims_of(const Pool2dGeometry& g) {
  PoolDims d;
  d.nchw = g.nchw;
  d.n = g.n;
  d.c = g.c;
  d.h = g.h;
  d.w = g.w;
  d.oh = g.win.oh;
  d.ow = g.win.ow;
  d.kh = g.win.kh;
  d.kw = g.win.kw;
  d.sh = g.win.sh;
  d.sw = g.win.sw;
  d.pt = g.win.pt;
  d.pl = g.win.pl;
  return d;
}

template <bool kMax>
void pool2d(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry(kMax ? "max_pool2d" : "avg_pool2d", ctx.in[0].shape(), ctx.attrs);
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  launch_pool2d(ctx.in[0].raw_data(), out.raw_data(), out.dtype(), dims_of(g), kMax, s.stream);
}

// Attr bias_grad: db (the second output) = dx summed per channel, by the sum op's
// kernel after dx is written (a fused sum is the CPU kernel's).
void max_pool2d_backward(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry("max_pool2d_backward", ctx.in[0].shape(), ctx.attrs);
  Tensor& dx = ctx.out[0];
  KernelScope s(dx);
  if (dx.numel() > 0 && ctx.in[1].numel() == 0)  // no windows (cannot happen for a non-empty input, kept for safety)
    KILN_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), s.stream));
  if (dx.numel() > 0 && ctx.in[1].numel() > 0) {
    PoolDims d = dims_of(g);
    d.relu = ctx.attrs.get_bool("relu", false);
    launch_max_pool2d_backward(ctx.in[0].raw_data(), ctx.in[1].raw_data(), dx.raw_data(), dx.dtype(), d, s.stream);
  }
  if (ctx.out.size() > 1)
    run_kernel("sum", DeviceType::kCUDA, ctx.out.first(1), ctx.out.subspan(1, 1),
               Attrs{{"axes", g.non_channel_axes()}, {"keepdims", false}});
}

// max_pool2d_backward_mask (f32); bias_grad as above.
void max_pool2d_backward_mask(OpContext& ctx) {
  const Shape& m = ctx.in[0].shape();
  Tensor& dx = ctx.out[0];
  KernelScope s(dx);
  launch_mask_pool_backward_2x2(static_cast<const uint8_t*>(ctx.in[0].raw_data()),
                                static_cast<const float*>(ctx.in[1].raw_data()), static_cast<float*>(dx.raw_data()),
                                m[0], m[1], m[2], m[3], s.stream);
  if (ctx.out.size() > 1)
    run_kernel("sum", DeviceType::kCUDA, ctx.out.first(1), ctx.out.subspan(1, 1),
               Attrs{{"axes", std::vector<int64_t>{0, 1, 2}}, {"keepdims", false}});
}

void avg_pool2d_backward(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry("avg_pool2d_backward", Shape(ctx.attrs.get_ints("input_shape")), ctx.attrs);
  Tensor& dx = ctx.out[0];
  if (dx.numel() == 0) return;
  KernelScope s(dx);
  if (ctx.in[0].numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), s.stream));
    return;
  }
  launch_avg_pool2d_backward(ctx.in[0].raw_data(), dx.raw_data(), dx.dtype(), dims_of(g), s.stream);
}

template <bool kMax>
void global_pool2d(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  const bool nchw = nn_geometry::parse_data_format(kMax ? "global_max_pool2d" : "global_avg_pool2d", ctx.attrs);
  const int64_t n = x.dim(0), c = nchw ? x.dim(1) : x.dim(3), hw = nchw ? x.dim(2) * x.dim(3) : x.dim(1) * x.dim(2);
  KernelScope s(out);
  launch_global_pool2d(x.raw_data(), out.raw_data(), out.dtype(), nchw, n, c, hw, kMax, s.stream);
}

KILN_REGISTER_KERNEL("max_pool2d", kCUDA, KILN_CUDA_FLOAT_DTYPES, pool2d<true>);
KILN_REGISTER_KERNEL("avg_pool2d", kCUDA, KILN_CUDA_FLOAT_DTYPES, pool2d<false>);
KILN_REGISTER_KERNEL("max_pool2d_backward", kCUDA, KILN_CUDA_FLOAT_DTYPES, max_pool2d_backward);
KILN_REGISTER_KERNEL("avg_pool2d_backward", kCUDA, KILN_CUDA_FLOAT_DTYPES, avg_pool2d_backward);
KILN_REGISTER_KERNEL("max_pool2d_backward_mask", kCUDA, DType::kF32, max_pool2d_backward_mask);
KILN_REGISTER_KERNEL("global_avg_pool2d", kCUDA, KILN_CUDA_FLOAT_DTYPES, global_pool2d<false>);
KILN_REGISTER_KERNEL("global_max_pool2d", kCUDA, KILN_CUDA_FLOAT_DTYPES, global_pool2d<true>);

}  // namespace
}  // namespace kiln::cuda
