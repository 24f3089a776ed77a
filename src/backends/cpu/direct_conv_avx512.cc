// The direct convolution's AVX-512 register tile (direct_conv_tiles.h): up to six output
// pixels x up to four 16-channel blocks of the packed filter (24 zmm accumulators; a k
// step loads four filter rows and broadcasts six inputs for 24 FMAs, where the AVX2 tile
// does 12 half-width FMAs for two loads and six broadcasts), and the filter gradient's
// tile of the same shape (six rows of dw x up to 64 channels). Shared by the direct
// convolution and the Winograd path's 16 products. Compiled with AVX-512 F/BW/VL/DQ
// enabled and only called when cpu_has(kAvx512).
#include <immintrin.h>

#include <cstdint>

#define KILN_DIRECT_CONV_SIZES_ONLY  // not the AVX2 tiles (direct_conv_tiles.h says why)
#include "direct_conv_tiles.h"

namespace kiln::cpu::direct_conv::detail {
namespace {

template <int R, int NB>
void tile(const float* in, int64_t ldr, int64_t c, int64_t kh, int64_t kwc, const float* w, int64_t wstride,
          const float* bias, float* out, int64_t ldo, bool relu) {
  static_assert(R >= 1 && R <= kMaxTile && NB >= 1 && NB <= kAvx512Blocks);
  const __m512 b0 = _mm512_loadu_ps(bias), b1 = NB > 1 ? _mm512_loadu_ps(bias + 16) : b0,
               b2 = NB > 2 ? _mm512_loadu_ps(bias + 32) : b0, b3 = NB > 3 ? _mm512_loadu_ps(bias + 48) : b0;
  // Named accumulators (GCC spills an array of them in a runtime loop).
  __m512 a00 = b0, a01 = b1, a02 = b2, a03 = b3, a10 = b0, a11 = b1, a12 = b2, a13 = b3, a20 = b0, a21 = b1,
         a22 = b2, a23 = b3, a30 = b0, a31 = b1, a32 = b2, a33 = b3, a40 = b0, a41 = b1, a42 = b2, a43 = b3,
         a50 = b0, a51 = b1, a52 = b2, a53 = b3;
  for (int64_t i = 0; i < kh; ++i) {
    const float* ip = in + i * ldr;
    const float* wp = w + i * kwc * kBlock;
    const float* wp2 = wp + 2 * wstride;
#pragma GCC unroll 2
    for (int64_t j = 0; j < kwc; ++j) {
      const __m512 w0 = _mm512_loadu_ps(wp + j * kBlock);
      const __m512 w1 = NB > 1 ? _mm512_loadu_ps(wp + wstride + j * kBlock) : w0;
      const __m512 w2 = NB > 2 ? _mm512_loadu_ps(wp2 + j * kBlock) : w0;
      const __m512 w3 = NB > 3 ? _mm512_loadu_ps(wp2 + wstride + j * kBlock) : w0;
#define KILN_STEP(r)                                                    \
  if constexpr (R > r) {                                                \
    const __m512 x = _mm512_set1_ps(ip[r * c + j]);                     \
    a##r##0 = _mm512_fmadd_ps(x, w0, a##r##0);                          \
    if constexpr (NB > 1) a##r##1 = _mm512_fmadd_ps(x, w1, a##r##1);    \
    if constexpr (NB > 2) a##r##2 = _mm512_fmadd_ps(x, w2, a##r##2);    \
    if constexpr (NB > 3) a##r##3 = _mm512_fmadd_ps(x, w3, a##r##3);    \
  }
      KILN_STEP(0) KILN_STEP(1) KILN_STEP(2) KILN_STEP(3) KILN_STEP(4) KILN_STEP(5)
#undef KILN_STEP
    }
  }
  const __m512 z = _mm512_setzero_ps();
  const __m512 acc[kMaxTile][kAvx512Blocks] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23},
                                               {a30, a31, a32, a33}, {a40, a41, a42, a43}, {a50, a51, a52, a53}};
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) {
      __m512 o = acc[r][b];
      // ReLU as a masked zeroing of the negative lanes (NaN stays NaN, as the AVX2 tile's
      // max; GCC 12 warns on _mm512_max_ps's undefined source).
      if (relu) o = _mm512_mask_mov_ps(o, _mm512_cmp_ps_mask(o, z, _CMP_LT_OQ), z);
      _mm512_storeu_ps(out + r * ldo + b * kBlock, o);
    }
}

// The filter gradient: R rows m of dw x NB blocks of 16 columns, dw[m][0..16*NB) += sum
// over the block's output pixels of xpad[pixel + off[m]] * dy[pixel][0..16*NB).
template <int R, int NB>
void grad_tile(const float* xpad, const int64_t* off, int64_t row, int64_t c, int64_t rows, int64_t ow,
               const float* dy, int64_t o, float* dw) {
  static_assert(R >= 1 && R <= kMaxTile && NB >= 1 && NB <= kAvx512Blocks);
  const int64_t o0 = off[0], o1 = R > 1 ? off[1] : 0, o2 = R > 2 ? off[2] : 0, o3 = R > 3 ? off[3] : 0,
                o4 = R > 4 ? off[4] : 0, o5 = R > 5 ? off[5] : 0;
  const __m512 z = _mm512_setzero_ps();
  __m512 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z, a20 = z, a21 = z, a22 = z, a23 = z,
         a30 = z, a31 = z, a32 = z, a33 = z, a40 = z, a41 = z, a42 = z, a43 = z, a50 = z, a51 = z, a52 = z, a53 = z;
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = xpad + i * row;
    const float* dr = dy + i * ow * o;
#pragma GCC unroll 2
    for (int64_t j = 0; j < ow; ++j) {
      const float* xp = xr + j * c;
      const float* dp = dr + j * o;
      const __m512 d0 = _mm512_loadu_ps(dp), d1 = NB > 1 ? _mm512_loadu_ps(dp + 16) : z,
                   d2 = NB > 2 ? _mm512_loadu_ps(dp + 32) : z, d3 = NB > 3 ? _mm512_loadu_ps(dp + 48) : z;
#define KILN_STEP(r)                                                    \
  if constexpr (R > r) {                                                \
    const __m512 v = _mm512_set1_ps(xp[o##r]);                          \
    a##r##0 = _mm512_fmadd_ps(v, d0, a##r##0);                          \
    if constexpr (NB > 1) a##r##1 = _mm512_fmadd_ps(v, d1, a##r##1);    \
    if constexpr (NB > 2) a##r##2 = _mm512_fmadd_ps(v, d2, a##r##2);    \
    if constexpr (NB > 3) a##r##3 = _mm512_fmadd_ps(v, d3, a##r##3);    \
  }
      KILN_STEP(0) KILN_STEP(1) KILN_STEP(2) KILN_STEP(3) KILN_STEP(4) KILN_STEP(5)
#undef KILN_STEP
    }
  }
  const __m512 acc[kMaxTile][kAvx512Blocks] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23},
                                               {a30, a31, a32, a33}, {a40, a41, a42, a43}, {a50, a51, a52, a53}};
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) {
      float* d = dw + r * o + b * kBlock;
      _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), acc[r][b]));
    }
}

using Fn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const float*, float*,
                    int64_t, bool);
using GradFn = void (*)(const float*, const int64_t*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t,
                        float*);
template <int NB>
constexpr GradFn kGradByWidth[kMaxTile + 1] = {nullptr,          grad_tile<1, NB>, grad_tile<2, NB>, grad_tile<3, NB>,
                                               grad_tile<4, NB>, grad_tile<5, NB>, grad_tile<6, NB>};
constexpr const GradFn* kGradByBlocks[kAvx512Blocks + 1] = {nullptr, kGradByWidth<1>, kGradByWidth<2>,
                                                            kGradByWidth<3>, kGradByWidth<4>};

template <int NB>
constexpr Fn kByWidth[kMaxTile + 1] = {nullptr,      tile<1, NB>, tile<2, NB>, tile<3, NB>,
                                       tile<4, NB>, tile<5, NB>, tile<6, NB>};
constexpr const Fn* kByBlocks[kAvx512Blocks + 1] = {nullptr, kByWidth<1>, kByWidth<2>, kByWidth<3>, kByWidth<4>};

}  // namespace

void tile_avx512(int64_t r, int64_t nb, const float* in, int64_t ldr, int64_t c, int64_t kh, int64_t kwc,
                 const float* w, int64_t wstride, const float* bias, float* out, int64_t ldo, bool relu) {
  kByBlocks[nb][r](in, ldr, c, kh, kwc, w, wstride, bias, out, ldo, relu);
}

void grad_tile_avx512(int64_t r, int64_t nb, const float* xpad, const int64_t* off, int64_t row, int64_t c,
                      int64_t rows, int64_t ow, const float* dy, int64_t o, float* dw) {
  kGradByBlocks[nb][r](xpad, off, row, c, rows, ow, dy, o, dw);
}

}  // namespace kiln::cpu::direct_conv::detail
