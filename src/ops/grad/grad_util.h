#pragma once
// Helpers shared by the vjp definitions (internal to the ops layer).
#include <vector>

#include "kiln/ops.h"

namespace kiln::ops::grad {

// Sums a broadcast gradient back down to `shape` (the NumPy broadcasting adjoint).
Tensor sum_to(const Tensor& g, const Shape& shape);

// Re-expands the cotangent of a reduction over `axes` (attr convention: empty = all)
// with or without keepdims to broadcast against the input of shape `in`.
Tensor expand_reduced(const Tensor& g, const Shape& in, const std::vector<int64_t>& axes, bool keepdims);

// x.shape filled with 0, 1, ..., numel-1 (integer positions, never differentiated):
// running an indexing op on it tells which input position each output element read.
Tensor iota_like(const Tensor& x);
// Zeros shaped like x with g[i] added at flat position pos[i] (repeats accumulate).
Tensor scatter_flat(const Tensor& x, const Tensor& pos, const Tensor& g);

// The gradient list with only input `i` set.
inline std::vector<Tensor> only(size_t n, size_t i, Tensor g) {
  std::vector<Tensor> r(n);
  r[i] = std::move(g);
  return r;
}

// A scalar of x's dtype.
inline Tensor scalar_like(const Tensor& x, double v) { return ops::scalar(v, x.dtype()); }

}  // namespace kiln::ops::grad
