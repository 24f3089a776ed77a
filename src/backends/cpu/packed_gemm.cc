// f32 GEMM over 16-column panels of B with a 6x16 register tile (packed_gemm.h).
#include "packed_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/flags.h"
#include "kiln/core/parallel.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KILN_PACKED_GEMM_AVX2 1
#endif

namespace kiln::cpu::packed_gemm {
namespace {

constexpr int64_t kPanel = 16;                // columns of B per panel
constexpr int64_t kRows = 6;                  // rows of the register tile
constexpr int64_t kKBlock = 512;              // a panel's block: 512 x 16 floats (128-1024: level)
constexpr int64_t kMinMacsPerThread = 65536;  // below this a second thread costs more than it gains

#ifdef KILN_PACKED_GEMM_AVX2
// c[0:R, 0:ncols] (+)= op(a)[0:R, 0:kc] @ b[0:kc, 0:16], then + bias and ReLU when
// given (the last K block). op(a)(i, k) = a[i * lda + k], or a[k * lda + i] when TA.
// b: kc rows of 16 floats. accumulate: add to what c holds (a later K block).
template <int R, bool TA>
void tile(const float* a, int64_t lda, const float* b, int64_t kc, float* c, int64_t ldc, int64_t ncols,
          bool accumulate, const float* bias, bool relu) {
  static_assert(R >= 1 && R <= kRows);
  const __m256 z = _mm256_setzero_ps();
  __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * kPanel), b1 = _mm256_loadu_ps(b + k * kPanel + 8);
#define KILN_ROW(r)                                                               \
  if constexpr (R > r) {                                                          \
    const __m256 x = _mm256_broadcast_ss(TA ? a + k * lda + r : a + r * lda + k); \
    c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0);                                    \
    c##r##1 = _mm256_fmadd_ps(x, b1, c##r##1);                                    \
  }
    KILN_ROW(0) KILN_ROW(1) KILN_ROW(2) KILN_ROW(3) KILN_ROW(4) KILN_ROW(5)
#undef KILN_ROW
  }
  const __m256 acc[kRows][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if (ncols == kPanel) {
    const __m256 bias0 = bias ? _mm256_loadu_ps(bias) : z, bias1 = bias ? _mm256_loadu_ps(bias + 8) : z;
    for (int r = 0; r < R; ++r) {
      float* cr = c + r * ldc;
      __m256 o0 = acc[r][0], o1 = acc[r][1];
      if (accumulate) o0 = _mm256_add_ps(o0, _mm256_loadu_ps(cr)), o1 = _mm256_add_ps(o1, _mm256_loadu_ps(cr + 8));
      if (bias) o0 = _mm256_add_ps(o0, bias0), o1 = _mm256_add_ps(o1, bias1);
      if (relu) o0 = _mm256_max_ps(z, o0), o1 = _mm256_max_ps(z, o1);  // NaN stays NaN
      _mm256_storeu_ps(cr, o0);
      _mm256_storeu_ps(cr + 8, o1);
    }
    return;
  }
  // The last panel's ncols < 16 columns, through masks (bias is read within them too).
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols)), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols) - 8), lane);
  const __m256 bias0 = bias ? _mm256_maskload_ps(bias, m0) : z, bias1 = bias ? _mm256_maskload_ps(bias + 8, m1) : z;
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    __m256 o0 = acc[r][0], o1 = acc[r][1];
    if (accumulate)
      o0 = _mm256_add_ps(o0, _mm256_maskload_ps(cr, m0)), o1 = _mm256_add_ps(o1, _mm256_maskload_ps(cr + 8, m1));
    if (bias) o0 = _mm256_add_ps(o0, bias0), o1 = _mm256_add_ps(o1, bias1);
    if (relu) o0 = _mm256_max_ps(z, o0), o1 = _mm256_max_ps(z, o1);  // NaN stays NaN
    _mm256_maskstore_ps(cr, m0, o0);
    _mm256_maskstore_ps(cr + 8, m1, o1);
  }
}

template <bool TA>
using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, bool, const float*,
                        bool);

template <bool TA>
constexpr TileFn<TA> kTiles[kRows + 1] = {nullptr,     tile<1, TA>, tile<2, TA>, tile<3, TA>,
                                          tile<4, TA>, tile<5, TA>, tile<6, TA>};

// Rows [r0, r1) x panels [p0, p1) of c, K blocks outermost within a panel so the
// block of B stays in L1 across the row groups.
template <bool TA>
void panels(const float* a, int64_t M, int64_t K, int64_t N, const float* packed, const float* bias, bool relu,
            float* c, int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
  const int64_t blocks = (K + kKBlock - 1) / kKBlock, kc = (K + blocks - 1) / blocks;  // balanced blocks
  const int64_t lda = TA ? M : K;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kPanel, ncols = std::min(kPanel, N - n0);
    const float* panel = packed + p * K * kPanel;
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
      const int64_t kn = std::min(kc, K - k0);
      const bool last = k0 + kn == K;
      for (int64_t i = r0; i < r1; i += kRows) {
        const float* ai = TA ? a + k0 * lda + i : a + i * lda + k0;
        kTiles<TA>[std::min(kRows, r1 - i)](ai, lda, panel + k0 * kPanel, kn, c + i * N + n0, N, ncols, k0 > 0,
                                            last && bias ? bias + n0 : nullptr, last && relu);
      }
    }
  }
}
#endif

}  // namespace

bool available() {
#ifdef KILN_PACKED_GEMM_AVX2
  return kernel_preferences().packed_gemm;
#else
  return false;
#endif
}

size_t packed_size(int64_t K, int64_t N) { return static_cast<size_t>((N + kPanel - 1) / kPanel * K * kPanel); }

void pack(const float* b, int64_t K, int64_t N, bool trans_b, float* packed) {
  const int64_t P = (N + kPanel - 1) / kPanel;
  parallel_for(P, std::max<int64_t>(1, 16384 / std::max<int64_t>(K * kPanel, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
      float* dst = packed + p * K * kPanel;
      if (cols < kPanel) std::memset(dst, 0, static_cast<size_t>(K * kPanel) * sizeof(float));
      if (trans_b) {
        for (int64_t j = 0; j < cols; ++j) {
          const float* src = b + (n0 + j) * K;
          for (int64_t k = 0; k < K; ++k) dst[k * kPanel + j] = src[k];
        }
      } else {
        for (int64_t k = 0; k < K; ++k) std::memcpy(dst + k * kPanel, b + k * N + n0, static_cast<size_t>(cols) * 4);
      }
    }
  });
}

void run(const float* a, bool trans_a, int64_t M, int64_t K, int64_t N, const float* packed, const float* bias,
         bool relu, float* c) {
#ifdef KILN_PACKED_GEMM_AVX2
  const bool wide = cpu_has(CpuIsa::kAvx512);
  const int64_t rows = wide ? detail::kAvx512Rows : kRows;
  const int64_t P = (N + kPanel - 1) / kPanel, groups = (M + rows - 1) / rows;
  const int64_t threads = std::min<int64_t>(num_threads(), std::max<int64_t>(1, M * K * N / kMinMacsPerThread));
  auto body = [&](int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
    if (wide)
      detail::panels_avx512(trans_a, a, M, K, N, packed, bias, relu, c, p0, p1, r0, r1);
    else
      (trans_a ? panels<true> : panels<false>)(a, M, K, N, packed, bias, relu, c, p0, p1, r0, r1);
  };
  // The AVX-512 tile takes panels in fours: threads split those groups, not panels.
  const int64_t per_unit = wide ? detail::kAvx512Panels : 1, units = (P + per_unit - 1) / per_unit;
  if (units >= threads) {  // by panels: each thread's share of B stays in its L2 from call to call
    parallel_for(units, std::max<int64_t>(1, units / threads), [&](int64_t lo, int64_t hi) {
      body(lo * per_unit, std::min(P, hi * per_unit), 0, M);
    });
    return;
  }
  parallel_for(groups, std::max<int64_t>(1, groups / threads),
               [&](int64_t lo, int64_t hi) { body(0, P, lo * rows, std::min(M, hi * rows)); });
#else
  (void)a, (void)trans_a, (void)M, (void)K, (void)N, (void)packed, (void)bias, (void)relu, (void)c;
  std::abort();  // available() is false without AVX2
#endif
}

}  // namespace kiln::cpu::packed_gemm
