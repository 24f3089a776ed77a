// Normalisation on CUDA: batch norm (given or batch statistics), layer norm, RMS norm
// (kernels: norm_kernels.cu). As on the CPU, parameters may be f32 for f16/bf16 inputs.
#include "../common/axis_view.h"
#include "kernel_util.h"
#include "norm_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

// Bit i set when parameter input first + i is f32 while x is a 16-bit float.
unsigned f32_mask(const OpContext& ctx, size_t first, size_t count) {
  unsigned m = 0;
  const DType x = ctx.in[0].dtype();
  if (x != DType::kF16 && x != DType::kBF16) return 0;
  for (size_t i = 0; i < count; ++i)
    if (ctx.in[first + i].dtype() == DType::kF32) m |= 1u << i;
  return m;
}

using backends::ChannelView;

void k_batch_norm_inference(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  const ChannelView v(x.shape(), normalize_axis(ctx.attrs.get_int("axis"), x.rank()));
  if (x.numel() == 0) return;  // the only output is empty
  KernelScope s(ctx.out[0]);
  void* scratch = workspace(s.ctx, static_cast<size_t>(batch_norm_scratch_bytes(false, v.outer, v.c, v.inner, 0)));
  launch_batch_norm_inference(x.raw_data(), ctx.in[1].raw_data(), ctx.in[2].raw_data(), ctx.in[3].raw_data(),
                              ctx.in[4].raw_data(), f32_mask(ctx, 1, 4), ctx.out[0].raw_data(), x.dtype(), v.outer,
                              v.c, v.inner, ctx.attrs.get_float("eps"), scratch, s.stream);
}

void k_batch_norm_training(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  const ChannelView v(x.shape(), normalize_axis(ctx.attrs.get_int("axis"), x.rank()));
  if (v.c == 0) return;
  KernelScope s(ctx.out[1]);
  const int sms = s.ctx.props.multiProcessorCount;
  void* scratch = workspace(s.ctx, static_cast<size_t>(batch_norm_scratch_bytes(true, v.outer, v.c, v.inner, sms)));
  launch_batch_norm_training(x.raw_data(), ctx.in[1].raw_data(), ctx.in[2].raw_data(), f32_mask(ctx, 1, 2),
                             ctx.out[0].raw_data(), ctx.out[1].raw_data(), ctx.out[2].raw_data(), x.dtype(), v.outer,
                             v.c, v.inner, ctx.attrs.get_float("eps"), scratch, sms, s.stream);
}

void k_layer_norm(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  if (x.numel() == 0) return;
  const int begin = normalize_axis(ctx.attrs.get_int("begin_axis"), x.rank());
  int64_t d = 1;
  for (int i = begin; i < x.rank(); ++i) d *= x.dim(i);
  KernelScope s(ctx.out[0]);
  launch_layer_norm(x.raw_data(), ctx.in[1].raw_data(), ctx.in[2].raw_data(), ctx.out[0].raw_data(), x.dtype(),
                    x.numel() / d, d, ctx.attrs.get_float("eps"), f32_mask(ctx, 1, 2), s.stream);
}

void k_rms_norm(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  if (x.numel() == 0) return;
  const int64_t d = x.dim(-1);
  KernelScope s(ctx.out[0]);
  launch_rms_norm(x.raw_data(), ctx.in[1].raw_data(), ctx.out[0].raw_data(), x.dtype(), x.numel() / d, d,
                  ctx.attrs.get_float("eps"), f32_mask(ctx, 1, 1), s.stream);
}

KILN_REGISTER_KERNEL("batch_norm_inference", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_batch_norm_inference);
KILN_REGISTER_KERNEL("batch_norm_training", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_batch_norm_training);
KILN_REGISTER_KERNEL("layer_norm", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_layer_norm);
KILN_REGISTER_KERNEL("rms_norm", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_rms_norm);

}  // namespace
}  // namespace kiln::cuda
