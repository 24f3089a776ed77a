#pragma once
// Reduction machinery for CPU kernels (internal to the CPU backend).
//
// Every reduction is run on a contiguous (outer O, reduced R, inner I) view of its
// input. `prepare_reduction` finds that view: size-1 dims are dropped and adjacent
// dims that are all reduced (or all kept) are merged; when the reduced axes then form
// one block the input is used in place, otherwise a permuted copy is made that moves
// the reduced blocks next to each other (keeping the innermost block in place, so the
// copy moves contiguous runs).
//
// `reduce_run` evaluates a reduction policy P on that view:
//   I == 1: each output reduces one contiguous row, in kLanes vector lanes over blocks
//           of kBlock elements; each block's lanes fold pairwise into one partial
//           that is flushed into the total (A and Tot may differ, e.g. narrow lanes
//           and a wide total);
//   I > 1:  each output column accumulates four rows at a time in vectors along I,
//           flushing to the total every kFlushRows rows.
// Long reductions are split into fixed-size chunks that run in parallel and whose
// partial totals combine in chunk order, so results do not depend on the thread count.
//
// A policy P provides:
//   types In (input element), A (lane accumulator), Tot (total), Out (output element),
//   C (center); kCentered (load uses a per-output center, e.g. a mean);
//   A identity(); A load(In x, C center); A combine(A, A);
//   Tot tot_identity(); Tot flush(Tot, A); Tot tot_combine(Tot, Tot);
//   Out finalize(Tot total, int64_t count, C center).
// combine must be associative and commutative (lanes and chunks regroup the terms).
// Scratch is std::unique_ptr<T[]> rather than std::vector<T>: T may be bool.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "../common/reduction_plan.h"
#include "kiln/core/parallel.h"

namespace kiln::cpu {

inline constexpr int kLanes = 16;
inline constexpr int64_t kBlock = 2048;        // row elements per lane block (128 per lane)
inline constexpr int64_t kRowChunk = 32768;    // row elements per parallel task (multiple of kBlock)
inline constexpr int64_t kTile = 256;          // inner elements per strided task
inline constexpr int64_t kFlushRows = 256;     // rows accumulated in lanes before a flush
inline constexpr int64_t kTaskElems = 32768;   // input elements per parallel task, roughly

// The (O, R, I) view of a reduction input. `data` points into `x` or into `holder`.
struct ReductionView {
  const void* data = nullptr;
  int64_t outer = 1, reduced = 1, inner = 1;
  Tensor holder;
};

ReductionView prepare_reduction(const Tensor& x, const backends::ReductionAxes& axes);

// ---- engine ------------------------------------------------------------------------

template <class P>
typename P::Tot reduce_contig(const P& p, const typename P::In* x, int64_t n, typename P::C c) {
  using A = typename P::A;
  typename P::Tot t = p.tot_identity();
  if (n < kLanes) {
    A a = p.identity();
    for (int64_t i = 0; i < n; ++i) a = p.combine(a, p.load(x[i], c));
    return p.flush(t, a);
  }
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    A lane[kLanes];
    for (int l = 0; l < kLanes; ++l) lane[l] = p.identity();
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) lane[l] = p.combine(lane[l], p.load(x[i + l], c));
    }
    for (; i < e; ++i) lane[0] = p.combine(lane[0], p.load(x[i], c));
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) lane[l] = p.combine(lane[l], lane[l + w]);
    t = p.flush(t, lane[0]);
  }
  return t;
}

// Accumulates rows [r0, r1) of a strided block into tot[0, w): x points at (o, 0, i0),
// rows are `stride` elements apart, c (centered policies) at the tile's centers.
template <class P>
void reduce_columns(const P& p, const typename P::In* x, int64_t stride, int64_t r0, int64_t r1, int64_t w,
                    const typename P::C* c, typename P::Tot* tot) {
  using A = typename P::A;
  using C = typename P::C;
  auto cen = [](const C* c, int64_t i) -> C {
    if constexpr (P::kCentered) return c[i];
    return C{};
  };
  A acc[kTile];
  for (int64_t rb = r0; rb < r1; rb += kFlushRows) {
    const int64_t re = std::min(r1, rb + kFlushRows);
    for (int64_t i = 0; i < w; ++i) acc[i] = p.identity();
    int64_t r = rb;
    // Four rows per sweep: a quarter of the accumulator traffic.
    for (; r + 4 <= re; r += 4) {
      const typename P::In *x0 = x + r * stride, *x1 = x0 + stride, *x2 = x1 + stride, *x3 = x2 + stride;
#pragma omp simd
      for (int64_t i = 0; i < w; ++i) {
        const C ci = cen(c, i);
        acc[i] = p.combine(acc[i], p.combine(p.combine(p.load(x0[i], ci), p.load(x1[i], ci)),
                                             p.combine(p.load(x2[i], ci), p.load(x3[i], ci))));
      }
    }
    for (; r < re; ++r) {
      const typename P::In* row = x + r * stride;
#pragma omp simd
      for (int64_t i = 0; i < w; ++i) acc[i] = p.combine(acc[i], p.load(row[i], cen(c, i)));
    }
    for (int64_t i = 0; i < w; ++i) tot[i] = p.flush(tot[i], acc[i]);
  }
}

// Reduces the (O, R, I) array x into out[O * I]. `center` (centered policies only) holds
// one C per output.
template <class P>
void reduce_run(const P& p, const typename P::In* x, typename P::Out* out, int64_t O, int64_t R, int64_t I,
                const typename P::C* center = nullptr) {
  using C = typename P::C;
  using Tot = typename P::Tot;
  auto cen = [&](int64_t j) -> C {
    if constexpr (P::kCentered) return center[j];
    return C{};
  };
  const int64_t nout = O * I;
  if (nout == 0) return;
  if (R == 0) {
    for (int64_t j = 0; j < nout; ++j) out[j] = p.finalize(p.tot_identity(), 0, cen(j));
    return;
  }
  if (I == 1) {
    const int64_t NC = (R + kRowChunk - 1) / kRowChunk;
    if (NC == 1) {
      parallel_for(O, std::max<int64_t>(1, kTaskElems / R), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) out[o] = p.finalize(reduce_contig(p, x + o * R, R, cen(o)), R, cen(o));
      });
      return;
    }
    std::unique_ptr<Tot[]> part(new Tot[static_cast<size_t>(O * NC)]);
    parallel_for(O * NC, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / NC, s = (t % NC) * kRowChunk;
        part[t] = reduce_contig(p, x + o * R + s, std::min(kRowChunk, R - s), cen(o));
      }
    });
    parallel_for(O, 64, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        Tot t = part[o * NC];
        for (int64_t k = 1; k < NC; ++k) t = p.tot_combine(t, part[o * NC + k]);
        out[o] = p.finalize(t, R, cen(o));
      }
    });
    return;
  }
  // Strided: tiles of kTile inner elements, chunks of Rc rows.
  const int64_t w = std::min(I, kTile), T = (I + w - 1) / w;
  const int64_t Rc = std::max(kFlushRows, (kTaskElems / w + kFlushRows - 1) / kFlushRows * kFlushRows);
  const int64_t NC = (R + Rc - 1) / Rc;
  auto tile = [&](int64_t o, int64_t tt, int64_t r0, int64_t r1, Tot* tot) {
    const int64_t i0 = tt * w, wn = std::min(w, I - i0);
    for (int64_t i = 0; i < wn; ++i) tot[i] = p.tot_identity();
    const C* c = nullptr;
    if constexpr (P::kCentered) c = center + o * I + i0;
    reduce_columns(p, x + o * R * I + i0, I, r0, r1, wn, c, tot);
    return wn;
  };
  if (NC == 1) {
    parallel_for(O * T, std::max<int64_t>(1, kTaskElems / (R * w)), [&](int64_t b, int64_t e) {
      Tot tot[kTile];
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / T, tt = t % T, base = o * I + tt * w;
        const int64_t wn = tile(o, tt, 0, R, tot);
        for (int64_t i = 0; i < wn; ++i) out[base + i] = p.finalize(tot[i], R, cen(base + i));
      }
    });
    return;
  }
  std::unique_ptr<Tot[]> part(new Tot[static_cast<size_t>(NC * nout)]);
  parallel_for(NC * O * T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t k = t / (O * T), o = (t / T) % O, tt = t % T;
      tile(o, tt, k * Rc, std::min(R, (k + 1) * Rc), part.get() + k * nout + o * I + tt * w);
    }
  });
  parallel_for(nout, kTaskElems / NC + 1, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      Tot t = part[j];
      for (int64_t k = 1; k < NC; ++k) t = p.tot_combine(t, part[k * nout + j]);
      out[j] = p.finalize(t, R, cen(j));
    }
  });
}

}  // namespace kiln::cpu
