// CPU kernels: softmax / log_softmax (stable: shift by the max; exp through libmvec),
// dropout (Philox mask), embedding (row gather).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/core/kernel.h"
#include "kiln/core/parallel.h"
#include "kiln/core/random.h"
#include "loops.h"
#include "nn_kernel_util.h"
#include "philox_simd.h"
#include "softmax_row.h"
#include "vecmath.h"

namespace kiln::cpu {
namespace {

// ---- softmax ---------------------------------------------------------------------------


// Softmax along the middle dim of [outer, n, inner] for one outer index and the
// inner slice [j0, j1): vectorised across the inner dim.
template <typename T, bool kLog>
void softmax_strided(const T* x, T* y, int64_t n, int64_t inner, int64_t j0, int64_t j1, T* m, T* s) {
  const int64_t w = j1 - j0;
  std::fill(m, m + w, -std::numeric_limits<T>::infinity());
  std::fill(s, s + w, T(0));
  for (int64_t k = 0; k < n; ++k) {
    const T* xr = x + k * inner + j0;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) m[j] = std::max(m[j], xr[j]);
  }
  for (int64_t k = 0; k < n; ++k) {
    const T* xr = x + k * inner + j0;
    T* yr = y + k * inner + j0;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) {
      T e = vm::exp(xr[j] - m[j]);
      if constexpr (!kLog) yr[j] = e;
      s[j] += e;
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < w; ++j) s[j] = kLog ? m[j] + vm::log(s[j]) : T(1) / s[j];
  for (int64_t k = 0; k < n; ++k) {
    const T* xr = x + k * inner + j0;
    T* yr = y + k * inner + j0;
    if constexpr (kLog) {
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) yr[j] = xr[j] - s[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) yr[j] *= s[j];
    }
  }
}

template <typename T, bool kLog>
void softmax_kernel(OpContext& ctx) {
  const Tensor& xt = ctx.in[0];
  if (xt.numel() == 0) return;
  const int axis = normalize_axis(ctx.attrs.get_int("axis", -1), xt.rank());
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= xt.dim(i);
  for (int i = axis + 1; i < xt.rank(); ++i) inner *= xt.dim(i);
  const int64_t n = xt.dim(axis);
  const T* x = static_cast<const T*>(xt.raw_data());
  T* y = static_cast<T*>(ctx.out[0].raw_data());
  if (inner == 1) {
    parallel_for(outer, std::max<int64_t>(1, kElementwiseGrain / n), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) softmax_row<T, kLog>(x + r * n, y + r * n, n);
    });
    return;
  }
  constexpr int64_t kBlock = 256;  // inner columns per task
  const int64_t nblk = (inner + kBlock - 1) / kBlock;
  parallel_for(outer * nblk, std::max<int64_t>(1, kElementwiseGrain / (n * std::min(inner, kBlock))),
               [&](int64_t lo, int64_t hi) {
                 T m[kBlock], s[kBlock];
                 for (int64_t t = lo; t < hi; ++t) {
                   const int64_t o = t / nblk, j0 = t % nblk * kBlock, j1 = std::min(inner, j0 + kBlock);
                   softmax_strided<T, kLog>(x + o * n * inner, y + o * n * inner, n, inner, j0, j1, m, s);
                 }
               });
}

template <typename T>
void softmax(OpContext& ctx) {
  softmax_kernel<T, false>(ctx);
}
template <typename T>
void log_softmax(OpContext& ctx) {
  softmax_kernel<T, true>(ctx);
}

// ---- dropout ---------------------------------------------------------------------------


template <typename T>
void dropout(OpContext& ctx) {
  const double rate = ctx.attrs.get_float("rate");
  const int64_t key_bits = ctx.attrs.get_int("seed");
  uint64_t key;
  std::memcpy(&key, &key_bits, sizeof key);
  const T scale = static_cast<T>(1.0 / (1.0 - rate));
  // u >= rate with u = (w >> 8) / 2^24  <=>  (w >> 8) >= ceil(rate * 2^24) (exact: rate * 2^24 is exact in double).
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(rate * 16777216.0));
  const int64_t n = ctx.in[0].numel();
  const T* x = static_cast<const T*>(ctx.in[0].raw_data());
  T* y = static_cast<T*>(ctx.out[0].raw_data());
  // Element i uses word i % 4 of Philox block i / 4: independent of the work split.
  constexpr int64_t kGroup = 4 * philox::kBatch;  // elements per Philox batch
  parallel_for((n + kGroup - 1) / kGroup, kElementwiseGrain / kGroup, [&](int64_t lo, int64_t hi) {
    philox::Words words;
    alignas(32) uint32_t w[kGroup];
    for (int64_t g = lo; g < hi; ++g) {
      philox::philox_batch(key, 0, static_cast<uint64_t>(g * philox::kBatch), words);
      for (int64_t e = 0; e < kGroup; ++e) w[e] = words.w[e & 3][e >> 2];  // element order
      const int64_t base = g * kGroup, len = std::min<int64_t>(kGroup, n - base);
      const T* xs = x + base;
      T* ys = y + base;
#pragma omp simd
      for (int64_t e = 0; e < len; ++e) ys[e] = (w[e] >> 8) >= threshold ? static_cast<T>(xs[e] * scale) : T(0);
    }
  });
}

// ---- embedding -------------------------------------------------------------------------

template <typename I>
void embedding_gather(OpContext& ctx) {
  const Tensor& table = ctx.in[0];
  const int64_t v = table.dim(0), n = ctx.in[1].numel();
  const I* ids = static_cast<const I*>(ctx.in[1].raw_data());
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= v)
      throw OutOfRangeError("embedding: id " + std::to_string(ids[i]) + " (at flat position " + std::to_string(i) +
                            " of ids " + ctx.in[1].shape().str() + ") is out of range for a table of " +
                            std::to_string(v) + " rows; ids must be in [0, " + std::to_string(v) + ")");
  const size_t row = v > 0 ? table.nbytes() / static_cast<size_t>(v) : 0;
  if (row == 0) return;
  const char* src = static_cast<const char*>(table.raw_data());
  char* dst = static_cast<char*>(ctx.out[0].raw_data());
  parallel_for(n, std::max<int64_t>(1, static_cast<int64_t>(kElementwiseGrain * 4 / row)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) std::memcpy(dst + i * row, src + static_cast<int64_t>(ids[i]) * row, row);
  });
}

void embedding(OpContext& ctx) {
  if (ctx.in[1].dtype() == DType::kI32)
    embedding_gather<int32_t>(ctx);
  else
    embedding_gather<int64_t>(ctx);
}

KILN_NN_REG_FLOAT("softmax", softmax);
KILN_NN_REG_FLOAT("log_softmax", log_softmax);
KILN_NN_REG_FLOAT("dropout", dropout);
KILN_REGISTER_KERNEL("embedding", kCPU, KILN_ALL_DTYPES, embedding);

}  // namespace
}  // namespace kiln::cpu
