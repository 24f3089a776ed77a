// Reductions on CUDA: sum, mean, prod, max, min, all, any, var, std, logsumexp over
// "axes", argmax/argmin along "axis" (kernels: reduce_kernels.cu).
//
// As on the CPU, every reduction runs on a contiguous (outer, reduced, inner) view:
// size-1 dims are dropped and neighbours that are all reduced (or all kept) merged;
// when the reduced dims then form several blocks, a permuted copy on the device moves
// them next to each other (shape_launch.h). var/std and logsumexp take two passes: a
// center per output (the f64 mean; the max), then the centered accumulation.
#include <algorithm>
#include <vector>

#include "../common/reduction_plan.h"
#include "kernel_util.h"
#include "reduce_launch.h"
#include "shape_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

// The (O, R, I) view of x; `holder` keeps a permuted copy alive.
struct View {
  const void* data = nullptr;
  int64_t outer = 1, reduced = 1, inner = 1;
  Tensor holder;
};

View prepare(const Tensor& x, const backends::ReductionAxes& axes, cudaStream_t stream) {
  const backends::ReductionPlan p = backends::plan_reduction(x.shape(), axes);
  View v;
  v.data = x.raw_data();
  v.outer = p.outer;
  v.reduced = p.reduced;
  v.inner = p.inner;
  if (p.permute) {  // several reduced blocks: permute them together on the device
    int64_t perm[Shape::kMaxRank];
    for (int i = 0; i < p.n; ++i) perm[i] = p.perm[i];
    v.holder = Tensor::empty(x.shape(), x.dtype(), x.device());
    launch_permute(x.raw_data(), v.holder.raw_data(), static_cast<int64_t>(x.itemsize()), p.n, p.dims, perm, stream);
    v.data = v.holder.raw_data();
  }
  return v;
}

void run(KernelScope& s, const ReduceArgs& a) {
  const int sms = s.ctx.props.multiProcessorCount;
  const int64_t bytes = reduce_scratch_bytes(a, sms);
  void* scratch = bytes > 0 ? workspace(s.ctx, static_cast<size_t>(bytes)) : nullptr;
  launch_reduce(a, scratch, sms, s.stream);
}

template <int Op>
void k_reduce(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  View v = prepare(x, backends::reduction_axes(ctx.attrs, x.rank()), s.stream);
  ReduceArgs a;
  a.x = v.data;
  a.dtype = x.dtype();
  a.out = out.raw_data();
  a.outer = v.outer;
  a.reduced = v.reduced;
  a.inner = v.inner;
  a.op = Op;
  const int64_t nout = v.outer * v.inner;
  Tensor center;
  if constexpr (Op == kReduceVar || Op == kReduceStd || Op == kReduceLogsumexp) {
    constexpr bool kLse = Op == kReduceLogsumexp;
    if (Op != kReduceLogsumexp) a.ddof = ctx.attrs.get_int("ddof", 0);
    if (v.reduced > 0) {
      center = Tensor::empty(Shape{nout}, kLse ? x.dtype() : DType::kF64, out.device());
      ReduceArgs c = a;
      c.op = kLse ? kReduceMax : kReduceMeanF64;
      c.out = center.raw_data();
      run(s, c);
      a.center = center.raw_data();
    }
  }
  run(s, a);
}

template <int Op>
void k_arg(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& out = ctx.out[0];
  const int axis = normalize_axis(ctx.attrs.get_int("axis"), x.rank(), "axis");
  ReduceArgs a;
  for (int i = 0; i < axis; ++i) a.outer *= x.dim(i);
  for (int i = axis + 1; i < x.rank(); ++i) a.inner *= x.dim(i);
  a.reduced = x.dim(axis);
  if (out.numel() == 0 || a.outer * a.inner == 0) return;  // the op rejects an empty axis
  KernelScope s(out);
  a.x = x.raw_data();
  a.dtype = x.dtype();
  a.out = out.raw_data();
  a.op = Op;
  run(s, a);
}

KILN_REGISTER_KERNEL("sum", kCUDA, KILN_CUDA_ALL_DTYPES, k_reduce<kReduceSum>);
KILN_REGISTER_KERNEL("mean", kCUDA, KILN_CUDA_ALL_DTYPES, k_reduce<kReduceMean>);
KILN_REGISTER_KERNEL("prod", kCUDA, KILN_CUDA_ALL_DTYPES, k_reduce<kReduceProd>);
KILN_REGISTER_KERNEL("max", kCUDA, KILN_CUDA_ALL_DTYPES, k_reduce<kReduceMax>);
KILN_REGISTER_KERNEL("min", kCUDA, KILN_CUDA_ALL_DTYPES, k_reduce<kReduceMin>);
KILN_REGISTER_KERNEL("all", kCUDA, KILN_CUDA_ALL_DTYPES, k_reduce<kReduceAll>);
KILN_REGISTER_KERNEL("any", kCUDA, KILN_CUDA_ALL_DTYPES, k_reduce<kReduceAny>);
KILN_REGISTER_KERNEL("var", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_reduce<kReduceVar>);
KILN_REGISTER_KERNEL("std", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_reduce<kReduceStd>);
KILN_REGISTER_KERNEL("logsumexp", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_reduce<kReduceLogsumexp>);
KILN_REGISTER_KERNEL("argmax", kCUDA, KILN_CUDA_ALL_DTYPES, k_arg<kReduceArgmax>);
KILN_REGISTER_KERNEL("argmin", kCUDA, KILN_CUDA_ALL_DTYPES, k_arg<kReduceArgmin>);

}  // namespace
}  // namespace kiln::cuda
