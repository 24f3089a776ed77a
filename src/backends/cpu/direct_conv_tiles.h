#pragma once
// Internal to the CPU backend: the AVX2 register tiles (and the AVX-512 one's entry point)
// and row buffers shared by the direct convolution (direct_conv.cc) and its Winograd path
// (winograd_conv.cc). The
// tiles exist only in builds with AVX2 and FMA (KILN_DIRECT_CONV_AVX2); the sizes below
// in every build.
#include <cstdint>

namespace kiln::cpu::direct_conv::detail {
inline constexpr int64_t kBlock = 16;            // output channels per tile (two AVX registers)
inline constexpr int64_t kMaxTile = 6;           // output pixels per tile: 12 accumulators
inline constexpr int64_t kPadBytes = 256 << 10;  // padded rows per block: at most this much

// The AVX-512 tile (direct_conv_avx512.cc; call only when cpu_has(kAvx512)): r <= kMaxTile
// output pixels x nb <= kAvx512Blocks blocks of 16 channels, block b's packed filter at
// w + b * wstride, its output at out + b * 16 (bias likewise):
// out[r'*ldo + b*16 + 0..15] = relu?(bias[b*16 + 0..15] + sum over (i < kh, j < kwc) of
// in[i*ldr + r'*c + j] * w[b*wstride + (i*kwc + j)*16 + 0..15]).
inline constexpr int64_t kAvx512Blocks = 4;
void tile_avx512(int64_t r, int64_t nb, const float* in, int64_t ldr, int64_t c, int64_t kh, int64_t kwc,
                 const float* w, int64_t wstride, const float* bias, float* out, int64_t ldo, bool relu);
// The filter gradient's AVX-512 tile: grad_tile<r> below over nb <= kAvx512Blocks blocks
// of 16 columns (dy's and dw's, contiguous).
void grad_tile_avx512(int64_t r, int64_t nb, const float* xpad, const int64_t* off, int64_t row, int64_t c,
                      int64_t rows, int64_t ow, const float* dy, int64_t o, float* dw);
}  // namespace kiln::cpu::direct_conv::detail

// A translation unit compiled for a higher ISA (direct_conv_avx512.cc) defines
// KILN_DIRECT_CONV_SIZES_ONLY: its copies of the inline AVX2 tiles below could be the ones
// the linker keeps, and would then run AVX-512 encodings on AVX2-only CPUs.
#if defined(__AVX2__) && defined(__FMA__) && !defined(KILN_DIRECT_CONV_SIZES_ONLY)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "direct_conv.h"

#define KILN_DIRECT_CONV_AVX2 1

namespace kiln::cpu::direct_conv::detail {

// R output pixels x 16 output channels: out[r*ldo + 0..15] = sum over (kh, j)
// of in[kh*ldr + r*c + j] * w[(kh*kwc + j)*16 + 0..15], j over kw*c (kw and c
// are contiguous in both the padded input row and the packed filter).
template <int R>
void tile(const float* in, int64_t ldr, int64_t c, int64_t kh, int64_t kwc, const float* w, const float* bias,
          float* out, int64_t ldo, bool relu) {
  const __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
  __m256 a00 = b0, a01 = b1, a10 = b0, a11 = b1, a20 = b0, a21 = b1;
  __m256 a30 = b0, a31 = b1, a40 = b0, a41 = b1, a50 = b0, a51 = b1;
  for (int64_t i = 0; i < kh; ++i) {
    const float* ip = in + i * ldr;
    const float* wp = w + i * kwc * kBlock;
    _Pragma("GCC unroll 4") for (int64_t j = 0; j < kwc; ++j) {
      const __m256 w0 = _mm256_loadu_ps(wp + j * kBlock), w1 = _mm256_loadu_ps(wp + j * kBlock + 8);
      __m256 x;
#define KILN_STEP(r)                           \
  if constexpr (R > r) {                       \
    x = _mm256_broadcast_ss(ip + r * c + j);   \
    a##r##0 = _mm256_fmadd_ps(x, w0, a##r##0); \
    a##r##1 = _mm256_fmadd_ps(x, w1, a##r##1); \
  }
      KILN_STEP(0)
      KILN_STEP(1) KILN_STEP(2) KILN_STEP(3) KILN_STEP(4) KILN_STEP(5)
#undef KILN_STEP
    }
  }
  const __m256 z = _mm256_setzero_ps();
#define KILN_STORE(r)                             \
  if constexpr (R > r) {                          \
    if (relu) {                                   \
      a##r##0 = _mm256_max_ps(a##r##0, z);        \
      a##r##1 = _mm256_max_ps(a##r##1, z);        \
    }                                             \
    _mm256_storeu_ps(out + r * ldo, a##r##0);     \
    _mm256_storeu_ps(out + r * ldo + 8, a##r##1); \
  }
  KILN_STORE(0)
  KILN_STORE(1) KILN_STORE(2) KILN_STORE(3) KILN_STORE(4) KILN_STORE(5)
#undef KILN_STORE
}

using TileFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, const float*, const float*, float*, int64_t,
                        bool);
inline constexpr TileFn kTiles[kMaxTile + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// Calls fn(n, r0, r1) for the (image n, output row r) pairs u = n * oh + r in [u0, u1),
// one call per image.
template <typename F>
void by_image(int64_t u0, int64_t u1, int64_t oh, F&& fn) {
  while (u0 < u1) {
    const int64_t n = u0 / oh, r0 = u0 % oh, r1 = std::min(oh, r0 + (u1 - u0));
    fn(n, r0, r1);
    u0 += r1 - r0;
  }
}

// Output rows per block: the block's padded input rows take at most kPadBytes.
inline int64_t block_rows(const Problem& p) {
  const int64_t row = (p.w + p.pl + p.pr) * p.c;
  return std::max<int64_t>(1, kPadBytes / int64_t(sizeof(float) * row) - (p.kh - 1));
}

// The input rows that output rows [b0, b0 + nrows - kh + 1) of image n read, zero-padded,
// in a per-thread buffer: row i is input row b0 - pt + i, (w + pl + pr + extra) * c
// floats (extra: more zero columns on the right).
inline const float* pad_rows(const Problem& p, const float* x, int64_t n, int64_t b0, int64_t nrows,
                             int64_t extra = 0) {
  const int64_t c = p.c, row = (p.w + p.pl + p.pr + extra) * c;
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(nrows * row)) buf.resize(size_t(nrows * row));
  for (int64_t i = 0; i < nrows; ++i) {
    float* d = buf.data() + i * row;
    const int64_t ih = b0 - p.pt + i;
    if (ih < 0 || ih >= p.h) {
      std::memset(d, 0, sizeof(float) * size_t(row));
      continue;
    }
    std::memset(d, 0, sizeof(float) * size_t(p.pl * c));
    std::memcpy(d + p.pl * c, x + ((n * p.h + ih) * p.w) * c, sizeof(float) * size_t(p.w * c));
    std::memset(d + (p.pl + p.w) * c, 0, sizeof(float) * size_t((p.pr + extra) * c));
  }
  return buf.data();
}

// Filter gradient, R rows m of dw [kh*kw*c, o] x 16 columns: dw[m][0..15] += sum over the
// block's output pixels of xpad[pixel + off[m]] * dy[pixel][0..15].
template <int R>
void grad_tile(const float* xpad, const int64_t* off, int64_t row, int64_t c, int64_t rows, int64_t ow, const float* dy,
               int64_t o, float* dw) {
  const int64_t o0 = off[0], o1 = R > 1 ? off[1] : 0, o2 = R > 2 ? off[2] : 0, o3 = R > 3 ? off[3] : 0,
                o4 = R > 4 ? off[4] : 0, o5 = R > 5 ? off[5] : 0;
  __m256 a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51;
#define KILN_LOAD(r)                           \
  if constexpr (R > r) {                       \
    a##r##0 = _mm256_loadu_ps(dw + r * o);     \
    a##r##1 = _mm256_loadu_ps(dw + r * o + 8); \
  }
  KILN_LOAD(0)
  KILN_LOAD(1)
  KILN_LOAD(2)
  KILN_LOAD(3) KILN_LOAD(4) KILN_LOAD(5)
#undef KILN_LOAD
      for (int64_t i = 0; i < rows; ++i) {
    const float* xr = xpad + i * row;
    const float* dr = dy + i * ow * o;
    _Pragma("GCC unroll 2") for (int64_t j = 0; j < ow; ++j) {
      const float* xp = xr + j * c;
      const __m256 d0 = _mm256_loadu_ps(dr + j * o), d1 = _mm256_loadu_ps(dr + j * o + 8);
      __m256 v;
#define KILN_STEP(r)                           \
  if constexpr (R > r) {                       \
    v = _mm256_broadcast_ss(xp + o##r);        \
    a##r##0 = _mm256_fmadd_ps(v, d0, a##r##0); \
    a##r##1 = _mm256_fmadd_ps(v, d1, a##r##1); \
  }
      KILN_STEP(0) KILN_STEP(1) KILN_STEP(2) KILN_STEP(3) KILN_STEP(4) KILN_STEP(5)
#undef KILN_STEP
    }
  }
#define KILN_STORE(r)                          \
  if constexpr (R > r) {                       \
    _mm256_storeu_ps(dw + r * o, a##r##0);     \
    _mm256_storeu_ps(dw + r * o + 8, a##r##1); \
  }
  KILN_STORE(0) KILN_STORE(1) KILN_STORE(2) KILN_STORE(3) KILN_STORE(4) KILN_STORE(5)
#undef KILN_STORE
}

using GradTileFn = void (*)(const float*, const int64_t*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t,
                            float*);
inline constexpr GradTileFn kGradTiles[kMaxTile + 1] = {nullptr,      grad_tile<1>, grad_tile<2>, grad_tile<3>,
                                                        grad_tile<4>, grad_tile<5>, grad_tile<6>};

}  // namespace kiln::cpu::direct_conv::detail

#endif
