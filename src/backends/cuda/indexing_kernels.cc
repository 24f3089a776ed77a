// Indexing ops on CUDA: gather, gather_nd (byte moves, all dtypes), scatter_add
// (atomics; f16/bf16 accumulate in f32 as on the CPU), one_hot, top_k (kernels:
// indexing_kernels.cu).
//
// Out-of-range indices are not errors here (the CPU throws OutOfRangeError): checking
// them would need a host sync, so gather / gather_nd write zeros for them and
// scatter_add skips them, as TensorFlow's GPU kernels do (indexing_launch.h).
#include <string>
#include <vector>

#include "cast_launch.h"
#include "indexing_launch.h"
#include "kernel_util.h"
#include "shape_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

int64_t prod(const Shape& s, int b, int e) {
  int64_t n = 1;
  for (int i = b; i < e; ++i) n *= s[i];
  return n;
}

bool is_i64(const Tensor& t) { return t.dtype() == DType::kI64; }

void k_gather(OpContext& ctx) {
  const Tensor &P = ctx.in[0], &I = ctx.in[1];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  const int64_t bd = [&] {
    const int64_t b = ctx.attrs.get_int("batch_dims", 0);
    return b < 0 ? b + I.rank() : b;
  }();
  const int axis = normalize_axis(ctx.attrs.get_int("axis", 0), P.rank());
  KernelScope s(out);
  GatherArgs a;
  a.params = P.raw_data();
  a.indices = I.raw_data();
  a.idx64 = is_i64(I);
  a.out = out.raw_data();
  a.outer = prod(P.shape(), static_cast<int>(bd), axis);
  a.rows = prod(P.shape(), 0, static_cast<int>(bd)) * a.outer;
  a.n = P.dim(axis);
  a.ni = prod(I.shape(), static_cast<int>(bd), I.rank());
  a.slice_bytes = prod(P.shape(), axis + 1, P.rank()) * static_cast<int64_t>(P.itemsize());
  launch_gather(a, s.stream);
}

void k_gather_nd(OpContext& ctx) {
  const Tensor &P = ctx.in[0], &I = ctx.in[1];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  GatherNdArgs a;
  a.params = P.raw_data();
  a.indices = I.raw_data();
  a.idx64 = is_i64(I);
  a.out = out.raw_data();
  a.k = static_cast<int>(I.dim(-1));
  a.tuples = prod(I.shape(), 0, I.rank() - 1);
  a.slice_bytes = prod(P.shape(), a.k, P.rank()) * static_cast<int64_t>(P.itemsize());
  int64_t acc = 1;  // slices
  for (int j = a.k - 1; j >= 0; --j) {
    a.dims[j] = P.dim(j);
    a.strides[j] = acc;
    acc *= P.dim(j);
  }
  launch_gather_nd(a, s.stream);
}

void k_scatter_add(OpContext& ctx) {
  const Tensor &X = ctx.in[0], &I = ctx.in[1], &U = ctx.in[2];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const int axis = normalize_axis(ctx.attrs.get_int("axis", 0), X.rank());
  const int64_t outer = prod(X.shape(), 0, axis), n = X.dim(axis), inner = prod(X.shape(), axis + 1, X.rank());
  const int64_t ni = I.numel();
  const DType dt = X.dtype();
  if (dt == DType::kF16 || dt == DType::kBF16) {
    // Accumulate in f32 (as the CPU's via_f32), then round once.
    Tensor acc = Tensor::empty(X.shape(), DType::kF32, out.device());
    launch_cast(X.raw_data(), dt, acc.raw_data(), DType::kF32, X.numel(), s.stream);
    launch_scatter_add(acc.raw_data(), DType::kF32, U.raw_data(), dt, I.raw_data(), is_i64(I), outer, n, ni, inner,
                       s.stream);
    launch_cast(acc.raw_data(), DType::kF32, out.raw_data(), dt, out.numel(), s.stream);
    return;
  }
  launch_copy_bytes(out.raw_data(), X.raw_data(), static_cast<int64_t>(X.nbytes()), s.stream);
  launch_scatter_add(out.raw_data(), dt, U.raw_data(), dt, I.raw_data(), is_i64(I), outer, n, ni, inner, s.stream);
}

void k_index_copy(OpContext& ctx) {
  const Tensor &X = ctx.in[0], &I = ctx.in[1], &R = ctx.in[2];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  if (out.raw_data() != X.raw_data()) launch_copy_bytes(out.raw_data(), X.raw_data(), static_cast<int64_t>(X.nbytes()), s.stream);
  launch_index_copy(out.raw_data(), R.raw_data(), I.raw_data(), is_i64(I), X.dim(0), I.numel(),
                    static_cast<int64_t>(X.nbytes()) / X.dim(0), s.stream);
}

void k_one_hot(OpContext& ctx) {
  const Tensor& I = ctx.in[0];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  const int64_t depth = ctx.attrs.get_int("depth");
  const int64_t axis_attr = ctx.attrs.get_int("axis", -1);
  const int axis = axis_attr == -1 ? I.rank() : normalize_axis(axis_attr, I.rank() + 1);
  const int64_t outer = prod(I.shape(), 0, axis), inner = prod(I.shape(), axis, I.rank());
  const double vals[2] = {ctx.attrs.get_float("off_value", 0.0), ctx.attrs.get_float("on_value", 1.0)};
  unsigned char pattern[2][8] = {};
  for (int v = 0; v < 2; ++v) convert_buffer(&vals[v], DType::kF64, pattern[v], out.dtype(), 1);
  KernelScope s(out);
  launch_one_hot(I.raw_data(), is_i64(I), out.raw_data(), static_cast<int64_t>(out.itemsize()), outer, depth, inner,
                 pattern[1], pattern[0], s.stream);
}

void k_top_k(OpContext& ctx) {
  const Tensor& X = ctx.in[0];
  Tensor &V = ctx.out[0], &Ix = ctx.out[1];
  if (V.numel() == 0) return;
  const int64_t n = X.dim(-1), k = V.dim(-1);
  const bool sorted = ctx.attrs.get_bool("sorted", true);
  if (n > (int64_t{1} << 31) - 1 - 1024)  // int loops over a row step by up to 1024 threads
    throw UnimplementedError("top_k on CUDA: rows of at most 2^31 - 1025 elements, got " + std::to_string(n));
  if (sorted && k > top_k_max_sorted())
    throw UnimplementedError("top_k on CUDA: sorted output for k <= " + std::to_string(top_k_max_sorted()) +
                             ", got k = " + std::to_string(k) + " (sorted=false has no limit)");
  KernelScope s(V);
  launch_top_k(X.raw_data(), X.dtype(), V.raw_data(), static_cast<int64_t*>(Ix.raw_data()), X.numel() / n, n, k, sorted,
               s.stream);
}

KILN_REGISTER_KERNEL("gather", kCUDA, KILN_CUDA_ALL_DTYPES, k_gather);
KILN_REGISTER_KERNEL("gather_nd", kCUDA, KILN_CUDA_ALL_DTYPES, k_gather_nd);
KILN_REGISTER_KERNEL("scatter_add", kCUDA,
                     (std::initializer_list<DType>{DType::kU8, DType::kI8, DType::kI32, DType::kI64, DType::kF16,
                                                   DType::kBF16, DType::kF32, DType::kF64}),
                     k_scatter_add);
KILN_REGISTER_KERNEL("index_copy", kCUDA, KILN_CUDA_ALL_DTYPES, k_index_copy);
KILN_REGISTER_KERNEL("one_hot", kCUDA, (std::initializer_list<DType>{DType::kI32, DType::kI64}), k_one_hot);
KILN_REGISTER_KERNEL("top_k", kCUDA,
                     (std::initializer_list<DType>{DType::kU8, DType::kI8, DType::kI32, DType::kI64, DType::kF16,
                                                   DType::kBF16, DType::kF32, DType::kF64}),
                     k_top_k);

}  // namespace
}  // namespace kiln::cuda
