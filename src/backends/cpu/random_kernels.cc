// CPU kernels for random ops: uniform, normal, truncated normal, bernoulli.
//
// Counter layout. Block b is Philox4x32-10 (kiln::Philox; inlined here so that batches
// of blocks vectorise, with AVX2 intrinsics where available) under key = seed at counter
// (hi = 0, lo = offset + b): four 32-bit words. Element i of an op uses:
//   uniform f32/f16/bf16, bernoulli:  word i % 4 of block i / 4;
//   normal f32/f16/bf16:             block i / 4: words (0, 1) give elements 4b, 4b+1
//                                    (Box-Muller cos, sin), words (2, 3) elements 4b+2, 4b+3;
//   uniform f64, uniform integers:   words 2(i % 2), 2(i % 2) + 1 of block i / 2 (64 bits);
//   normal f64:                      block i / 2: u1 from words (0, 1), u2 from (2, 3),
//                                    elements 2b (cos), 2b+1 (sin);
//   truncated_normal:                blocks (hi = attempt, lo = offset + i), attempt = 0, 1, ...;
//                                    each block gives candidates in order (f32: cos, sin of
//                                    words (0, 1), then of (2, 3); f64: cos, sin of the two
//                                    doubles) and the first with |z| < 2 is kept.
// So every element depends only on (seed, offset, i), whatever the thread count. All
// arithmetic on random values runs in fixed-length vector loops (no scalar remainder
// iterations), so an element's value does not depend on where a thread's range starts.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "../common/uniform_bounds.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"
#include "kiln/core/parallel.h"
#include "kiln/core/random.h"
#include "philox_simd.h"
#include "vecmath.h"

namespace kiln::cpu {
namespace {

using philox::kBatch;
using philox::philox_batch;
using philox::Words;

constexpr int64_t kGrainBlocks = 2048;   // blocks per parallel task, at least
constexpr double kTwoPi = 6.283185307179586;


struct Stream {
  uint64_t key, offset;
};
Stream stream(const Attrs& a) {
  return {static_cast<uint64_t>(a.get_int("key")), static_cast<uint64_t>(a.get_int("offset"))};
}

// Runs body(block, words, first_element, count) over the batches covering n elements
// at `per` elements per block, in parallel.
template <typename Body>
void for_batches(int64_t n, int per, const Stream& s, Body&& body) {
  const int64_t nblocks = (n + per - 1) / per;
  parallel_for(nblocks, kGrainBlocks, [&](int64_t b, int64_t e) {
    Words w;
    for (int64_t bb = b; bb < e; bb += kBatch) {
      philox_batch(s.key, 0, s.offset + static_cast<uint64_t>(bb), w);
      const int64_t first = bb * per;
      const int64_t count = std::min<int64_t>(std::min<int64_t>(kBatch, e - bb) * per, n - first);
      body(w, first, count);
    }
  });
}

// kiln::uint_to_unit_float and uints_to_unit_double, with signed conversions (equal
// values: the integers fit) so that AVX2 can vectorise them.
inline float unit_float(uint32_t x) { return static_cast<float>(static_cast<int32_t>(x >> 8)) * (1.0f / 16777216.0f); }
inline double unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t v = ((static_cast<uint64_t>(hi) << 21) ^ (lo >> 11)) & ((uint64_t{1} << 53) - 1);
  return static_cast<double>(static_cast<int64_t>(v)) * (1.0 / 9007199254740992.0);
}


// Writes n computed values to the output, rounding f32 to f16/bf16 (vectorised).
template <typename C, typename T>
inline void store(const C* v, T* o, int64_t n) {
  if constexpr (std::is_same_v<T, half>) convert_float_to_half(v, o, static_cast<size_t>(n));
  else if constexpr (std::is_same_v<T, bfloat16>) convert_float_to_bf16(v, o, static_cast<size_t>(n));
  else std::copy(v, v + n, o);
}

// Computation type of a floating output dtype: f64 for f64, else f32.
template <typename T>
using Calc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// vals[per * j + q] = col[q][j] (col rows kBatch apart): element order within a batch.
template <int per, typename V>
inline void interleave(const V* col, V* vals) {
  for (int j = 0; j < kBatch; ++j)
    for (int q = 0; q < per; ++q) vals[per * j + q] = col[q * kBatch + j];
}

// ---- uniform -----------------------------------------------------------------------

template <typename T>
void k_uniform_int(OpContext& ctx) {
  // Integer bounds (the op checked lo >= min(T), hi <= max(T) + 1), in uint64 arithmetic
  // modulo 2^64: hi may be 2^63 for i64, and range 0 stands for a span of 2^64.
  const double lo_d = ctx.attrs.get_float("lo"), hi_d = ctx.attrs.get_float("hi");
  const uint64_t lo = static_cast<uint64_t>(static_cast<int64_t>(lo_d));
  const uint64_t hi =
      hi_d >= 9223372036854775808.0 ? uint64_t{1} << 63 : static_cast<uint64_t>(static_cast<int64_t>(hi_d));
  const uint64_t range = hi - lo;
  T* o = static_cast<T*>(ctx.out[0].raw_data());
  for_batches(ctx.out[0].numel(), 2, stream(ctx.attrs), [&](const Words& w, int64_t first, int64_t count) {
    T col[2][kBatch], vals[2 * kBatch];
    for (int q = 0; q < 2; ++q)
      for (int j = 0; j < kBatch; ++j) {
        const uint64_t x = (static_cast<uint64_t>(w.w[2 * q][j]) << 32) | w.w[2 * q + 1][j];
        // Lemire's multiply-shift (bias <= range / 2^64), or all 64 bits for the full span.
        const uint64_t r = range == 0 ? x : static_cast<uint64_t>((static_cast<unsigned __int128>(x) * range) >> 64);
        col[q][j] = static_cast<T>(static_cast<int64_t>(lo + r));
      }
    interleave<2>(col[0], vals);
    std::copy(vals, vals + count, o + first);
  });
}

template <typename T>
void k_uniform(OpContext& ctx) {
  if constexpr (std::is_integral_v<T>) {
    k_uniform_int<T>(ctx);
  } else {
    using C = Calc<T>;
    const double lo = ctx.attrs.get_float("lo"), hi = ctx.attrs.get_float("hi");
    // Clamp to the smallest and largest T in [lo, hi): both are C values, and rounding
    // to T is monotonic, so clamped C values round into [lo, hi) too.
    const auto [lt, ht] = backends::uniform_bounds<T>(lo, hi);
    const C lc = static_cast<C>(backends::to_d(lt)), hc = static_cast<C>(backends::to_d(ht));
    const C span = static_cast<C>(hi - lo), base = static_cast<C>(lo);
    constexpr int per = std::is_same_v<T, double> ? 2 : 4;
    T* o = static_cast<T*>(ctx.out[0].raw_data());
    for_batches(ctx.out[0].numel(), per, stream(ctx.attrs), [&](const Words& w, int64_t first, int64_t count) {
      const C lo_c = lc, hi_c = hc;
      C col[per][kBatch];  // col[q][j]: element per * j + q of the batch
      for (int q = 0; q < per; ++q) {
        if constexpr (per == 2) {
#pragma omp simd
          for (int j = 0; j < kBatch; ++j) {
            const C v = base + span * static_cast<C>(unit_double(w.w[2 * q][j], w.w[2 * q + 1][j]));
            col[q][j] = std::min(std::max(v, lo_c), hi_c);
          }
        } else {
#pragma omp simd
          for (int j = 0; j < kBatch; ++j) {
            const C v = base + span * unit_float(w.w[q][j]);
            col[q][j] = std::min(std::max(v, lo_c), hi_c);
          }
        }
      }
      C vals[per * kBatch];
      interleave<per>(col[0], vals);
      store(vals, o + first, count);
    });
  }
}

// ---- normal ------------------------------------------------------------------------

// Box-Muller: u1 in (0, 1], u2 in [0, 1) -> r cos(2 pi u2), r sin(2 pi u2), r =
// sqrt(-2 log u1), for kBatch pairs. The sqrt loop stays scalar on purpose: with
// errno-setting math (GCC's default) std::sqrt does not vectorise, and it is cheap
// next to log/sin/cos, which run in libmvec's vector forms.
template <typename C>
inline void box_muller_batch(const C* u1, const C* u2, C* z0, C* z1) {
  C r[kBatch];
#pragma omp simd
  for (int j = 0; j < kBatch; ++j) r[j] = C(-2) * vm::log(u1[j]);
  for (int j = 0; j < kBatch; ++j) r[j] = std::sqrt(r[j]);
  // Separate loops: GCC would fuse sin and cos of one argument into a scalar sincos.
#pragma omp simd
  for (int j = 0; j < kBatch; ++j) z0[j] = r[j] * vm::cos(static_cast<C>(kTwoPi) * u2[j]);
#pragma omp simd
  for (int j = 0; j < kBatch; ++j) z1[j] = r[j] * vm::sin(static_cast<C>(kTwoPi) * u2[j]);
}

// The (u1, u2) pairs of a batch: f32 pair q of block j is words (2q, 2q+1); f64 has one
// pair per block, the doubles of words (0, 1) and (2, 3).
template <typename C>
inline void uniform_pair(const Words& w, int q, C* u1, C* u2) {
  if constexpr (std::is_same_v<C, double>) {
#pragma omp simd
    for (int j = 0; j < kBatch; ++j) {
      u1[j] = 1.0 - unit_double(w.w[0][j], w.w[1][j]);
      u2[j] = unit_double(w.w[2][j], w.w[3][j]);
    }
  } else {
#pragma omp simd
    for (int j = 0; j < kBatch; ++j) {
      u1[j] = 1.0f - unit_float(w.w[2 * q][j]);
      u2[j] = unit_float(w.w[2 * q + 1][j]);
    }
  }
}

// Standard normals of batch w, in element order: 4 per block (f32) or 2 (f64).
template <typename C>
inline void normals(const Words& w, C* z) {
  constexpr int pairs = std::is_same_v<C, double> ? 1 : 2;
  C col[2 * pairs][kBatch], u1[kBatch], u2[kBatch];
  for (int q = 0; q < pairs; ++q) {
    uniform_pair<C>(w, q, u1, u2);
    box_muller_batch(u1, u2, col[2 * q], col[2 * q + 1]);
  }
  interleave<2 * pairs>(col[0], z);
}

template <typename T>
void k_normal(OpContext& ctx) {
  using C = Calc<T>;
  const C mean = static_cast<C>(ctx.attrs.get_float("mean")), sd = static_cast<C>(ctx.attrs.get_float("stddev"));
  constexpr int per = std::is_same_v<C, double> ? 2 : 4;
  T* o = static_cast<T*>(ctx.out[0].raw_data());
  for_batches(ctx.out[0].numel(), per, stream(ctx.attrs), [&](const Words& w, int64_t first, int64_t count) {
    C z[per * kBatch];
    normals<C>(w, z);
#pragma omp simd
    for (int k = 0; k < per * kBatch; ++k) z[k] = mean + sd * z[k];
    store(z, o + first, count);
  });
}

// ---- truncated normal --------------------------------------------------------------

// Element `lo`'s value from candidate `skip` of attempt `attempt` onward: the rare path
// (~4.6% of elements), scalar, one block at a time through kiln::Philox::block.
template <typename C>
C truncated_tail(uint64_t key, uint64_t lo, uint64_t attempt, int skip) {
  for (;; ++attempt, skip = 0) {
    const std::array<uint32_t, 4> b = Philox::block(key, attempt, lo);
    constexpr int pairs = std::is_same_v<C, double> ? 1 : 2;
    C z[2 * pairs];
    for (int q = 0; q < pairs; ++q) {
      C u1, u2;
      if constexpr (std::is_same_v<C, double>) {
        u1 = 1.0 - unit_double(b[0], b[1]);
        u2 = unit_double(b[2], b[3]);
      } else {
        u1 = 1.0f - unit_float(b[2 * q]);
        u2 = unit_float(b[2 * q + 1]);
      }
      const C r = std::sqrt(C(-2) * std::log(u1)), t = static_cast<C>(kTwoPi) * u2;
      z[2 * q] = r * std::cos(t);
      z[2 * q + 1] = r * std::sin(t);
    }
    for (int k = skip; k < 2 * pairs; ++k)
      if (std::abs(z[k]) < C(2)) return z[k];
  }
}

template <typename T>
void k_truncated_normal(OpContext& ctx) {
  using C = Calc<T>;
  const C mean = static_cast<C>(ctx.attrs.get_float("mean")), sd = static_cast<C>(ctx.attrs.get_float("stddev"));
  const Stream s = stream(ctx.attrs);
  T* o = static_cast<T*>(ctx.out[0].raw_data());
  // One block per element: its first candidate for a whole batch in vector lanes, the
  // rejected through truncated_tail.
  for_batches(ctx.out[0].numel(), 1, s, [&](const Words& w, int64_t first, int64_t count) {
    C u1[kBatch], u2[kBatch], z[kBatch], unused[kBatch];
    uniform_pair<C>(w, 0, u1, u2);
    box_muller_batch(u1, u2, z, unused);
    for (int64_t k = 0; k < count; ++k)
      if (!(std::abs(z[k]) < C(2))) z[k] = truncated_tail<C>(s.key, s.offset + static_cast<uint64_t>(first + k), 0, 1);
#pragma omp simd
    for (int k = 0; k < kBatch; ++k) z[k] = mean + sd * z[k];
    store(z, o + first, count);
  });
}

// ---- bernoulli ---------------------------------------------------------------------

void k_bernoulli(OpContext& ctx) {
  const double p = ctx.attrs.get_float("p");
  // true iff word < p * 2^32 (p = 1: always).
  const uint64_t threshold = p >= 1.0 ? (uint64_t{1} << 32) : static_cast<uint64_t>(p * 4294967296.0);
  bool* o = static_cast<bool*>(ctx.out[0].raw_data());
  for_batches(ctx.out[0].numel(), 4, stream(ctx.attrs), [&](const Words& w, int64_t first, int64_t count) {
    bool col[4][kBatch], vals[4 * kBatch];
    for (int q = 0; q < 4; ++q) {
#pragma omp simd
      for (int j = 0; j < kBatch; ++j) col[q][j] = static_cast<uint64_t>(w.w[q][j]) < threshold;
    }
    interleave<4>(col[0], vals);
    std::copy(vals, vals + count, o + first);
  });
}

// ---- registration ------------------------------------------------------------------

#define KILN_REG_RANDOM_FLOAT(op, K)                          \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF16, K<half>);       \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBF16, K<bfloat16>);  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF32, K<float>);      \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF64, K<double>)

KILN_REG_RANDOM_FLOAT("random_uniform", k_uniform);
KILN_REGISTER_KERNEL("random_uniform", kCPU, DType::kU8, k_uniform<uint8_t>);
KILN_REGISTER_KERNEL("random_uniform", kCPU, DType::kI8, k_uniform<int8_t>);
KILN_REGISTER_KERNEL("random_uniform", kCPU, DType::kI32, k_uniform<int32_t>);
KILN_REGISTER_KERNEL("random_uniform", kCPU, DType::kI64, k_uniform<int64_t>);
KILN_REG_RANDOM_FLOAT("random_normal", k_normal);
KILN_REG_RANDOM_FLOAT("truncated_normal", k_truncated_normal);
KILN_REGISTER_KERNEL("bernoulli", kCPU, DType::kBool, k_bernoulli);

}  // namespace
}  // namespace kiln::cpu
