#pragma once
// Multiply-adds at the FMA peak, for benchmarks that compare kernels with it: 12
// independent chains of 256- or 512-bit FMAs on each of `threads` OpenMP threads (two
// FMA pipes x 4-6 cycles of latency), `steps` FMAs a chain, no memory traffic. Each
// returns a value that depends on every chain. fma_chains512 needs a CPU with AVX-512F
// (the caller checks kiln::cpu_has).
#include <immintrin.h>
#include <omp.h>

#include <cstdint>

namespace kiln::bench {

inline float fma_chains256(int64_t steps, int threads) {
  float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    __m256 a[12];
    for (int k = 0; k < 12; ++k) a[k] = _mm256_set1_ps(1.0f + 0.1f * k + 0.01f * omp_get_thread_num());
    const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
    for (int64_t i = 0; i < steps; ++i)
      for (auto& x : a) x = _mm256_fmadd_ps(x, mul, add);
    for (int k = 1; k < 12; ++k) a[0] = _mm256_add_ps(a[0], a[k]);
    sink += _mm256_cvtss_f32(a[0]);
  }
  return sink;
}

// One thread's 512-bit chains (the target attribute does not reach an OpenMP region's body).
__attribute__((target("avx512f"))) inline float fma_chains512_one(int64_t steps, int t) {
  __m512 a[12];
  for (int k = 0; k < 12; ++k) a[k] = _mm512_set1_ps(1.0f + 0.1f * k + 0.01f * t);
  const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < steps; ++i)
    for (auto& x : a) x = _mm512_fmadd_ps(x, mul, add);
  for (int k = 1; k < 12; ++k) a[0] = _mm512_add_ps(a[0], a[k]);
  return _mm512_cvtss_f32(a[0]);
}

inline float fma_chains512(int64_t steps, int threads) {
  float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += fma_chains512_one(steps, omp_get_thread_num());
  return sink;
}

}  // namespace kiln::bench
