// Shape ops on CUDA: reshape (graph copy), transpose, concat, stack, split,
// strided_slice, pad, tile, broadcast_to. All move bytes (shape_kernels.cu) and are
// registered for every dtype. Shapes and attrs are resolved here; the launchers
// simplify dimensions and pick word sizes.
#include <string>
#include <vector>

#include "../common/axis_view.h"
#include "kernel_util.h"
#include "shape_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

char* out_ptr(const Tensor& t) { return static_cast<char*>(t.raw_data()); }
const char* in_ptr(const Tensor& t) { return static_cast<const char*>(t.raw_data()); }

// Row-major element strides of `s`.
std::vector<int64_t> elem_strides(const Shape& s) {
  std::vector<int64_t> st(static_cast<size_t>(s.rank()));
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

int64_t itemsize_of(const Tensor& t) { return static_cast<int64_t>(t.itemsize()); }

void k_reshape(OpContext& ctx) {
  KernelScope s(ctx.out[0]);
  launch_copy_bytes(ctx.out[0].raw_data(), ctx.in[0].raw_data(), static_cast<int64_t>(ctx.in[0].nbytes()), s.stream);
}

void k_transpose(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  if (x.numel() == 0) return;
  KernelScope s(ctx.out[0]);
  const int r = x.rank();
  std::vector<int64_t> perm = ctx.attrs.get_ints("perm", {});
  if (perm.empty())
    for (int i = r - 1; i >= 0; --i) perm.push_back(i);
  for (int64_t& p : perm)
    if (p < 0) p += r;
  launch_permute(x.raw_data(), ctx.out[0].raw_data(), itemsize_of(x), r, x.shape().begin(), perm.data(), s.stream);
}

using backends::outer_size;

// concat and stack: output rows before `axis` interleave whole input rows.
void k_concat(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  const int axis = normalize_axis(ctx.attrs.get_int("axis"), out.rank());
  const int64_t outer = outer_size(out.shape(), axis);
  if (outer == 0 || out.numel() == 0) return;
  KernelScope s(out);
  const int64_t joined_row = static_cast<int64_t>(out.nbytes()) / outer;
  std::vector<CopyPart> parts;
  int64_t off = 0;
  for (const Tensor& t : ctx.in) {
    const int64_t row = static_cast<int64_t>(t.nbytes()) / outer;
    if (row > 0) parts.push_back(CopyPart{t.raw_data(), out_ptr(out) + off, outer, row, row, joined_row});
    off += row;
  }
  launch_copy_parts(parts.data(), static_cast<int>(parts.size()), s.stream);
}

void k_split(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  const int axis = normalize_axis(ctx.attrs.get_int("axis"), x.rank());
  const int64_t outer = outer_size(x.shape(), axis);
  if (outer == 0 || x.numel() == 0) return;
  KernelScope s(x);
  const int64_t joined_row = static_cast<int64_t>(x.nbytes()) / outer;
  std::vector<CopyPart> parts;
  int64_t off = 0;
  for (const Tensor& t : ctx.out) {
    const int64_t row = static_cast<int64_t>(t.nbytes()) / outer;
    if (row > 0) parts.push_back(CopyPart{in_ptr(x) + off, t.raw_data(), outer, row, joined_row, row});
    off += row;
  }
  launch_copy_parts(parts.data(), static_cast<int>(parts.size()), s.stream);
}

void k_strided_slice(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const auto &begin = ctx.attrs.get_ints("begin"), &steps = ctx.attrs.get_ints("strides");
  const std::vector<int64_t> st = elem_strides(x.shape());
  std::vector<int64_t> strides(static_cast<size_t>(x.rank()));
  int64_t base = 0;
  for (int d = 0; d < x.rank(); ++d) {
    base += begin[d] * st[d];
    strides[d] = steps[d] * st[d];
  }
  launch_strided_copy(x.raw_data(), out.raw_data(), itemsize_of(x), out.rank(), out.shape().begin(), strides.data(),
                      base, s.stream);
}

void k_pad(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const auto& p = ctx.attrs.get_ints("paddings");
  const std::string& mode_name = ctx.attrs.get_string("mode");
  const int mode = mode_name == "constant" ? kPadConstant : mode_name == "edge" ? kPadEdge : kPadReflect;
  std::vector<int64_t> lo(static_cast<size_t>(x.rank()));
  for (int d = 0; d < x.rank(); ++d) lo[d] = p[2 * d];
  unsigned char fill[8] = {};
  if (mode == kPadConstant) {
    const double v = ctx.attrs.get_float("value", 0.0);
    convert_buffer(&v, DType::kF64, fill, x.dtype(), 1);
  }
  launch_pad(x.raw_data(), out.raw_data(), itemsize_of(x), x.rank(), x.shape().begin(), lo.data(), out.shape().begin(),
             mode, fill, s.stream);
}

// out dim d (size s[d] * reps[d]) as two dims (reps[d], s[d]) with input strides (0, stride[d]).
void k_tile(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const Shape& sh = x.shape();
  const std::vector<int64_t> st = elem_strides(sh);
  std::vector<int64_t> sizes, strides;
  for (int d = 0; d < sh.rank(); ++d) {
    sizes.push_back(out.dim(d) / sh[d]);
    strides.push_back(0);
    sizes.push_back(sh[d]);
    strides.push_back(st[d]);
  }
  launch_strided_copy(x.raw_data(), out.raw_data(), itemsize_of(x), static_cast<int>(sizes.size()), sizes.data(),
                      strides.data(), 0, s.stream);
}

void k_broadcast_to(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const Shape& sh = x.shape();
  const int lead = out.rank() - sh.rank();
  const std::vector<int64_t> st = elem_strides(sh);
  std::vector<int64_t> strides(static_cast<size_t>(out.rank()), 0);
  for (int d = lead; d < out.rank(); ++d)
    if (sh[d - lead] != 1) strides[d] = st[d - lead];
  launch_strided_copy(x.raw_data(), out.raw_data(), itemsize_of(x), out.rank(), out.shape().begin(), strides.data(), 0,
                      s.stream);
}

KILN_REGISTER_KERNEL("reshape", kCUDA, KILN_CUDA_ALL_DTYPES, k_reshape);
KILN_REGISTER_KERNEL("transpose", kCUDA, KILN_CUDA_ALL_DTYPES, k_transpose);
KILN_REGISTER_KERNEL("concat", kCUDA, KILN_CUDA_ALL_DTYPES, k_concat);
KILN_REGISTER_KERNEL("stack", kCUDA, KILN_CUDA_ALL_DTYPES, k_concat);
KILN_REGISTER_KERNEL("split", kCUDA, KILN_CUDA_ALL_DTYPES, k_split);
KILN_REGISTER_KERNEL("strided_slice", kCUDA, KILN_CUDA_ALL_DTYPES, k_strided_slice);
KILN_REGISTER_KERNEL("pad", kCUDA, KILN_CUDA_ALL_DTYPES, k_pad);
KILN_REGISTER_KERNEL("tile", kCUDA, KILN_CUDA_ALL_DTYPES, k_tile);
KILN_REGISTER_KERNEL("broadcast_to", kCUDA, KILN_CUDA_ALL_DTYPES, k_broadcast_to);

}  // namespace
}  // namespace kiln::cuda
