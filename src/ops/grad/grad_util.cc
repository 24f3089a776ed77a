#include "grad_util.h"

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

}  // namespace kiln::ops::grad
