#pragma once
// The integer row kernels' bodies, compiled once per instruction set: included by
// quant_kernels.cc (AVX2, the baseline) and quant_kernels_avx512.cc (compiled with
// AVX-512 + VNNI), each inside its own namespace (KILN_LLM_ISA) so that the two
// compilations of these inline functions never merge at link time.
#include <immintrin.h>

#include <cstring>

#include "llm/quant_kernels.h"

#ifndef KILN_LLM_ISA
#error "define KILN_LLM_ISA (the namespace of this compilation) before including"
#endif

namespace kiln::llm::kernels::KILN_LLM_ISA {

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The 32 weights of a 4-bit block as bytes 0..15 (weight j in byte j).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_and_si128(t, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(t, 4), _mm_set1_epi8(0x0F));
  return _mm256_set_m128i(hi, lo);
}

// The fifth bits of a q5 block (bit j of qh: weight j) as 0x10 per byte.
inline __m256i fifth_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                        3, 3, 3, 3);
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

// Integer dot of 32 unsigned (0..31) weights with 32 signed activations, as 8 int32
// lanes: one VNNI instruction, or AVX2's multiply-add pair (no overflow: |w x| <= 31*128).
inline __m256i dot_u8s8(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}



inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}


template <GgmlType T>
constexpr bool kSigned = T == GgmlType::kQ4_0 || T == GgmlType::kQ5_0 || T == GgmlType::kQ8_0;
template <GgmlType T>
constexpr bool kHasMin = T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1;
template <GgmlType T>
constexpr size_t kBlockBytes = T == GgmlType::kQ4_0 ? 18 : T == GgmlType::kQ4_1 ? 20 : T == GgmlType::kQ5_0 ? 22
                               : T == GgmlType::kQ5_1 ? 24 : 34;

// A weight block unpacked to 32 int8 weights (signed types: with their sign), its scale
// and (q4_1, q5_1) its offset.
struct WBlock {
  __m256i q;
  float d, m;
};

template <GgmlType T>
inline WBlock load_block(const uint8_t* b) {
  if constexpr (T == GgmlType::kQ4_0) return {_mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8)), f16(b), 0.0f};
  else if constexpr (T == GgmlType::kQ4_1) return {nibbles(b + 4), f16(b), f16(b + 2)};
  else if constexpr (T == GgmlType::kQ5_0)
    return {_mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)), _mm256_set1_epi8(16)), f16(b), 0.0f};
  else if constexpr (T == GgmlType::kQ5_1) return {_mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)), f16(b), f16(b + 2)};
  else return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), f16(b), 0.0f};
}

// One row against NT activation vectors: each weight block is unpacked once and used NT
// times. A token's sums run in the same order whatever NT is, so its result does not
// depend on which tokens share the tile (batch independence).
template <GgmlType T, int NT>
inline void row_tile(const uint8_t* row, int64_t nb, const Q8Block* const* x, float* out) {
  __m256 acc[NT];
  float off[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps(), off[j] = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const WBlock w = load_block<T>(row + i * kBlockBytes<T>);
    const __m256i wu = kSigned<T> ? _mm256_sign_epi8(w.q, w.q) : w.q;  // the product needs unsigned weights
    const __m256 dw = _mm256_set1_ps(w.d);
    for (int j = 0; j < NT; ++j) {
      const Q8Block& xb = x[j][i];
      __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q));
      if constexpr (kSigned<T>) qx = _mm256_sign_epi8(qx, w.q);
      // (activation scale x integer sum) x weight scale: per lane, the activation's half-block scale.
      const __m256 sx = _mm256_mul_ps(_mm256_cvtepi32_ps(dot_u8s8(wu, qx)), _mm256_loadu_ps(xb.d));
      acc[j] = _mm256_fmadd_ps(sx, dw, acc[j]);
      if constexpr (kHasMin<T>) off[j] += w.m * xb.s;
    }
  }
  for (int j = 0; j < NT; ++j) out[j] = hsum(acc[j]) + off[j];
}

// Rows [r0, r1) against n activation vectors, in tiles of up to 8 tokens.
template <GgmlType T>
void rows_int(const QMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    int64_t t = 0;
    const Q8Block* x[8];
    float out[8];
    for (; t + 8 <= n; t += 8) {
      for (int j = 0; j < 8; ++j) x[j] = xq + (t + j) * nb;
      row_tile<T, 8>(row, nb, x, out);
      for (int j = 0; j < 8; ++j) y[(t + j) * y_stride + r] = out[j];
    }
    for (; t + 4 <= n; t += 4) {
      for (int j = 0; j < 4; ++j) x[j] = xq + (t + j) * nb;
      row_tile<T, 4>(row, nb, x, out);
      for (int j = 0; j < 4; ++j) y[(t + j) * y_stride + r] = out[j];
    }
    for (; t < n; ++t) {
      x[0] = xq + t * nb;
      row_tile<T, 1>(row, nb, x, out);
      y[t * y_stride + r] = out[0];
    }
  }
}

// The kernel for `type`, or nullptr when it has none.
inline RowsFn integer_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return rows_int<GgmlType::kQ4_0>;
    case GgmlType::kQ4_1: return rows_int<GgmlType::kQ4_1>;
    case GgmlType::kQ5_0: return rows_int<GgmlType::kQ5_0>;
    case GgmlType::kQ5_1: return rows_int<GgmlType::kQ5_1>;
    case GgmlType::kQ8_0: return rows_int<GgmlType::kQ8_0>;
    default: return nullptr;
  }
}

}  // namespace kiln::llm::kernels::KILN_LLM_ISA
