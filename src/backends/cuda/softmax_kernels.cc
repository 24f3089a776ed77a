// softmax, log_softmax and embedding on CUDA (kernels: softmax_kernels.cu; embedding
// is a row gather through indexing_launch.h). dropout lives elsewhere.
//
// embedding: an id outside [0, V) gives a row of zeros (the CPU throws
// OutOfRangeError; checking on the GPU would need a host sync; TensorFlow's GPU
// kernels behave the same way).
#include "indexing_launch.h"
#include "kernel_util.h"
#include "softmax_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

template <bool kLog>
void k_softmax(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  if (x.numel() == 0) return;
  const int axis = normalize_axis(ctx.attrs.get_int("axis", -1), x.rank());
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= x.dim(i);
  for (int i = axis + 1; i < x.rank(); ++i) inner *= x.dim(i);
  KernelScope s(ctx.out[0]);
  launch_softmax(x.raw_data(), ctx.out[0].raw_data(), x.dtype(), outer, x.dim(axis), inner, kLog, s.stream);
}

void k_embedding(OpContext& ctx) {
  const Tensor &table = ctx.in[0], &ids = ctx.in[1];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  int64_t row = static_cast<int64_t>(table.itemsize());
  for (int i = 1; i < table.rank(); ++i) row *= table.dim(i);
  KernelScope s(out);
  GatherArgs a;
  a.params = table.raw_data();
  a.indices = ids.raw_data();
  a.idx64 = ids.dtype() == DType::kI64;
  a.out = out.raw_data();
  a.rows = 1;
  a.outer = 1;
  a.n = table.dim(0);
  a.ni = ids.numel();
  a.slice_bytes = row;
  launch_gather(a, s.stream);
}

KILN_REGISTER_KERNEL("softmax", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_softmax<false>);
KILN_REGISTER_KERNEL("log_softmax", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_softmax<true>);
KILN_REGISTER_KERNEL("embedding", kCUDA, KILN_CUDA_ALL_DTYPES, k_embedding);

}  // namespace
}  // namespace kiln::cuda
