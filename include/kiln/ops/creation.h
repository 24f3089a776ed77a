#pragma once
// Tensor creation: constant fills, identity matrices, ranges.
//
// All functions return a new contiguous tensor on the CPU (the *_like functions on
// x's device). Errors (kiln::InvalidArgumentError unless noted):
//   - a negative dimension, or more than Shape::kMaxRank dims (from Shape);
//   - a value that the dtype cannot hold: for integer dtypes the value must be an
//     integer within the dtype's range (NaN, inf, 1.5 or 300 for u8 are errors); for
//     bool any value is accepted (nonzero is true); floating dtypes take any value
//     (rounding, overflow to inf as a cast does);
//   - eye: n < 0 or m < -1; arange: step == 0, non-finite bounds, or a length that
//     does not fit in int64.
#include <cstdint>
#include <optional>

#include "kiln/core/tensor.h"

namespace kiln::ops {

Tensor zeros(const Shape& shape, DType dtype = DType::kF32);
Tensor ones(const Shape& shape, DType dtype = DType::kF32);
Tensor full(const Shape& shape, double value, DType dtype = DType::kF32);

// Same shape (and dtype, unless given) as x, on x's device.
Tensor zeros_like(const Tensor& x, std::optional<DType> dtype = std::nullopt);
Tensor ones_like(const Tensor& x, std::optional<DType> dtype = std::nullopt);
Tensor full_like(const Tensor& x, double value, std::optional<DType> dtype = std::nullopt);

// n x m matrix with ones on the main diagonal; m = -1 means m = n.
Tensor eye(int64_t n, int64_t m = -1, DType dtype = DType::kF32);

// Values start, start + step, ... up to (excluding) stop, as numpy.arange: the length
// is max(0, ceil((stop - start) / step)). Element i is start + i * step computed in
// f64 and converted to dtype (integer dtypes: computed exactly in int64 when start and
// step are integers, else truncated toward zero like a cast).
Tensor arange(double start, double stop, double step = 1, DType dtype = DType::kF32);
// arange(0, stop, 1, dtype).
Tensor arange(double stop, DType dtype = DType::kF32);

}  // namespace kiln::ops
