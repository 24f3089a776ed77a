#include "composite_kernels.h"

#include <vector>

#include "kiln/core/dispatch.h"

namespace kiln::backends {

void fused_conv2d_backward_filter_unfused(OpContext& ctx) {
  const Tensor& y = ctx.in[1];  // or the pool's mask (attr pool_mask)
  const Tensor& dp = ctx.in[2];
  const bool bias_grad = ctx.out.size() > 1, mask = ctx.attrs.get_bool("pool_mask", false);
  const DeviceType dev = y.device().type;
  // The 2x2, stride-2, unpadded NHWC pool the op stands for (max_pool2d's attrs).
  Attrs pool = mask ? Attrs{}
                    : Attrs{{"ksize", std::vector<int64_t>{2, 2}},
                            {"strides", std::vector<int64_t>{2, 2}},
                            {"data_format", std::string("NHWC")},
                            {"padding", std::string("valid")}};
  if (!mask) pool.set("relu", ctx.attrs.get_bool("relu", false));
  pool.set("bias_grad", bias_grad);
  const Shape& p = dp.shape();
  std::vector<Tensor> pooled{Tensor::empty(mask ? Shape{p[0], 2 * p[1], 2 * p[2], p[3]} : y.shape(), dp.dtype(),
                                           dp.device())};
  if (bias_grad) pooled.push_back(ctx.out[1]);  // a handle on the output: the sum lands there
  run_kernel(mask ? "max_pool2d_backward_mask" : "max_pool2d_backward", dev, ctx.in.subspan(1, 2), pooled, pool);
  const Tensor filter_in[] = {ctx.in[0], pooled[0]};
  run_kernel("conv2d_backward_filter", dev, filter_in, ctx.out.first(1), ctx.attrs);
}

}  // namespace kiln::backends
