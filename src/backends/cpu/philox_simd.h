#pragma once
// Philox4x32-10 for a batch of consecutive counters at once (internal): bit-identical to
// kiln::Philox::block, vectorised with AVX2 (two independent 8-lane chains hide the
// multiply latency) and a portable `omp simd` fallback. Used by the random ops and
// dropout.
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kiln::cpu::philox {

constexpr int kBatch = 16;  // Philox blocks per batch

// out.w[k][j] is word k of block (hi, lo0 + j).
struct Words {
  alignas(64) uint32_t w[4][kBatch];
};

// Philox4x32-10 for blocks (hi, lo0 + j), j < kBatch; identical to kiln::Philox::block.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u, kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
#if defined(__AVX2__)
// 32x32 -> 64-bit products of the 8 lanes of a with m: high and low halves.
inline void mul_hilo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}
// Two independent 8-lane chains per round hide the multiply latency.
inline void philox_batch(uint64_t key, uint64_t hi, uint64_t lo0, Words& out) {
  constexpr int V = kBatch / 8;
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kPhiloxM1));
  alignas(32) uint32_t lo_w[kBatch], hi_w[kBatch];
  for (int j = 0; j < kBatch; ++j) {
    const uint64_t c = lo0 + static_cast<uint64_t>(j);
    lo_w[j] = static_cast<uint32_t>(c);
    hi_w[j] = static_cast<uint32_t>(c >> 32);
  }
  __m256i c0[V], c1[V], c2[V], c3[V];
  for (int v = 0; v < V; ++v) {
    c0[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_w + 8 * v));
    c1[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_w + 8 * v));
    c2[v] = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(hi)));
    c3[v] = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(hi >> 32)));
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const __m256i kk0 = _mm256_set1_epi32(static_cast<int>(k0)), kk1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int v = 0; v < V; ++v) {
      __m256i h0, l0, h1, l1;
      mul_hilo(c0[v], m0, h0, l0);
      mul_hilo(c2[v], m1, h1, l1);
      c0[v] = _mm256_xor_si256(_mm256_xor_si256(h1, c1[v]), kk0);
      c2[v] = _mm256_xor_si256(_mm256_xor_si256(h0, c3[v]), kk1);
      c1[v] = l1;
      c3[v] = l0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int v = 0; v < V; ++v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.w[0] + 8 * v), c0[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.w[1] + 8 * v), c1[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.w[2] + 8 * v), c2[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out.w[3] + 8 * v), c3[v]);
  }
}
#else
inline void philox_batch(uint64_t key, uint64_t hi, uint64_t lo0, Words& out) {
  const uint32_t key0 = static_cast<uint32_t>(key), key1 = static_cast<uint32_t>(key >> 32);
  const uint32_t hi0 = static_cast<uint32_t>(hi), hi1 = static_cast<uint32_t>(hi >> 32);
#pragma omp simd
  for (int j = 0; j < kBatch; ++j) {
    const uint64_t lo = lo0 + static_cast<uint64_t>(j);
    uint32_t c0 = static_cast<uint32_t>(lo), c1 = static_cast<uint32_t>(lo >> 32), c2 = hi0, c3 = hi1;
    uint32_t k0 = key0, k1 = key1;
    for (int r = 0; r < 10; ++r) {
      const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
      const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    out.w[0][j] = c0;
    out.w[1][j] = c1;
    out.w[2][j] = c2;
    out.w[3][j] = c3;
  }
}
#endif

}  // namespace kiln::cpu::philox
