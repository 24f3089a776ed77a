#pragma once
// Vectorisable loop skeletons for CPU kernels (internal): NumPy-broadcast iteration
// with dimension collapsing, parallelised over the intra-op pool.
#include <algorithm>
#include <cstdint>

#include "kiln/core/parallel.h"
#include "kiln/core/shape.h"

namespace kiln::cpu {

// Elements per parallel task below which splitting costs more than it gains.
inline constexpr int64_t kElementwiseGrain = 32768;

// Output dims plus per-input element strides (0 along broadcast dims), collapsed.
template <int N>
struct BroadcastPlan {
  int rank = 0;
  int64_t dims[Shape::kMaxRank] = {};
  int64_t strides[N][Shape::kMaxRank] = {};
  int64_t total = 1;

  BroadcastPlan(const Shape& out, const Shape* const in[N]) {
    int r = out.rank();
    int64_t tmp[N][Shape::kMaxRank];
    for (int k = 0; k < N; ++k) {
      const Shape& s = *in[k];
      int64_t acc = 1;
      for (int i = r - 1; i >= 0; --i) {
        int j = s.rank() - r + i;
        int64_t d = j >= 0 ? s[j] : 1;
        tmp[k][i] = (d == 1 && out[i] != 1) ? 0 : acc;
        acc *= d;
      }
    }
    // Drop size-1 dims, then merge neighbours that are contiguous for every input.
    rank = 0;
    for (int i = 0; i < r; ++i) {
      if (out[i] == 1) continue;
      bool merge = rank > 0;
      for (int k = 0; k < N && merge; ++k) merge = strides[k][rank - 1] == tmp[k][i] * out[i];
      if (merge) {
        dims[rank - 1] *= out[i];
        for (int k = 0; k < N; ++k) strides[k][rank - 1] = tmp[k][i];
      } else {
        dims[rank] = out[i];
        for (int k = 0; k < N; ++k) strides[k][rank] = tmp[k][i];
        ++rank;
      }
    }
    if (rank == 0) {
      rank = 1;
      dims[0] = 1;
      for (int k = 0; k < N; ++k) strides[k][0] = 1;
    }
    total = out.numel();
  }

  // Calls row(offsets[N], out_offset, n, inner_strides[N]) for each innermost row
  // segment, in parallel.
  template <typename Row>
  void run(Row&& row) const {
    if (total == 0) return;
    const int64_t inner = dims[rank - 1];
    const int64_t rows = total / inner;
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1));
    if (rows == 1) {
      // One long row: split it.
      parallel_for(inner, kElementwiseGrain, [&](int64_t b, int64_t e) {
        int64_t off[N];
        for (int k = 0; k < N; ++k) off[k] = b * strides[k][rank - 1];
        row(off, b, e - b);
      });
      return;
    }
    parallel_for(rows, grain, [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        int64_t off[N] = {};
        int64_t rem = r;
        for (int i = rank - 2; i >= 0; --i) {
          int64_t idx = rem % dims[i];
          rem /= dims[i];
          for (int k = 0; k < N; ++k) off[k] += idx * strides[k][i];
        }
        row(off, r * inner, inner);
      }
    });
  }
  int64_t inner_stride(int k) const { return strides[k][rank - 1]; }
};

}  // namespace kiln::cpu
