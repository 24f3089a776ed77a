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

// Signed weights: |w| times x with w's sign (the product needs an unsigned operand).
inline __m256i dot_s8s8(__m256i w, __m256i x) { return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One weight block against one activation block: acc += scale * int_dot; returns the
// offset term (min * activation sum) to add once.
// The weight block's scale times the activation's two half-block scales, per int32 lane
// (lanes 0-3 sum weights 0-15, lanes 4-7 weights 16-31).
inline __m256 scales(float dw, const Q8Block& x) {
  return _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_set_m128(_mm_set1_ps(x.d[1]), _mm_set1_ps(x.d[0])));
}

template <GgmlType T>
inline float block_dot(const uint8_t* b, const Q8Block& x, __m256& acc) {
  const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q));
  if constexpr (T == GgmlType::kQ4_0) {
    const __m256i w = _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
    acc = _mm256_fmadd_ps(scales(f16(b), x), _mm256_cvtepi32_ps(dot_s8s8(w, qx)), acc);
    return 0.0f;
  } else if constexpr (T == GgmlType::kQ4_1) {
    acc = _mm256_fmadd_ps(scales(f16(b), x), _mm256_cvtepi32_ps(dot_u8s8(nibbles(b + 4), qx)), acc);
    return f16(b + 2) * x.s;
  } else if constexpr (T == GgmlType::kQ5_0) {
    const __m256i w = _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)), _mm256_set1_epi8(16));
    acc = _mm256_fmadd_ps(scales(f16(b), x), _mm256_cvtepi32_ps(dot_s8s8(w, qx)), acc);
    return 0.0f;
  } else if constexpr (T == GgmlType::kQ5_1) {
    const __m256i w = _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4));
    acc = _mm256_fmadd_ps(scales(f16(b), x), _mm256_cvtepi32_ps(dot_u8s8(w, qx)), acc);
    return f16(b + 2) * x.s;
  } else {  // q8_0
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    acc = _mm256_fmadd_ps(scales(f16(b), x), _mm256_cvtepi32_ps(dot_s8s8(w, qx)), acc);
    return 0.0f;
  }
}

template <GgmlType T>
constexpr size_t kBlockBytes = T == GgmlType::kQ4_0 ? 18 : T == GgmlType::kQ4_1 ? 20 : T == GgmlType::kQ5_0 ? 22
                               : T == GgmlType::kQ5_1 ? 24 : 34;

// Rows [r0, r1) against n activation vectors; each row is read once for all of them.
template <GgmlType T>
void rows_int(const QMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int64_t t = 0; t < n; ++t) {
      const Q8Block* x = xq + t * nb;
      __m256 acc = _mm256_setzero_ps();
      float offset = 0.0f;
      for (int64_t i = 0; i < nb; ++i) offset += block_dot<T>(row + i * kBlockBytes<T>, x[i], acc);
      y[t * y_stride + r] = hsum(acc) + offset;
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
