#pragma once
// How every backend lays out a reduction (internal, header-only): the input viewed as
// (outer, reduced, inner) after dropping size-1 dims and merging neighbours that are
// both reduced or both kept. When the reduced axes form several blocks, the backend
// first permutes the collapsed dims (`dims`, `perm`) so that they become one block.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/core/attrs.h"
#include "kiln/core/error.h"
#include "kiln/core/shape.h"

namespace kiln::backends {

// The "axes" attribute normalised and sorted (empty = all; negative from the end), held
// inline (no allocation per call). The op's infer function has already validated it.
struct ReductionAxes {
  int v[Shape::kMaxRank] = {};
  int n = 0;
  size_t size() const { return static_cast<size_t>(n); }
  int operator[](size_t i) const { return v[i]; }
  void push_back(int a) {
    if (n == Shape::kMaxRank) throw InvalidArgumentError("reduction: more axes than dims");
    v[n++] = a;
  }
};

inline ReductionAxes reduction_axes(const Attrs& attrs, int rank) {
  const std::vector<int64_t>& given = attrs.get_ints_or_empty("axes");  // empty: every dim
  ReductionAxes axes;
  if (given.empty()) {
    for (int i = 0; i < rank; ++i) axes.push_back(i);
    return axes;
  }
  for (int64_t a : given) axes.push_back(normalize_axis(a, rank, "reduction axis"));
  std::sort(axes.v, axes.v + axes.n);
  return axes;
}

struct ReductionPlan {
  int64_t outer = 1, reduced = 1, inner = 1;
  bool permute = false;  // copy the input permuted by `perm` over the collapsed `dims` first
  int n = 0;             // collapsed rank
  int64_t dims[Shape::kMaxRank] = {};
  int perm[Shape::kMaxRank] = {};
};

// `axes`: sorted, unique, non-negative.
inline ReductionPlan plan_reduction(const Shape& s, const ReductionAxes& axes) {
  ReductionPlan p;
  bool red[Shape::kMaxRank];
  int n = 0;
  int64_t O = 1, R = 1;
  size_t k = 0;
  for (int i = 0; i < s.rank(); ++i) {
    const bool r = k < axes.size() && axes[k] == i;
    if (r) ++k;
    (r ? R : O) *= s[i];
    if (s[i] == 1) continue;
    if (n > 0 && red[n - 1] == r) {
      p.dims[n - 1] *= s[i];
    } else {
      p.dims[n] = s[i];
      red[n] = r;
      ++n;
    }
  }
  p.n = n;
  if (s.numel() == 0) {  // nothing to read: outputs are empty or reduce nothing
    p.outer = O;
    p.reduced = R;
    return p;
  }
  int nred = 0;
  for (int i = 0; i < n; ++i) nred += red[i];
  if (nred <= 1) {
    int i = 0;
    for (; i < n && !red[i]; ++i) p.outer *= p.dims[i];
    if (i < n) p.reduced = p.dims[i++];
    for (; i < n; ++i) p.inner *= p.dims[i];
    if (nred == 0) {  // reducing size-1 axes only: every element is its own output
      p.outer = s.numel();
      p.inner = 1;
    }
    return p;
  }
  // Several reduced blocks: kept blocks go first when the last block is reduced,
  // otherwise reduced ones do (the innermost block keeps its place).
  p.permute = true;
  int m = 0;
  const bool last_reduced = red[n - 1];
  for (int pass = 0; pass < 2; ++pass) {
    const bool want_reduced = last_reduced ? pass == 1 : pass == 0;
    for (int i = 0; i < n; ++i)
      if (red[i] == want_reduced) p.perm[m++] = i;
  }
  if (last_reduced) {
    p.outer = O;
    p.reduced = R;
  } else {
    p.reduced = R;
    p.inner = O;
  }
  return p;
}

}  // namespace kiln::backends
