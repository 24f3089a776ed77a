#pragma once
// attention_kernels.h's bodies, compiled once per instruction set (attention_kernels.cc:
// AVX2; attention_kernels_avx512.cc), each in its own namespace (KILN_LLM_ISA), on the
// quantised kernels' Lanes (quant_kernels_impl.h, included first).
#include <algorithm>

#include "llm/attention_kernels.h"

namespace kiln::llm::kernels::KILN_LLM_ISA {

// Rows in groups of R. Each score sums its head dimensions in four interleaved chains (d
// mod 4, fused multiply-adds in order of d), joined as (c0 + c1) + (c2 + c3): closer to
// the exact sum than one chain of hd terms, and four times the independent work.
template <int R>
inline void score_rows(const float* const* q, const float* kt, int64_t lanes, int64_t hd, float scale, float* s,
                       int64_t s_stride) {
  using V = Lanes;
  for (int64_t j = 0; j < lanes; j += V::kWidth) {
    typename V::F acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = V::zerof();
    auto k_at = [&](int64_t d) { return V::load_f32(reinterpret_cast<const uint8_t*>(kt + d * lanes + j)); };
    int64_t d = 0;
    for (; d + 4 <= hd; d += 4)
      for (int c = 0; c < 4; ++c) {
        const typename V::F k = k_at(d + c);
        for (int r = 0; r < R; ++r) acc[r][c] = V::fma(V::set(q[r][d + c]), k, acc[r][c]);
      }
    for (int c = 0; d < hd; ++d, ++c) {
      const typename V::F k = k_at(d);
      for (int r = 0; r < R; ++r) acc[r][c] = V::fma(V::set(q[r][d]), k, acc[r][c]);
    }
    for (int r = 0; r < R; ++r) {
      const typename V::F sum = V::add(V::add(acc[r][0], acc[r][1]), V::add(acc[r][2], acc[r][3]));
      V::store(s + r * s_stride + j, V::mul(sum, V::set(scale)));
    }
  }
}

inline void scores(const float* const* q, int64_t rows, const float* kt, int64_t lanes, int64_t hd, float scale, float* s,
                   int64_t s_stride) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) score_rows<4>(q + r, kt, lanes, hd, scale, s + r * s_stride, s_stride);
  for (; r + 2 <= rows; r += 2) score_rows<2>(q + r, kt, lanes, hd, scale, s + r * s_stride, s_stride);
  if (r < rows) score_rows<1>(q + r, kt, lanes, hd, scale, s + r * s_stride, s_stride);
}

// NV vectors of one output row at a time held in registers across the block's positions.
template <int NV>
inline void value_row(const float* p, int64_t m, const float* v, int64_t hd, float* out) {
  using V = Lanes;
  typename V::F acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = V::load_f32(reinterpret_cast<const uint8_t*>(out + i * V::kWidth));
  for (int64_t j = 0; j < m; ++j) {
    const typename V::F pj = V::set(p[j]);
    for (int i = 0; i < NV; ++i)
      acc[i] = V::fma(pj, V::load_f32(reinterpret_cast<const uint8_t*>(v + j * hd + i * V::kWidth)), acc[i]);
  }
  for (int i = 0; i < NV; ++i) V::store(out + i * V::kWidth, acc[i]);
}

inline void values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const float* v, int64_t hd,
                   float* const* out) {
  constexpr int W = Lanes::kWidth;
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * p_stride;
    int64_t i = 0;
    // Column strips of up to 8 vectors; the tail one lane at a time with the same fused step.
    for (; i + 8 * W <= hd; i += 8 * W) value_row<8>(pr, m, v + i, hd, out[r] + i);
    for (; i + 4 * W <= hd; i += 4 * W) value_row<4>(pr, m, v + i, hd, out[r] + i);
    for (; i + W <= hd; i += W) value_row<1>(pr, m, v + i, hd, out[r] + i);
    for (; i < hd; ++i)
      for (int64_t j = 0; j < m; ++j) out[r][i] = __builtin_fmaf(pr[j], v[j * hd + i], out[r][i]);
  }
}

}  // namespace kiln::llm::kernels::KILN_LLM_ISA
