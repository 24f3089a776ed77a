// packed_gemm's AVX-512 tiles (packed_gemm.h): the same 16-column panels of B, one zmm
// register a panel row, and a 6x64 register tile (four panels side by side: 24 zmm
// accumulators, four loads of B and six broadcasts of A for 24 FMAs a k; a 12x32 tile
// measured slower: its twelve row pointers of A do not fit the general registers). This
// file is compiled with AVX-512 F/BW/VL/DQ enabled and only called when cpu_has(kAvx512).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "packed_gemm.h"

namespace kiln::cpu::packed_gemm::detail {
namespace {

constexpr int64_t kPanel = 16;
constexpr int64_t kRows = kAvx512Rows;  // rows of the register tile
constexpr int kTilePanels = kAvx512Panels;  // panels of the register tile
// A block of four panels: 128 x 64 floats (32 KiB) stays in L1 while the row groups pass.
constexpr int64_t kKBlock = 128;

__mmask16 cols_mask(int64_t cols) {
  return cols >= kPanel ? static_cast<__mmask16>(0xFFFF)
                        : static_cast<__mmask16>((1u << std::max<int64_t>(cols, 0)) - 1);
}

// c[0:R, 0:ncols] (+)= op(a)[0:R, 0:kc] @ [b_0 | .. | b_NP-1][0:kc, 0:16*NP], then bias
// and ReLU when given (the last K block). op(a)(i, k) = a[i * lda + k], or a[k * lda + i]
// when TA. Panel j's block starts at b + j * bs: kc rows of 16 floats.
template <int R, int NP, bool TA>
void tile(const float* a, int64_t lda, const float* b, int64_t bs, int64_t kc, float* c, int64_t ldc, int64_t ncols,
          bool accumulate, const float* bias, bool relu) {
  static_assert(R >= 1 && R <= kRows && NP >= 1 && NP <= kTilePanels);
  const __m512 z = _mm512_setzero_ps();
  // Named accumulators (GCC spills an array of them in a runtime loop).
  __m512 c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z, c22 = z, c23 = z,
         c30 = z, c31 = z, c32 = z, c33 = z, c40 = z, c41 = z, c42 = z, c43 = z, c50 = z, c51 = z, c52 = z, c53 = z;
  const float* b2 = b + 2 * bs;
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 v0 = _mm512_loadu_ps(b + k * kPanel);
    const __m512 v1 = NP > 1 ? _mm512_loadu_ps(b + bs + k * kPanel) : z;
    const __m512 v2 = NP > 2 ? _mm512_loadu_ps(b2 + k * kPanel) : z;
    const __m512 v3 = NP > 3 ? _mm512_loadu_ps(b2 + bs + k * kPanel) : z;
#define KILN_ROW(r)                                                        \
  if constexpr (R > r) {                                                   \
    const __m512 x = _mm512_set1_ps(TA ? a[k * lda + r] : a[r * lda + k]); \
    c##r##0 = _mm512_fmadd_ps(x, v0, c##r##0);                             \
    if constexpr (NP > 1) c##r##1 = _mm512_fmadd_ps(x, v1, c##r##1);       \
    if constexpr (NP > 2) c##r##2 = _mm512_fmadd_ps(x, v2, c##r##2);       \
    if constexpr (NP > 3) c##r##3 = _mm512_fmadd_ps(x, v3, c##r##3);       \
  }
    KILN_ROW(0) KILN_ROW(1) KILN_ROW(2) KILN_ROW(3) KILN_ROW(4) KILN_ROW(5)
#undef KILN_ROW
  }
  const __m512 acc[kRows][kTilePanels] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23},
                                          {c30, c31, c32, c33}, {c40, c41, c42, c43}, {c50, c51, c52, c53}};
  for (int j = 0; j < NP; ++j) {
    const __mmask16 m = cols_mask(ncols - j * kPanel);
    const bool full = m == 0xFFFF;
    const __m512 bj = bias ? _mm512_maskz_loadu_ps(m, bias + j * kPanel) : z;
    for (int r = 0; r < R; ++r) {
      float* cr = c + r * ldc + j * kPanel;
      __m512 o = acc[r][j];
      if (accumulate) o = _mm512_add_ps(o, full ? _mm512_loadu_ps(cr) : _mm512_maskz_loadu_ps(m, cr));
      if (bias) o = _mm512_add_ps(o, bj);
      // ReLU as a masked zeroing of the negative lanes: NaN and -0 stay as they are, as in
      // the AVX2 tile's max(0, o) (and GCC 12 warns on _mm512_max_ps's undefined source).
      if (relu) o = _mm512_mask_mov_ps(o, _mm512_cmp_ps_mask(o, z, _CMP_LT_OQ), z);
      if (full)
        _mm512_storeu_ps(cr, o);
      else
        _mm512_mask_storeu_ps(cr, m, o);
    }
  }
}

template <int NP, bool TA>
using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int64_t, bool,
                        const float*, bool);

template <int NP, bool TA>
constexpr TileFn<NP, TA> kTiles[kRows + 1] = {nullptr,         tile<1, NP, TA>, tile<2, NP, TA>, tile<3, NP, TA>,
                                              tile<4, NP, TA>, tile<5, NP, TA>, tile<6, NP, TA>};

template <bool TA>
constexpr const TileFn<1, TA>* kTilesByPanels[kTilePanels + 1] = {nullptr, kTiles<1, TA>, kTiles<2, TA>,
                                                                  kTiles<3, TA>, kTiles<4, TA>};

template <bool TA>
void panels_impl(const float* a, int64_t M, int64_t K, int64_t N, const float* packed, const float* bias, bool relu,
                 float* c, int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
  const int64_t blocks = (K + kKBlock - 1) / kKBlock, kc = (K + blocks - 1) / blocks;  // balanced blocks
  const int64_t lda = TA ? M : K, bs = K * kPanel;
  for (int64_t p = p0; p < p1; p += kTilePanels) {
    const int64_t np = std::min<int64_t>(kTilePanels, p1 - p);
    const int64_t n0 = p * kPanel, ncols = std::min(np * kPanel, N - n0);
    const auto* tiles = kTilesByPanels<TA>[np];
    const float* panel = packed + p * bs;
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
      const int64_t kn = std::min(kc, K - k0);
      const bool last = k0 + kn == K;
      for (int64_t i = r0; i < r1; i += kRows) {
        const float* ai = TA ? a + k0 * lda + i : a + i * lda + k0;
        tiles[std::min(kRows, r1 - i)](ai, lda, panel + k0 * kPanel, bs, kn, c + i * N + n0, N, ncols, k0 > 0,
                                       last && bias ? bias + n0 : nullptr, last && relu);
      }
    }
  }
}

}  // namespace

void panels_avx512(bool trans_a, const float* a, int64_t M, int64_t K, int64_t N, const float* packed,
                   const float* bias, bool relu, float* c, int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
  (trans_a ? panels_impl<true> : panels_impl<false>)(a, M, K, N, packed, bias, relu, c, p0, p1, r0, r1);
}

}  // namespace kiln::cpu::packed_gemm::detail
