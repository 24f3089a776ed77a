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

// ---- Group kernels over packed matrices (layout: PackFormat in quant_kernels.h) ----

// The vector operations of one instruction set: 16 int32/float lanes on AVX-512, 8 on
// AVX2. A lane is one weight row; every lane runs the same sequence in both forms.
#if defined(__AVX512F__)
struct Lanes {
  static constexpr int kWidth = 16;
  using I = __m512i;
  using F = __m512;
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I low_nibbles(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static I set(int32_t v) { return _mm512_set1_epi32(v); }
  static I zero() { return _mm512_setzero_si512(); }
  // acc + per lane the dot of 4 unsigned weight bytes with 4 signed activation bytes.
  static I dot(I acc, I w, I x) { return _mm512_dpbusd_epi32(acc, w, x); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F set(float v) { return _mm512_set1_ps(v); }
  static F zerof() { return _mm512_setzero_ps(); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F load_f32(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static F load_f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#else
struct Lanes {
  static constexpr int kWidth = 8;
  using I = __m256i;
  using F = __m256;
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I low_nibbles(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static I set(int32_t v) { return _mm256_set1_epi32(v); }
  static I zero() { return _mm256_setzero_si256(); }
  // Weights up to 63 x activations up to 127, two per int16: no saturation.
  static I dot(I acc, I w, I x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F set(float v) { return _mm256_set1_ps(v); }
  static F zerof() { return _mm256_setzero_ps(); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F load_f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static F load_f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};
#endif

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Lanes `sub * kWidth ...` of one 16-row group against NT tokens: out[t][lane].
template <GgmlType T, int NT>
inline void group_tile(const uint8_t* rec, int64_t nb, int sub, const Q8Block* const* x, float* const* out) {
  using V = Lanes;
  constexpr PackFormat F = pack_format(T);
  constexpr int W = V::kWidth;
  // q8_0's weights are q + 128 (up to 255): AVX2's maddubs would saturate, so there the
  // dot uses |q| against the activation with q's sign (exact, the same integer).
  constexpr bool kSignTrick = W == 8 && F.zero_point == 128;
  typename V::F acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = V::zerof();
  const size_t lane_q = static_cast<size_t>(sub) * W * 4, lane_s = static_cast<size_t>(sub) * W * F.scale_bytes();
  for (int64_t b = 0; b < nb; ++b, rec += F.record_bytes()) {
    typename V::I w[8];
    [[maybe_unused]] typename V::I ws[8];
    if constexpr (F.nibbles) {
      for (int j = 0; j < 4; ++j) {
        const typename V::I v = V::load(rec + 64 * j + lane_q);
        w[j] = V::low_nibbles(v);
        w[j + 4] = V::high_nibbles(v);
      }
    } else {
      for (int j = 0; j < 8; ++j) w[j] = V::load(rec + 64 * j + lane_q);
    }
    if constexpr (kSignTrick) {
#if !defined(__AVX512F__)
      for (int j = 0; j < 8; ++j) {
        ws[j] = _mm256_xor_si256(w[j], _mm256_set1_epi8(static_cast<char>(0x80)));
        w[j] = _mm256_abs_epi8(ws[j]);
      }
#endif
    }
    const uint8_t* sc = rec + F.q_bytes();
    auto scale = [&](const uint8_t* p) { return F.f16_scales ? V::load_f16(p) : V::load_f32(p); };
    const typename V::F d0 = scale(sc + lane_s);
    typename V::F d1 = d0, mn = d0;
    if constexpr (F.half_scales) d1 = scale(sc + kGroupRows * F.scale_bytes() + lane_s);
    if constexpr (F.with_min) mn = scale(sc + F.d_bytes() + lane_s);
    for (int t = 0; t < NT; ++t) {
      const Q8Block& xb = x[t][b];
      typename V::I i0, i1;
      if constexpr (F.zero_point == 0 || kSignTrick) {
        i0 = i1 = V::zero();
      } else {
        i0 = V::set(-F.zero_point * xb.isum[0]);
        i1 = V::set(-F.zero_point * xb.isum[1]);
      }
      for (int j = 0; j < 4; ++j) {
        typename V::I x0 = V::set(load4(xb.q + 4 * j)), x1 = V::set(load4(xb.q + 16 + 4 * j));
        if constexpr (kSignTrick) {
#if !defined(__AVX512F__)
          x0 = _mm256_sign_epi8(x0, ws[j]);
          x1 = _mm256_sign_epi8(x1, ws[j + 4]);
#endif
        }
        i0 = V::dot(i0, w[j], x0);
        i1 = V::dot(i1, w[j + 4], x1);
      }
      if constexpr (F.half_scales) {
        acc[t] = V::fma(V::mul(V::cvt(i0), V::set(xb.d[0])), d0, acc[t]);
        acc[t] = V::fma(V::mul(V::cvt(i1), V::set(xb.d[4])), d1, acc[t]);
      } else {
        const typename V::F s = V::fma(V::cvt(i1), V::set(xb.d[4]), V::mul(V::cvt(i0), V::set(xb.d[0])));
        acc[t] = V::fma(s, d0, acc[t]);
      }
      if constexpr (F.with_min) acc[t] = V::fma(mn, V::set(xb.s), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) V::store(out[t], acc[t]);
}

// Groups [g0, g1) against n tokens, in tiles of up to 8 (AVX2: 4) tokens.
template <GgmlType T>
void groups_int(const PackedMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t g0, int64_t g1) {
  constexpr int W = Lanes::kWidth, kTile = W == 16 ? 8 : 4;
  const int64_t nb = w.cols() / 32;
  float pad[kTile][W];  // the last group's rows past w.rows()
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* rec = w.group(g);
    for (int sub = 0; sub < kGroupRows / W; ++sub) {
      const int64_t r = g * kGroupRows + sub * W;
      if (r >= w.rows()) break;
      const bool partial = r + W > w.rows();
      auto tile = [&]<int NT>(int64_t t0) {
        const Q8Block* x[NT];
        float* out[NT];
        for (int j = 0; j < NT; ++j) {
          x[j] = xq + (t0 + j) * nb;
          out[j] = partial ? pad[j] : y + (t0 + j) * y_stride + r;
        }
        group_tile<T, NT>(rec, nb, sub, x, out);
        if (partial)
          for (int j = 0; j < NT; ++j)
            for (int64_t l = 0; l < w.rows() - r; ++l) y[(t0 + j) * y_stride + r + l] = pad[j][l];
      };
      int64_t t = 0;
      for (; t + kTile <= n; t += kTile) tile.template operator()<kTile>(t);
      if (n - t >= 4 && kTile > 4) tile.template operator()<4>(t), t += 4;
      if (n - t >= 2) tile.template operator()<2>(t), t += 2;
      if (n - t >= 1) tile.template operator()<1>(t);
    }
  }
}

inline GroupsFn group_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return groups_int<GgmlType::kQ4_0>;
    case GgmlType::kQ4_1: return groups_int<GgmlType::kQ4_1>;
    case GgmlType::kQ5_0: return groups_int<GgmlType::kQ5_0>;
    case GgmlType::kQ5_1: return groups_int<GgmlType::kQ5_1>;
    case GgmlType::kQ8_0: return groups_int<GgmlType::kQ8_0>;
    case GgmlType::kQ4_K: return groups_int<GgmlType::kQ4_K>;
    case GgmlType::kQ5_K: return groups_int<GgmlType::kQ5_K>;
    case GgmlType::kQ6_K: return groups_int<GgmlType::kQ6_K>;
    default: return nullptr;
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
