#pragma once
// Reductions over axes.
//
// Axis lists: `axes` empty means "reduce every axis" (unlike NumPy's axis=()).
// Negative axes count from the end. A repeated axis throws InvalidArgumentError, an
// axis outside [-rank, rank) throws OutOfRangeError. keepdims=true keeps each reduced
// axis as a dimension of size 1.
//
// Dtype rules (NumPy-like):
//   sum, prod:              bool and integer inputs give i64 (integer overflow wraps);
//                           floating inputs keep their dtype.
//   mean, var, std,
//   logsumexp:              bool and integer inputs give f32; floating keep their dtype.
//   max, min:               any dtype, output keeps it.
//   argmax, argmin:         any dtype, output is i64.
//   all, any:               any dtype (nonzero is true), output is bool.
// Accumulation: floating sums, means, products and variances accumulate in f64 vector
// lanes (f16/bf16 are widened to f32 first, results rounded back), so f32 results are
// within about one ulp even for millions of elements; integers accumulate in 64 bits.
// Results do not depend on the number of threads (long reductions split into
// fixed-size chunks combined in a fixed order).
//
// Zero-size reductions: sum = 0, prod = 1, mean = var = std = NaN, logsumexp = -inf,
// all = true, any = false; max, min, argmax and argmin over an empty reduction throw
// InvalidArgumentError (as NumPy does, even when the output itself is empty).
// NaN propagates through max/min; argmax/argmin treat NaN as the extreme value and
// return the first NaN. Ties return the first occurrence.
#include <cstdint>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::ops {

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor prod(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor min(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);

// Index of the largest (smallest) element along `axis`, as i64.
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims = false);
Tensor argmin(const Tensor& x, int64_t axis, bool keepdims = false);
// Flat index into x (a 0-d i64 tensor), as NumPy's argmax with axis=None.
Tensor argmax(const Tensor& x);
Tensor argmin(const Tensor& x);

// Variance: sum((x - mean)^2) / (N - ddof), computed in two passes. ddof must be >= 0;
// N - ddof <= 0 gives inf or NaN (as NumPy does).
Tensor var(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false, int64_t ddof = 0);
// Standard deviation: sqrt(var(x, axes, keepdims, ddof)).
Tensor std(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false, int64_t ddof = 0);
// log(sum(exp(x))), computed as m + log(sum(exp(x - m))) with m the max, so that it
// neither overflows nor underflows; +inf anywhere gives +inf, all -inf gives -inf.
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);

Tensor all(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor any(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);

}  // namespace kiln::ops
