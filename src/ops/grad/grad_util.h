#pragma once
// Helpers shared by the vjp definitions (internal to the ops layer).
#include <vector>

#include "kiln/core/op_registry.h"
#include "kiln/ops.h"

namespace kiln::ops::grad {

// Sums a broadcast gradient back down to `shape` (the NumPy broadcasting adjoint).
Tensor sum_to(const Tensor& g, const Shape& shape);

// Re-expands the cotangent of a reduction over `axes` (attr convention: empty = all)
// with or without keepdims to broadcast against the input of shape `in`.
Tensor expand_reduced(const Tensor& g, const Shape& in, const std::vector<int64_t>& axes, bool keepdims);

// The gradient list with only input `i` set.
inline std::vector<Tensor> only(size_t n, size_t i, Tensor g) {
  std::vector<Tensor> r(n);
  r[i] = std::move(g);
  return r;
}

// A scalar of x's dtype.
inline Tensor scalar_like(const Tensor& x, double v) { return ops::scalar(v, x.dtype()); }

}  // namespace kiln::ops::grad
