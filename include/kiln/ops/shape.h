#pragma once
// Shape and indexing ops: reshape, transpose, expand_dims, squeeze, concat, stack,
// split, slice, strided_slice, pad, tile, broadcast_to, gather, gather_nd,
// scatter_add, one_hot, top_k.
//
// Common rules:
//   * These ops only move bytes, so they work for every dtype (bool u8 i8 i32 i64
//     f16 bf16 f32 f64) and give their input's dtype, except where noted
//     (scatter_add: numeric dtypes; top_k: not bool; one_hot: the `dtype` argument).
//   * Axes may be negative (counted from the end, Python style); an axis outside
//     [-rank, rank) throws OutOfRangeError.
//   * Wrong ranks, shapes, lengths of per-dimension lists, and malformed arguments
//     throw InvalidArgumentError; indices or bounds outside a dimension throw
//     OutOfRangeError. Every message says what was expected and what came.
//   * Results are fresh dense tensors, except reshape / expand_dims / squeeze, which
//     share the input's buffer.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::ops {

// ---- views and permutations ------------------------------------------------------

// The same elements with a new shape, sharing x's buffer (no copy). At most one entry
// may be -1; it is inferred from the others. Errors: two -1s, another negative entry,
// or an element count that does not match x's (InvalidArgumentError).
Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape);

// Permutes dimensions: out.shape[i] = x.shape[perm[i]]. An empty perm reverses the
// dimensions (a matrix transpose for rank 2). perm entries may be negative.
// Errors: perm not a permutation of 0..rank-1 (wrong length or repeated axis:
// InvalidArgumentError; axis out of range: OutOfRangeError).
Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm = {});

// Inserts a size-1 dimension at `axis`, in [-rank-1, rank] (-1 appends). Shares the buffer.
Tensor expand_dims(const Tensor& x, int64_t axis);

// Removes the listed size-1 dimensions, or every size-1 dimension when `axes` is empty.
// Shares the buffer. Errors: a listed dimension whose size is not 1 (InvalidArgumentError),
// an axis out of range (OutOfRangeError), a repeated axis (InvalidArgumentError).
Tensor squeeze(const Tensor& x, const std::vector<int64_t>& axes = {});

// ---- joining and splitting ---------------------------------------------------------

// Joins tensors along an existing axis. Inputs of different dtypes are promoted to a
// common dtype with kiln::promote_types (as NumPy's concatenate does) before joining.
// Errors: no inputs, a rank-0 input, different ranks, or sizes that differ on an axis
// other than `axis` (InvalidArgumentError).
Tensor concat(const std::vector<Tensor>& xs, int64_t axis = 0);

// Joins equally-shaped tensors along a new axis, in [-rank-1, rank]. Dtypes are
// promoted as in concat. Errors: no inputs or different shapes (InvalidArgumentError).
Tensor stack(const std::vector<Tensor>& xs, int64_t axis = 0);

// Splits x into `num` equal parts along `axis`. Errors: num <= 0, or a dimension not
// divisible by num (InvalidArgumentError). Note: split(x, {3}) picks this overload
// (num = 3); pass std::vector<int64_t>{3} for one part of size 3.
std::vector<Tensor> split(const Tensor& x, int64_t num, int64_t axis = 0);
// Splits x into parts of the given sizes along `axis`; one size may be -1 (the rest).
// Errors: sizes that do not add up to the dimension, negative sizes other than one
// -1, or an empty list (InvalidArgumentError).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis = 0);

// ---- slicing and padding -----------------------------------------------------------

// The block x[begin[0] : begin[0]+size[0], ...]. begin and size have one entry per
// dimension; size -1 means "to the end". No clamping (TensorFlow semantics).
// Errors: list lengths != rank (InvalidArgumentError); begin outside [0, dim] or a
// size that runs past the end or is < -1 (OutOfRangeError).
Tensor slice(const Tensor& x, const std::vector<int64_t>& begin, const std::vector<int64_t>& size);

// Sentinels for strided_slice bounds meaning "from the very start / to the very end"
// whatever the stride's sign: like an omitted Python bound, they are clamped.
inline constexpr int64_t kSliceMin = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kSliceMax = std::numeric_limits<int64_t>::max();

// x[begin[0]:end[0]:strides[0], ...] with Python slicing semantics per dimension:
// negative begin/end count from the end (i + dim); then bounds are clamped to
// [0, dim] for a positive stride and to [-1, dim-1] for a negative one, so
// out-of-range bounds never error and an empty range gives a size-0 dimension.
// For "omitted" bounds pass kSliceMin / kSliceMax, e.g. x[::-1] is
// strided_slice(x, {kSliceMax}, {kSliceMin}, {-1}). The lists may be shorter than
// the rank (the remaining dimensions are taken whole); strides may be empty (all 1).
// Errors: begin/end/strides of different lengths or longer than the rank, or a zero
// stride (InvalidArgumentError).
Tensor strided_slice(const Tensor& x, const std::vector<int64_t>& begin, const std::vector<int64_t>& end,
                     const std::vector<int64_t>& strides = {});

// Pads each dimension i with paddings[i].first elements before and .second after.
// mode "constant": the new elements are `value` (converted to x's dtype as cast does);
// "reflect": mirror without repeating the edge (NumPy 'reflect', TF 'REFLECT'; needs
// each padding <= dim - 1); "edge": repeat the edge element (NumPy 'edge'; needs
// dim > 0 where a padding is nonzero). Errors: paddings.size() != rank, a negative
// padding, an unknown mode, or a padding too large for reflect/edge (InvalidArgumentError).
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& paddings,
           const std::string& mode = "constant", double value = 0);

// Repeats x reps[i] times along dimension i (NumPy tile: a shorter reps is padded
// with leading 1s, a longer one gives x leading size-1 dimensions).
// Errors: a negative rep (InvalidArgumentError).
Tensor tile(const Tensor& x, const std::vector<int64_t>& reps);

// Broadcasts x to `shape` with NumPy rules (x's dimensions align right; each is 1 or
// equal to the target). Errors: incompatible shapes or a target of lower rank
// (InvalidArgumentError).
Tensor broadcast_to(const Tensor& x, const std::vector<int64_t>& shape);

// ---- indexing ----------------------------------------------------------------------

// Gathers slices of params along `axis` (TensorFlow gather):
//   out[b.., o.., i.., r..] = params[b.., o.., indices[b.., i..], r..]
// where b.. are the first batch_dims dimensions (shared by params and indices), o.. the
// dimensions of params before axis, i.. the remaining dimensions of indices and r.. the
// dimensions of params after axis. out.shape = params.shape[:axis] +
// indices.shape[batch_dims:] + params.shape[axis+1:]. indices are i32 or i64 (u8/i8 are
// widened). batch_dims may be negative (counted from indices' rank); axis must be
// >= batch_dims. Errors: an index < 0 or >= params.shape[axis] (OutOfRangeError naming
// the index, its position and the bound; negative indices are errors, as on TF CPU);
// float/bool indices, mismatched batch dimensions, axis < batch_dims (InvalidArgumentError).
Tensor gather(const Tensor& params, const Tensor& indices, int64_t axis = 0, int64_t batch_dims = 0);

// Gathers slices of params addressed by the last dimension of indices (TensorFlow
// gather_nd, batch_dims = 0): with K = indices.shape[-1] <= params.rank,
//   out[i..] = params[indices[i.., 0], ..., indices[i.., K-1], ...]
// out.shape = indices.shape[:-1] + params.shape[K:]. indices are integer (i32/i64) with
// rank >= 1. Errors: an index outside its dimension (OutOfRangeError), K > params.rank or
// a rank-0 indices (InvalidArgumentError).
Tensor gather_nd(const Tensor& params, const Tensor& indices);

// out = a copy of x with updates added at the gathered positions:
//   out[o.., indices[i..], r..] += updates[o.., i.., r..]
// i.e. exactly the transpose (vjp) of gather(x, indices, axis): updates.shape must be
// gather(x, indices, axis).shape, and duplicate indices accumulate (in index order,
// so the result is deterministic; f16/bf16 accumulate in f32). updates is cast to x's
// dtype. Numeric dtypes only. Errors: bool x, wrong updates shape, non-integer indices
// (InvalidArgumentError); an index outside [0, x.shape[axis]) (OutOfRangeError).
Tensor scatter_add(const Tensor& x, const Tensor& indices, const Tensor& updates, int64_t axis = 0);

// x with rows replaced: out[indices[i], ...] = rows[i, ...] (rows along axis 0; PyTorch's
// index_copy, TF's tensor_scatter_nd_update with one index per row). x [N, ...] of any
// dtype; indices i32/i64 [K]; rows [K, ...] of x's dtype. A repeated index: the last row
// wins on the CPU, one of them on CUDA. in_place: the rows are written into x's own
// buffer and the result is x (for a caller that owns x and gives up its old value, as a
// KV cache's pool; ignored, a copy made, while an op observer such as a gradient tape or
// a trace watches). Differentiable in x and rows. Errors: shapes, dtypes
// (InvalidArgumentError); an index outside [0, N) (OutOfRangeError on the CPU; on CUDA
// such a row is skipped, as scatter_add does there).
Tensor index_copy(const Tensor& x, const Tensor& indices, const Tensor& rows, bool in_place = false);

// One-hot encoding (TensorFlow one_hot): out has indices' shape with a new dimension of
// size depth at `axis` (-1 appends; otherwise in [-rank-1, rank], counted in the output's
// rank); out[..., d, ...] = on_value where indices[...] == d, else off_value, in `dtype`
// (values converted as cast does). Indices outside [0, depth) (including negative ones)
// give rows that are all off_value. Indices of any integer dtype are accepted.
// Errors: non-integer indices or a negative depth (InvalidArgumentError); axis out of
// range (OutOfRangeError).
Tensor one_hot(const Tensor& indices, int64_t depth, double on_value = 1, double off_value = 0,
               DType dtype = DType::kF32, int64_t axis = -1);

struct TopK {
  Tensor values;   // x's dtype, shape x.shape[:-1] + [k]
  Tensor indices;  // i64, positions along the last axis
};
// The k largest entries along the last axis of x, and their positions. Order: with
// sorted = true, descending by value; with sorted = false, in ascending position order
// (the same set of entries). Ties keep the lower index first. NaN ranks above every
// number (+inf included), so NaNs are selected first, lower index first among NaNs
// (like torch.topk; NumPy's sort also treats NaN as the largest). Errors: rank-0 or
// bool x, k < 0 or k > x.shape[-1] (InvalidArgumentError).
TopK top_k(const Tensor& x, int64_t k, bool sorted = true);

}  // namespace kiln::ops
