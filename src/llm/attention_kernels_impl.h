#pragma once
// attention_kernels.h's bodies, compiled once per instruction set (attention_kernels.cc:
// AVX2; attention_kernels_avx512.cc), each in its own namespace (KILN_LLM_ISA), on the
// quantised kernels' Lanes (quant_kernels_impl.h, included first). No standard-library
// templates here: their instantiations are shared by name across translation units, and
// the linker could keep an AVX-512 copy for AVX2 CPUs.

#include "llm/attention_kernels.h"

namespace kiln::llm::kernels::KILN_LLM_ISA {

// Rows in groups of R; positions in vectors of V::kWidth read from kt (row stride
// `stride` halves).
template <int R>
inline void score_rows(const float* const* q, const half* kt, int64_t stride, int64_t lanes, int64_t hd, float scale,
                       float* s, int64_t s_stride) {
  using V = Lanes;
  for (int64_t j = 0; j < lanes; j += V::kWidth) {
    typename V::F acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = V::zerof();
    auto k_at = [&](int64_t d) { return V::load_f16(reinterpret_cast<const uint8_t*>(kt + d * stride + j)); };
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

// Rows [0, rows) against `lanes` positions (a multiple of 16, every read inside kt's rows).
inline void scores(const float* const* q, int64_t rows, const half* kt, int64_t stride, int64_t lanes, int64_t hd,
                   float scale, float* s, int64_t s_stride) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) score_rows<4>(q + r, kt, stride, lanes, hd, scale, s + r * s_stride, s_stride);
  if (rows - r == 3) score_rows<3>(q + r, kt, stride, lanes, hd, scale, s + r * s_stride, s_stride), r += 3;
  if (rows - r >= 2) score_rows<2>(q + r, kt, stride, lanes, hd, scale, s + r * s_stride, s_stride), r += 2;
  if (rows - r == 1) score_rows<1>(q + r, kt, stride, lanes, hd, scale, s + r * s_stride, s_stride);
}

// R output rows x NV vectors (columns i0 ...) held in registers across the block's
// positions; each value vector is converted once for the R rows.
template <int R, int NV>
inline void value_rows(const float* p, int64_t p_stride, int64_t m, const half* v, int64_t v_stride, float* const* out,
                       int64_t i0) {
  using V = Lanes;
  typename V::F acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NV; ++i) acc[r][i] = V::load_f32(reinterpret_cast<const uint8_t*>(out[r] + i0 + i * V::kWidth));
  for (int64_t j = 0; j < m; ++j) {
    typename V::F vj[NV];
    for (int i = 0; i < NV; ++i) vj[i] = V::load_f16(reinterpret_cast<const uint8_t*>(v + j * v_stride + i0 + i * V::kWidth));
    for (int r = 0; r < R; ++r) {
      const typename V::F pj = V::set(p[r * p_stride + j]);
      for (int i = 0; i < NV; ++i) acc[r][i] = V::fma(pj, vj[i], acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NV; ++i) V::store(out[r] + i0 + i * V::kWidth, acc[r][i]);
}

// Columns in strips of NV vectors, rows in groups of up to 16 / NV accumulators' worth.
template <int NV>
inline void value_strip(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride,
                        float* const* out, int64_t i0) {
  constexpr int R = NV >= 8 ? 2 : 4;
  auto run = [&]<int N>(int64_t r) { value_rows<N, NV>(p + r * p_stride, p_stride, m, v, v_stride, out + r, i0); };
  int64_t r = 0;
  for (; r + R <= rows; r += R) run.template operator()<R>(r);
  if constexpr (R > 3) {
    if (rows - r == 3) run.template operator()<3>(r), r += 3;  // a token's heads under 3:1 grouped-query attention
  }
  if (rows - r >= 2) run.template operator()<2>(r), r += 2;
  if (rows - r == 1) run.template operator()<1>(r);
}

inline void values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride, int64_t hd,
                   float* const* out) {
  constexpr int W = Lanes::kWidth;
  int64_t i = 0;
  for (; i + 8 * W <= hd; i += 8 * W) value_strip<8>(p, p_stride, rows, m, v, v_stride, out, i);
  for (; i + 4 * W <= hd; i += 4 * W) value_strip<4>(p, p_stride, rows, m, v, v_stride, out, i);
  for (; i + W <= hd; i += W) value_strip<1>(p, p_stride, rows, m, v, v_stride, out, i);
  // The tail one lane at a time, with the same fused step.
  for (; i < hd; ++i)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < m; ++j)
        out[r][i] = __builtin_fmaf(p[r * p_stride + j], static_cast<float>(v[j * v_stride + i]), out[r][i]);
}

}  // namespace kiln::llm::kernels::KILN_LLM_ISA
