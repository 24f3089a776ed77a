#pragma once
// One output row of a 2x2, stride-2, unpadded NHWC max pool (internal): forward,
// shared by max_pool2d's fast path (pool_kernels.cc) and fused_conv2d's pooled store
// (conv_kernels.cc); backward, shared by max_pool2d_backward's fast path
// (pool_backward_kernels.cc) and fused_conv2d_backward_filter
// (conv_pool_backward_kernels.cc); and their argmax-mask versions (attr pool_mask).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kiln/core/half.h"

namespace kiln::cpu {

#if defined(__AVX2__)
// Eight values as f32 lanes, from f32 or bf16 storage, and back. The bf16 store keeps the
// high half of each lane: exact for values that came from bf16 (a window's maximum, a
// gradient passed through or zero), which is all the pooling rows store.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bfloat16* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(bfloat16* p, __m256 v) {
  const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
}

// The running maximum's update for one more cell of 8 windows: whether cell e replaces
// best (greater, or a NaN over a number: the first NaN stays).
inline __m256 pool_takes(__m256 e, __m256 best) {
  const __m256 nan_over_number =
      _mm256_and_ps(_mm256_cmp_ps(e, e, _CMP_UNORD_Q), _mm256_cmp_ps(best, best, _CMP_ORD_Q));
  return _mm256_or_ps(_mm256_cmp_ps(e, best, _CMP_GT_OQ), nan_over_number);
}
#endif

// out[ow, 0:C] = max over the 2x2 window at column 2 * ow of input rows r0 and r1
// (each at least 2 * PW pixels of C channels), ow < PW. For floats a NaN in a window
// wins (as max_pool2d's loop does).
template <typename T>
inline void max_pool_2x2_row(const T* r0, const T* r1, int64_t PW, int64_t C, T* out) {
  for (int64_t ow = 0; ow < PW; ++ow) {
    const T *a = r0 + 2 * ow * C, *b = a + C, *c = r1 + 2 * ow * C, *d = c + C;
    T* o = out + ow * C;
    if constexpr (std::is_same_v<T, bfloat16>) {  // in f32 lanes; the maximum is one of the bf16 inputs
      int64_t k = 0;
#if defined(__AVX2__)
      for (; k + 8 <= C; k += 8) {
        __m256 best = load8(a + k);
        for (const bfloat16* e : {b + k, c + k, d + k}) {
          const __m256 v = load8(e);
          best = _mm256_blendv_ps(best, v, pool_takes(v, best));
        }
        store8(o + k, best);
      }
#endif
      for (; k < C; ++k) {
        bfloat16 m = a[k];
        for (const bfloat16 e : {b[k], c[k], d[k]})
          if (float(e) > float(m) || (float(e) != float(e) && float(m) == float(m))) m = e;
        o[k] = m;
      }
    } else if constexpr (std::is_integral_v<T>) {
#pragma omp simd
      for (int64_t k = 0; k < C; ++k) o[k] = std::max(std::max(a[k], b[k]), std::max(c[k], d[k]));
    } else {
      auto pick = [](T m, T e) { return (e > m || e != e) ? e : m; };  // NaN sticks once taken
#pragma omp simd
      for (int64_t k = 0; k < C; ++k) o[k] = pick(pick(pick(a[k], b[k]), c[k]), d[k]);
    }
  }
}

// Attr pool_mask (a train step's fused_conv2d, kiln/ops/fused.h): what the pool's
// gradient needs of a window, one byte per output cell and channel: the winning cell
// 0-3 (row-major in the window; the first maximum, strictly greater, or the first NaN,
// as max_pool_backward_2x2_row decides), or kPoolMaskNone when the gradient stops there
// (with relu: the maximum is not > 0, so the ReLU's gradient is zero).
inline constexpr uint8_t kPoolMaskNone = 4;


// max_pool_2x2_row for f32, also writing the mask row (PW * C bytes).
inline void max_pool_2x2_mask_row(const float* r0, const float* r1, int64_t PW, int64_t C, bool relu, float* out,
                                  uint8_t* mask) {
  for (int64_t ow = 0; ow < PW; ++ow) {
    const float *a = r0 + 2 * ow * C, *b = a + C, *c = r1 + 2 * ow * C, *d = c + C;
    float* o = out + ow * C;
    uint8_t* m = mask + ow * C;
    int64_t k = 0;
#if defined(__AVX2__)
    const __m256 zero = _mm256_setzero_ps();
    for (; k + 8 <= C; k += 8) {
      __m256 best = _mm256_loadu_ps(a + k);
      __m256i win = _mm256_setzero_si256();
      const float* cells[3] = {b + k, c + k, d + k};
      for (int q = 0; q < 3; ++q) {
        const __m256 e = _mm256_loadu_ps(cells[q]);
        const __m256 t = pool_takes(e, best);
        best = _mm256_blendv_ps(best, e, t);
        win = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(win), _mm256_castsi256_ps(_mm256_set1_epi32(q + 1)), t));
      }
      if (relu) {
        const __m256 stop = _mm256_cmp_ps(best, zero, _CMP_NGT_UQ);  // not > 0 (NaN too)
        win = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(win), _mm256_castsi256_ps(_mm256_set1_epi32(kPoolMaskNone)), stop));
      }
      _mm256_storeu_ps(o + k, best);
      const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(win), _mm256_extracti128_si256(win, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(m + k), _mm_packus_epi16(w16, w16));
    }
#endif
    for (; k < C; ++k) {
      float best = a[k];
      uint8_t win = 0;
      const float cell[3] = {b[k], c[k], d[k]};
      for (int q = 0; q < 3; ++q) {
        const float e = cell[q];
        if (e > best || (e != e && best == best)) {
          best = e;
          win = static_cast<uint8_t>(q + 1);
        }
      }
      o[k] = best;
      m[k] = relu && !(best > 0) ? kPoolMaskNone : win;
    }
  }
}

// The gradient of one output row of that pool from its mask row (PW * C bytes) and dy
// row [PW, C]: d0 and d1 the two dx rows written; sums (may be null): dy summed per
// channel over the cells that received it, C floats, overwritten.
inline void mask_pool_backward_2x2_row(const uint8_t* mask, const float* dy, float* d0, float* d1, int64_t PW, int64_t C,
                                       float* sums) {
  for (int64_t ow = 0; ow < PW; ++ow) {
    const uint8_t* m = mask + ow * C;
    const float* g = dy + ow * C;
    float *a = d0 + 2 * ow * C, *b = a + C, *c = d1 + 2 * ow * C, *d = c + C;
    int64_t k = 0;
#if defined(__AVX2__)
    for (; k + 8 <= C; k += 8) {
      const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m + k)));
      const __m256 v = _mm256_loadu_ps(g + k);
      auto at = [&](int cell) {
        return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(w, _mm256_set1_epi32(cell))), v);
      };
      _mm256_storeu_ps(a + k, at(0));
      _mm256_storeu_ps(b + k, at(1));
      _mm256_storeu_ps(c + k, at(2));
      _mm256_storeu_ps(d + k, at(3));
      if (sums) {
        const __m256 got =
            _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kPoolMaskNone), w)), v);
        _mm256_storeu_ps(sums + k, ow == 0 ? got : _mm256_add_ps(_mm256_loadu_ps(sums + k), got));
      }
    }
#endif
    for (; k < C; ++k) {
      const uint8_t w = m[k];
      const float v = g[k];
      a[k] = w == 0 ? v : 0.0f;
      b[k] = w == 1 ? v : 0.0f;
      c[k] = w == 2 ? v : 0.0f;
      d[k] = w == 3 ? v : 0.0f;
      if (sums) sums[k] = (ow == 0 ? 0.0f : sums[k]) + (w < kPoolMaskNone ? v : 0.0f);
    }
  }
}

#if defined(__AVX2__)
// The gradient of one output row of that pool, C a multiple of 8: x0 and x1 are
// the window's two input rows (2 * OW pixels of C channels), dy the row's output
// gradient [OW, C], d0 and d1 the two dx rows written. Per output cell and 8
// channels: four x loads, the first maximum (strictly greater, or the first NaN, as
// max_pool2d_backward's loops decide ties), dy stored to its cell and zeros to the
// other three (and zero where x <= 0 with relu). sums (may be null): what went to
// these dx rows summed per channel, C floats, overwritten.
// T: float, or bfloat16 (dy and dx bf16 too; sums stay f32).
template <typename T>
inline void max_pool_backward_2x2_row(const T* x0, const T* x1, const T* dy, T* d0, T* d1, int64_t OW, int64_t C,
                                      bool relu, float* sums) {
  const __m256 zero = _mm256_setzero_ps(), ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (int64_t ow = 0; ow < OW; ++ow)
    for (int64_t c = 0; c < C; c += 8) {
      const int64_t a = 2 * ow * C + c, b = a + C;
      const __m256 e0 = load8(x0 + a), e1 = load8(x0 + b);
      const __m256 e2 = load8(x1 + a), e3 = load8(x1 + b);
      // t_k: cell k replaces the running maximum.
      __m256 best = e0;
      const __m256 t1 = pool_takes(e1, best);
      best = _mm256_blendv_ps(best, e1, t1);
      const __m256 t2 = pool_takes(e2, best);
      best = _mm256_blendv_ps(best, e2, t2);
      const __m256 t3 = pool_takes(e3, best);
      // Cell k wins when it was taken and no later cell was: exactly one cell per lane.
      const __m256 s3 = t3, s2 = _mm256_andnot_ps(t3, t2);
      const __m256 s1 = _mm256_andnot_ps(_mm256_or_ps(t2, t3), t1);
      const __m256 s0 = _mm256_andnot_ps(_mm256_or_ps(_mm256_or_ps(t1, t2), t3), ones);
      __m256 grad = load8(dy + ow * C + c);
      // The winning cell holds the window's maximum, so its x > 0 is the maximum's (NaN: false).
      if (relu) grad = _mm256_and_ps(grad, _mm256_cmp_ps(_mm256_blendv_ps(best, e3, t3), zero, _CMP_GT_OQ));
      store8(d0 + a, _mm256_and_ps(s0, grad));
      store8(d0 + b, _mm256_and_ps(s1, grad));
      store8(d1 + a, _mm256_and_ps(s2, grad));
      store8(d1 + b, _mm256_and_ps(s3, grad));
      // The four cells sum to grad (one holds it, three hold zeros).
      if (sums) _mm256_storeu_ps(sums + c, ow == 0 ? grad : _mm256_add_ps(_mm256_loadu_ps(sums + c), grad));
    }
}
#endif

}  // namespace kiln::cpu
