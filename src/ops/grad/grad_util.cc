#include "grad_util.h"

#include <limits>

#include "../op_util.h"

namespace kiln::ops::grad {

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int gr = g.rank(), r = shape.rank();
  if (r > gr) throw InternalError("sum_to: cannot reduce " + g.desc() + " to " + shape.str());
  std::vector<int64_t> axes;
  for (int i = 0; i < gr; ++i) {
    int j = i - (gr - r);
    if (j < 0 || (shape.dim(j) == 1 && g.dim(i) != 1)) axes.push_back(i);
  }
  Tensor s = axes.empty() ? g : ops::sum(g, axes, /*keepdims=*/true);
  return ops::reshape(s, shape.vec());
}

Tensor expand_reduced(const Tensor& g, const Shape& in, const std::vector<int64_t>& axes, bool keepdims) {
  if (keepdims) return g;
  std::vector<int> ax = detail::normalize_axes(axes, in.rank(), "grad");
  std::vector<int64_t> kept = in.vec();
  for (int a : ax) kept[a] = 1;
  return ops::reshape(g, kept);
}

Tensor iota_like(const Tensor& x) {
  DType t = x.numel() <= std::numeric_limits<int32_t>::max() ? DType::kI32 : DType::kI64;
  return ops::reshape(ops::arange(static_cast<double>(x.numel()), t).to(x.device()), x.shape().vec());
}

Tensor scatter_flat(const Tensor& x, const Tensor& pos, const Tensor& g) {
  Tensor z = ops::zeros_like(x, g.dtype());
  if (g.numel() == 0) return z;
  Tensor flat = ops::scatter_add(ops::reshape(z, {x.numel()}), ops::reshape(pos, {pos.numel()}),
                                 ops::reshape(g, {g.numel()}), 0);
  return ops::reshape(flat, x.shape().vec());
}

}  // namespace kiln::ops::grad
