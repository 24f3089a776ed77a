#pragma once
// Argument resolution shared by the shape and indexing op definitions (internal).
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/shape.h"

namespace kiln::ops::shape_detail {

// "[1, -1, 3]"
inline std::string ints_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Resolves a reshape target with at most one -1 against `in`.
inline Shape resolve_reshape(const char* op, const Shape& in, const std::vector<int64_t>& dims) {
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (infer_at >= 0)
        throw InvalidArgumentError(
            kiln::detail::str_cat(op, ": at most one dimension may be -1, got ", ints_str(dims)));
      infer_at = static_cast<int>(i);
    } else if (dims[i] < 0) {
      throw InvalidArgumentError(kiln::detail::str_cat(op, ": dimensions must be >= 0 or -1, got ", ints_str(dims)));
    } else {
      known *= dims[i];
    }
  }
  std::vector<int64_t> out = dims;
  if (infer_at >= 0) {
    if (known == 0 || in.numel() % known != 0)
      throw InvalidArgumentError(kiln::detail::str_cat(op, ": cannot reshape ", in.str(), " (", in.numel(),
                                                       " elements) to ", ints_str(dims)));
    out[infer_at] = in.numel() / known;
  } else if (known != in.numel()) {
    throw InvalidArgumentError(kiln::detail::str_cat(op, ": cannot reshape ", in.str(), " (", in.numel(),
                                                     " elements) to ", ints_str(dims), " (", known, " elements)"));
  }
  return Shape(out);
}

// Resolves a permutation (empty: reverse; negative entries count from the end).
inline std::vector<int> resolve_perm(const std::vector<int64_t>& perm, int rank) {
  std::vector<int> p;
  if (perm.empty()) {
    for (int i = rank - 1; i >= 0; --i) p.push_back(i);
    return p;
  }
  if (perm.size() != static_cast<size_t>(rank))
    throw InvalidArgumentError(kiln::detail::str_cat("transpose: perm ", ints_str(perm), " has ", perm.size(),
                                                     " entries but the input has rank ", rank));
  std::vector<bool> seen(rank, false);
  for (int64_t a : perm) {
    int ax = normalize_axis(a, rank, "transpose perm entry");
    if (seen[ax])
      throw InvalidArgumentError(kiln::detail::str_cat("transpose: perm ", ints_str(perm),
                                                       " is not a permutation of 0..", rank - 1, " (axis ", ax,
                                                       " repeats)"));
    seen[ax] = true;
    p.push_back(ax);
  }
  return p;
}

// Python's slice.indices(dim) followed by the element count.
struct ResolvedSlice {
  int64_t start, count;
};
inline ResolvedSlice resolve_python_slice(int64_t begin, int64_t end, int64_t step, int64_t dim) {
  auto adjust = [&](int64_t i) -> int64_t {
    if (i < 0) {
      i = i < -dim ? -1 : i + dim;  // (no overflow for INT64_MIN)
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= dim) {
      i = step < 0 ? dim - 1 : dim;
    }
    return i;
  };
  int64_t b = adjust(begin), e = adjust(end);
  int64_t n = 0;
  if (step > 0 && b < e) n = (e - b - 1) / step + 1;
  if (step < 0 && e < b)  // (-step computed unsigned: no overflow for INT64_MIN)
    n = static_cast<int64_t>(static_cast<uint64_t>(b - e - 1) / (0 - static_cast<uint64_t>(step))) + 1;
  return {b, n};
}

}  // namespace kiln::ops::shape_detail
