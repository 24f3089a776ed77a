// Direct NHWC convolution (direct_conv.h): padded row buffers and a 6x16
// register tile.
#include "direct_conv.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/core/parallel.h"
#include "onednn.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KILN_DIRECT_CONV_AVX2 1
#endif

namespace kiln::cpu::direct_conv {
namespace {

constexpr int64_t kBlock = 16;            // output channels per tile (two AVX registers)
constexpr int64_t kMaxTile = 6;           // output pixels per tile: 12 accumulators
constexpr int64_t kPadBytes = 256 << 10;  // padded rows per block: at most this much

bool enabled() {
  const char* v = std::getenv("KILN_DIRECT_CONV");
  return !(v && v[0] == '0');
}

#ifdef KILN_DIRECT_CONV_AVX2
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
constexpr TileFn kTiles[kMaxTile + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// Whether p takes small_tile: fewer than 8 input channels and kw * c <= kMaxSmallTaps.
constexpr int64_t kMaxSmallTaps = 9;  // 3x3 on RGB
bool few_channels(const Problem& p) { return p.c < 8 && p.kw * p.c <= kMaxSmallTaps; }
// Output channels per filter block: 16 (tile()), or 32 for small_tile when o allows.
int64_t block_width(const Problem& p) { return few_channels(p) && p.o % 32 == 0 ? 32 : kBlock; }

// Few input channels (the first layer: 1 grey or 3 colour channels): kw * c taps per
// filter row, too few for tile()'s runtime loop to pay for its overhead (measured: the
// cnn's 1-channel layer ran slower than oneDNN that way). This tile knows the taps at
// compile time and keeps NB x 8 output channels (a group: 32, or 16 when o is not a
// multiple of 32) of R pixels in registers: out[r*ldo + 0..8NB-1] = sum over (i, j) of
// in[i*ldr + r*c + j] * w[(i*KWC + j)*8NB + 0..8NB-1], j < KWC = kw * c.
template <int KWC, int NB, int R>
void small_tile(const float* in, int64_t ldr, int64_t c, int64_t kh, const float* w, const float* bias, float* out,
                int64_t ldo, bool relu) {
  static_assert((NB == 2 && R <= 6) || (NB == 4 && R <= 3));
  // Named accumulators from zero (an array of them, indexed in loops, GCC 12 spills to
  // the stack on every filter row); the unused ones are dead code.
  const __m256 z = _mm256_setzero_ps();
  __m256 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z, a20 = z, a21 = z, a22 = z, a23 = z;
  __m256 a30 = z, a31 = z, a32 = z, a33 = z, a40 = z, a41 = z, a42 = z, a43 = z, a50 = z, a51 = z, a52 = z, a53 = z;
  for (int64_t i = 0; i < kh; ++i) {
    const float* ip = in + i * ldr;
    const float* wp = w + i * KWC * 8 * NB;
    for (int j = 0; j < KWC; ++j) {
      const float* wj = wp + j * 8 * NB;
      const __m256 w0 = _mm256_loadu_ps(wj), w1 = _mm256_loadu_ps(wj + 8);
      const __m256 w2 = NB > 2 ? _mm256_loadu_ps(wj + 16) : z, w3 = NB > 2 ? _mm256_loadu_ps(wj + 24) : z;
      __m256 x;
#define KILN_SMALL_STEP(r)                       \
  if constexpr (R > r) {                         \
    x = _mm256_broadcast_ss(ip + r * c + j);     \
    a##r##0 = _mm256_fmadd_ps(x, w0, a##r##0);   \
    a##r##1 = _mm256_fmadd_ps(x, w1, a##r##1);   \
    if constexpr (NB > 2) {                      \
      a##r##2 = _mm256_fmadd_ps(x, w2, a##r##2); \
      a##r##3 = _mm256_fmadd_ps(x, w3, a##r##3); \
    }                                            \
  }
      KILN_SMALL_STEP(0) KILN_SMALL_STEP(1) KILN_SMALL_STEP(2)
      if constexpr (NB == 2) {
        KILN_SMALL_STEP(3) KILN_SMALL_STEP(4) KILN_SMALL_STEP(5)
      }
#undef KILN_SMALL_STEP
    }
  }
  const __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
  const __m256 b2 = NB > 2 ? _mm256_loadu_ps(bias + 16) : z, b3 = NB > 2 ? _mm256_loadu_ps(bias + 24) : z;
  auto put = [&](float* o, __m256 v, __m256 b) {
    v = _mm256_add_ps(v, b);
    _mm256_storeu_ps(o, relu ? _mm256_max_ps(v, z) : v);
  };
#define KILN_SMALL_STORE(r)                      \
  if constexpr (R > r) {                         \
    put(out + r * ldo, a##r##0, b0);             \
    put(out + r * ldo + 8, a##r##1, b1);         \
    if constexpr (NB > 2) {                      \
      put(out + r * ldo + 16, a##r##2, b2);      \
      put(out + r * ldo + 24, a##r##3, b3);      \
    }                                            \
  }
  KILN_SMALL_STORE(0) KILN_SMALL_STORE(1) KILN_SMALL_STORE(2)
  if constexpr (NB == 2) {
    KILN_SMALL_STORE(3) KILN_SMALL_STORE(4) KILN_SMALL_STORE(5)
  }
#undef KILN_SMALL_STORE
}

using SmallTileFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, const float*, float*, int64_t,
                             bool);
// small_tile<kwc, nb, r>: r <= 12 / nb (12 accumulators).
template <int KWC, int NB>
SmallTileFn small_tile_for_width(int r) {
  switch (r) {
    case 1: return small_tile<KWC, NB, 1>;
    case 2: return small_tile<KWC, NB, 2>;
    case 3: return small_tile<KWC, NB, 3>;
  }
  if constexpr (NB == 2) {
    switch (r) {
      case 4: return small_tile<KWC, NB, 4>;
      case 5: return small_tile<KWC, NB, 5>;
      case 6: return small_tile<KWC, NB, 6>;
    }
  }
  return nullptr;
}
template <int KWC>
SmallTileFn small_tile_for_group(int nb, int r) {
  return nb == 4 ? small_tile_for_width<KWC, 4>(r) : small_tile_for_width<KWC, 2>(r);
}
SmallTileFn small_tile_for(int64_t kwc, int nb, int r) {
  switch (kwc) {
    case 1: return small_tile_for_group<1>(nb, r);
    case 2: return small_tile_for_group<2>(nb, r);
    case 3: return small_tile_for_group<3>(nb, r);
    case 4: return small_tile_for_group<4>(nb, r);
    case 5: return small_tile_for_group<5>(nb, r);
    case 6: return small_tile_for_group<6>(nb, r);
    case 7: return small_tile_for_group<7>(nb, r);
    case 8: return small_tile_for_group<8>(nb, r);
    case 9: return small_tile_for_group<9>(nb, r);
  }
  return nullptr;
}

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
int64_t block_rows(const Problem& p) {
  const int64_t row = (p.w + p.pl + p.pr) * p.c;
  return std::max<int64_t>(1, kPadBytes / int64_t(sizeof(float) * row) - (p.kh - 1));
}

// The input rows that output rows [b0, b0 + nrows - kh + 1) of image n read, zero-padded,
// in a per-thread buffer: row i is input row b0 - pt + i, (w + pl + pr + extra) * c
// floats (extra: more zero columns on the right).
const float* pad_rows(const Problem& p, const float* x, int64_t n, int64_t b0, int64_t nrows, int64_t extra = 0) {
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

// Output rows [r0, r1) of image n.
void rows(const Problem& p, const float* x, const float* packed, const float* bias, float* y, bool relu, int64_t n,
          int64_t r0, int64_t r1) {
  const int64_t c = p.c, oh = p.oh(), ow = p.ow(), row = (p.w + p.pl + p.pr) * c, block = block_rows(p);
  const int64_t bw = block_width(p), max_tile = 96 / bw, taps = p.kh * p.kw * c;  // 12 accumulators a tile
  const int64_t tiles = (ow + max_tile - 1) / max_tile;
  const bool small = few_channels(p);
  SmallTileFn small_fns[kMaxTile + 1] = {};
  if (small)
    for (int r = 1; r <= max_tile; ++r) small_fns[r] = small_tile_for(p.kw * c, static_cast<int>(bw / 8), r);
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    const float* buf = pad_rows(p, x, n, b0, b1 - b0 + p.kh - 1);
    for (int64_t cb = 0; cb < p.o / bw; ++cb) {
      const float* w = packed + cb * taps * bw;
      for (int64_t r = b0; r < b1; ++r) {
        float* out = y + ((n * oh + r) * ow) * p.o + cb * bw;
        const float* in = buf + (r - b0) * row;
        // Balanced tiles: widths differ by at most one (14 -> 5, 5, 4).
        for (int64_t t = 0, col = 0; t < tiles; ++t) {
          const int64_t width = (ow - col) / (tiles - t);
          if (small) small_fns[width](in + col * c, row, c, p.kh, w, bias + cb * bw, out + col * p.o, p.o, relu);
          else kTiles[width](in + col * c, row, c, p.kh, p.kw * c, w, bias + cb * bw, out + col * p.o, p.o, relu);
          col += width;
        }
      }
    }
  }
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
  KILN_LOAD(2) KILN_LOAD(3) KILN_LOAD(4) KILN_LOAD(5)
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
constexpr GradTileFn kGradTiles[kMaxTile + 1] = {nullptr,      grad_tile<1>, grad_tile<2>, grad_tile<3>,
                                                 grad_tile<4>, grad_tile<5>, grad_tile<6>};

// Adds the filter gradient of output rows [r0, r1) of image n to dw (HWIO, [kh*kw*c][o]).
void grad_rows(const Problem& p, const float* x, const float* dy, int64_t n, int64_t r0, int64_t r1, const int64_t* off,
               float* dw) {
  const int64_t oh = p.oh(), ow = p.ow(), row = (p.w + p.pl + p.pr) * p.c, block = block_rows(p);
  const int64_t m = p.kh * p.kw * p.c;
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    const float* buf = pad_rows(p, x, n, b0, b1 - b0 + p.kh - 1);
    const float* dyb = dy + (n * oh + b0) * ow * p.o;
    for (int64_t cb = 0; cb < p.o / kBlock; ++cb)
      for (int64_t m0 = 0; m0 < m; m0 += kMaxTile) {
        const int64_t r = std::min(kMaxTile, m - m0);
        kGradTiles[r](buf, off + m0, row, p.c, b1 - b0, ow, dyb + cb * kBlock, p.o, dw + m0 * p.o + cb * kBlock);
      }
  }
}
#endif

// ---- Winograd F(2x2, 3x3) ------------------------------------------------------------
// Y = A^T [U . V] A per 2x2 output tile and channel pair, U = G g G^T (the filter,
// transformed once), V = B^T d B (the 4x4 input tile): 16 products where the direct
// loop does 36 (Lavin & Gray 2016). The 16 element-wise products summed over input
// channels are 16 small GEMMs [tiles x c] x [c x o], run by tile() above (kh = 1, the
// tiles' transformed inputs c apart). Blocks of up to kMaxTile tiles: input transform
// into V [16][tiles][c], the GEMMs into M [16][tiles][o], output transform (+ bias,
// ReLU) into y.

bool winograd_enabled() {
  const char* v = std::getenv("KILN_WINOGRAD");
  return !(v && v[0] == '0');
}

// V[xi][t][0..c) for one tile: d = the 4x4 input tile at `in` (rows ldr apart, pixels c
// apart), 8 channels at a time.
void winograd_input(const float* in, int64_t ldr, int64_t c, float* v, int64_t xi_stride) {
  for (int64_t k = 0; k < c; k += 8) {
    __m256 d[4][4];
    for (int r = 0; r < 4; ++r)
      for (int q = 0; q < 4; ++q) d[r][q] = _mm256_loadu_ps(in + r * ldr + q * c + k);
    __m256 t[4][4];  // B^T d
    for (int q = 0; q < 4; ++q) {
      t[0][q] = _mm256_sub_ps(d[0][q], d[2][q]);
      t[1][q] = _mm256_add_ps(d[1][q], d[2][q]);
      t[2][q] = _mm256_sub_ps(d[2][q], d[1][q]);
      t[3][q] = _mm256_sub_ps(d[1][q], d[3][q]);
    }
    for (int r = 0; r < 4; ++r) {  // (B^T d) B
      float* o = v + (4 * r) * xi_stride + k;
      _mm256_storeu_ps(o, _mm256_sub_ps(t[r][0], t[r][2]));
      _mm256_storeu_ps(o + xi_stride, _mm256_add_ps(t[r][1], t[r][2]));
      _mm256_storeu_ps(o + 2 * xi_stride, _mm256_sub_ps(t[r][2], t[r][1]));
      _mm256_storeu_ps(o + 3 * xi_stride, _mm256_sub_ps(t[r][1], t[r][3]));
    }
  }
}

// y's 2x2 tile (rows/cols limited to rows x cols at the bottom/right edge) from
// M[xi][0..o) (xi_stride apart): A^T M A + bias, ReLU.
void winograd_output(const float* m, int64_t xi_stride, int64_t o, const float* bias, bool relu, float* y,
                     int64_t ldy_row, int64_t rows, int64_t cols) {
  const __m256 z = _mm256_setzero_ps();
  for (int64_t k = 0; k < o; k += 8) {
    __m256 s[2][4];  // A^T M
    for (int q = 0; q < 4; ++q) {
      const __m256 m0 = _mm256_loadu_ps(m + q * xi_stride + k), m1 = _mm256_loadu_ps(m + (4 + q) * xi_stride + k);
      const __m256 m2 = _mm256_loadu_ps(m + (8 + q) * xi_stride + k), m3 = _mm256_loadu_ps(m + (12 + q) * xi_stride + k);
      s[0][q] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
      s[1][q] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
    }
    const __m256 b = _mm256_loadu_ps(bias + k);
    for (int64_t r = 0; r < rows; ++r) {
      __m256 y0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s[r][0], s[r][1]), s[r][2]), b);
      __m256 y1 = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s[r][1], s[r][2]), s[r][3]), b);
      if (relu) y0 = _mm256_max_ps(y0, z), y1 = _mm256_max_ps(y1, z);
      _mm256_storeu_ps(y + r * ldy_row + k, y0);
      if (cols > 1) _mm256_storeu_ps(y + r * ldy_row + o + k, y1);
    }
  }
}

// Output tile rows [i0, i1) of image n (each 2 output rows; tw tiles of 2 columns a row).
void winograd_rows(const Problem& p, const float* x, const float* u, const float* bias, float* y, bool relu,
                   int64_t n, int64_t i0, int64_t i1) {
  const int64_t c = p.c, o = p.o, oh = p.oh(), ow = p.ow(), tw = (ow + 1) / 2;
  // Zero columns so the last tile's 4 input columns exist when ow is odd.
  const int64_t extra = 2 * tw + 2 - (p.w + p.pl + p.pr), row = (p.w + p.pl + p.pr + extra) * c;
  const float* buf = pad_rows(p, x, n, 2 * i0, 2 * (i1 - i0) + 2, extra);
  thread_local std::vector<float> vbuf, mbuf;
  vbuf.resize(size_t(16 * kMaxTile * c));
  mbuf.resize(size_t(16 * kMaxTile * o));
  float* v = vbuf.data();
  float* m = mbuf.data();
  thread_local std::vector<float> zeros;
  if (zeros.size() < size_t(o)) zeros.assign(size_t(o), 0.0f);
  const int64_t tiles = (i1 - i0) * tw, blocks = (tiles + kMaxTile - 1) / kMaxTile;
  for (int64_t b = 0, t0 = 0; b < blocks; ++b) {
    const int64_t nt = (tiles - t0) / (blocks - b);  // balanced: sizes differ by at most one
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t i = (t0 + t) / tw, j = (t0 + t) % tw;
      winograd_input(buf + 2 * i * row + 2 * j * c, row, c, v + t * c, kMaxTile * c);
    }
    for (int64_t xi = 0; xi < 16; ++xi)
      for (int64_t ob = 0; ob < o / kBlock; ++ob)
        kTiles[nt](v + xi * kMaxTile * c, 0, c, 1, c, u + (xi * (o / kBlock) + ob) * c * kBlock, zeros.data(),
                   m + xi * kMaxTile * o + ob * kBlock, o, false);
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t i = i0 + (t0 + t) / tw, j = (t0 + t) % tw;
      winograd_output(m + t * o, kMaxTile * o, o, bias, relu, y + ((n * oh + 2 * i) * ow + 2 * j) * o, ow * o,
                      std::min<int64_t>(2, oh - 2 * i), std::min<int64_t>(2, ow - 2 * j));
    }
    t0 += nt;
  }
}

// The filter gradient by the same transform: dU[xi][c][o] = sum over tiles of
// V[xi][t][c] * W[xi][t][o], V = B^T d B as above, W = A dY A^T (the tile's 2x2 output
// gradient, zeros past the edge), then dw = G^T dU G. The 16 sums over tiles run on
// grad_tile() (the tiles as its pixels), blocks of kWinogradGradTiles tiles.
constexpr int64_t kWinogradGradTiles = 64;

// W[xi][0..o) for one tile: dy's 2x2 tile at `dy` (rows ldy apart, pixels o apart), of
// which rows x cols exist.
void winograd_grad_output(const float* dy, int64_t ldy, int64_t o, int64_t rows, int64_t cols, float* w,
                          int64_t xi_stride) {
  const __m256 z = _mm256_setzero_ps();
  for (int64_t k = 0; k < o; k += 8) {
    __m256 g[2][2];
    for (int r = 0; r < 2; ++r)
      for (int q = 0; q < 2; ++q) g[r][q] = r < rows && q < cols ? _mm256_loadu_ps(dy + r * ldy + q * o + k) : z;
    __m256 t[4][2];  // A g, A = [1 0; 1 1; 1 -1; 0 -1]
    for (int q = 0; q < 2; ++q) {
      t[0][q] = g[0][q];
      t[1][q] = _mm256_add_ps(g[0][q], g[1][q]);
      t[2][q] = _mm256_sub_ps(g[0][q], g[1][q]);
      t[3][q] = _mm256_sub_ps(z, g[1][q]);
    }
    for (int r = 0; r < 4; ++r) {  // (A g) A^T
      float* out = w + (4 * r) * xi_stride + k;
      _mm256_storeu_ps(out, t[r][0]);
      _mm256_storeu_ps(out + xi_stride, _mm256_add_ps(t[r][0], t[r][1]));
      _mm256_storeu_ps(out + 2 * xi_stride, _mm256_sub_ps(t[r][0], t[r][1]));
      _mm256_storeu_ps(out + 3 * xi_stride, _mm256_sub_ps(z, t[r][1]));
    }
  }
}

// Adds tile rows [i0, i1) of image n to du [16][c][o]; off = 0, 1, ..., c - 1.
void winograd_grad_rows(const Problem& p, const float* x, const float* dy, int64_t n, int64_t i0, int64_t i1,
                        const int64_t* off, float* du) {
  const int64_t c = p.c, o = p.o, oh = p.oh(), ow = p.ow(), tw = (ow + 1) / 2;
  const int64_t extra = 2 * tw + 2 - (p.w + p.pl + p.pr), row = (p.w + p.pl + p.pr + extra) * c;
  const float* buf = pad_rows(p, x, n, 2 * i0, 2 * (i1 - i0) + 2, extra);
  // The 16 positions' rows, 64 bytes more than a block apart: at a multiple of 4 KiB all
  // 16 would fall in one L1 set (measured: the transforms took 30% of the time).
  const int64_t vs = kWinogradGradTiles * c + 16, ws = kWinogradGradTiles * o + 16;
  thread_local std::vector<float> vbuf, wbuf;
  vbuf.resize(size_t(16 * vs));
  wbuf.resize(size_t(16 * ws));
  float* v = vbuf.data();
  float* w = wbuf.data();
  const int64_t tiles = (i1 - i0) * tw;
  for (int64_t t0 = 0; t0 < tiles; t0 += kWinogradGradTiles) {
    const int64_t nt = std::min(kWinogradGradTiles, tiles - t0);
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t i = (t0 + t) / tw, j = (t0 + t) % tw, r = 2 * (i0 + i);
      winograd_input(buf + 2 * i * row + 2 * j * c, row, c, v + t * c, vs);
      winograd_grad_output(dy + ((n * oh + r) * ow + 2 * j) * o, ow * o, o, std::min<int64_t>(2, oh - r),
                           std::min<int64_t>(2, ow - 2 * j), w + t * o, ws);
    }
    const int64_t groups = (c + kMaxTile - 1) / kMaxTile;  // rows of dU per tile: balanced (32 -> 6,6,5,5,5,5)
    for (int64_t xi = 0; xi < 16; ++xi)
      for (int64_t ob = 0; ob < o / kBlock; ++ob)
        for (int64_t g = 0, m0 = 0; g < groups; ++g) {
          const int64_t r = (c - m0) / (groups - g);
          kGradTiles[r](v + xi * vs, off + m0, 0, c, 1, nt, w + xi * ws + ob * kBlock, o,
                        du + (xi * c + m0) * o + ob * kBlock);
          m0 += r;
        }
  }
}

// What both kernels need: compiled in, not turned off, a non-empty problem, o a
// multiple of 16 and no negative padding.
bool handles(const Problem& p) {
#ifdef KILN_DIRECT_CONV_AVX2
  return p.n > 0 && p.c > 0 && p.o > 0 && p.o % kBlock == 0 && p.kh >= 1 && p.kw >= 1 && p.pt >= 0 && p.pb >= 0 &&
         p.pl >= 0 && p.pr >= 0 && p.oh() >= 1 && p.ow() >= 1 && enabled();
#else
  (void)p;
  return false;
#endif
}

#ifdef KILN_DIRECT_CONV_AVX2
bool winograd_applies(const Problem& p) {
  return p.allow_winograd && p.kh == 3 && p.kw == 3 && p.c >= 8 && p.c % 8 == 0 && handles(p) && winograd_enabled();
}
#endif

}  // namespace

bool uses_winograd(const Problem& p) {
#ifdef KILN_DIRECT_CONV_AVX2
  return winograd_applies(p);
#else
  (void)p;
  return false;
#endif
}

bool supports(const Problem& p) {
#ifdef KILN_DIRECT_CONV_AVX2
  if (p.c < 8 && !few_channels(p)) return false;
#endif
  return handles(p);
}

size_t packed_size(const Problem& p) { return size_t((uses_winograd(p) ? 16 : p.kh * p.kw) * p.c * p.o); }

void pack_filter(const Problem& p, const float* hwio, float* packed) {
  if (uses_winograd(p)) {
    // U = G g G^T per (input, output) channel, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
    // as U[xi = 4 * row + col][o/16][c][16].
    const int64_t ob = p.o / kBlock;
    for (int64_t ci = 0; ci < p.c; ++ci)
      for (int64_t b = 0; b < ob; ++b) {
        float u[16][kBlock];  // 16 output channels at a time (the loops over l vectorise)
        const float* g = hwio + ci * p.o + b * kBlock;  // g(i, j)[l] = g[(i * 3 + j) * c * o + l]
        auto at = [&](int i, int j, int64_t l) { return g[(i * 3 + j) * p.c * p.o + l]; };
        for (int j = 0; j < 3; ++j) {
          float gg[4][kBlock];  // G g, column j
          for (int64_t l = 0; l < kBlock; ++l) {
            gg[0][l] = at(0, j, l);
            gg[1][l] = 0.5f * (at(0, j, l) + at(1, j, l) + at(2, j, l));
            gg[2][l] = 0.5f * (at(0, j, l) - at(1, j, l) + at(2, j, l));
            gg[3][l] = at(2, j, l);
          }
          for (int r = 0; r < 4; ++r)
            for (int64_t l = 0; l < kBlock; ++l) u[4 * r + j][l] = gg[r][l];  // columns 0..2 for now
        }
        for (int r = 0; r < 4; ++r)  // (G g) G^T: columns 0..2 -> 0..3
          for (int64_t l = 0; l < kBlock; ++l) {
            const float q0 = u[4 * r][l], q1 = u[4 * r + 1][l], q2 = u[4 * r + 2][l];
            u[4 * r][l] = q0;
            u[4 * r + 1][l] = 0.5f * (q0 + q1 + q2);
            u[4 * r + 2][l] = 0.5f * (q0 - q1 + q2);
            u[4 * r + 3][l] = q2;
          }
        for (int xi = 0; xi < 16; ++xi)
          std::memcpy(packed + ((xi * ob + b) * p.c + ci) * kBlock, u[xi], sizeof(float) * kBlock);
      }
    return;
  }
  // packed[cb][i][j][k][bw] = hwio[i][j][k][cb*bw + 0..bw-1], bw = 16 (or 32: small_tile)
  const int64_t taps = p.kh * p.kw * p.c;
#ifdef KILN_DIRECT_CONV_AVX2
  const int64_t bw = block_width(p);
#else
  const int64_t bw = kBlock;
#endif
  for (int64_t cb = 0; cb < p.o / bw; ++cb)
    for (int64_t t = 0; t < taps; ++t)
      std::memcpy(packed + (cb * taps + t) * bw, hwio + t * p.o + cb * bw, sizeof(float) * bw);
}

Problem backward_data_problem(const Problem& f) {
  Problem b;
  b.n = f.n;
  b.h = f.oh();
  b.w = f.ow();
  b.c = f.o;
  b.o = f.c;
  b.kh = f.kh;
  b.kw = f.kw;
  // dx[h] = sum_i dy[h + i - (kh-1-pt)] * w[kh-1-i]: the flipped filter over dy
  // padded by kh-1-pt on top and kh-1-pb below (then the output has exactly h
  // rows).
  b.pt = f.kh - 1 - f.pt;
  b.pb = f.kh - 1 - f.pb;
  b.pl = f.kw - 1 - f.pl;
  b.pr = f.kw - 1 - f.pr;
  b.allow_winograd = f.allow_winograd;
  return b;
}

void pack_filter_backward(const Problem& f, const float* hwio, float* packed) {
  // The backward problem's HWIO filter wb[i][j][o][c] = hwio[kh-1-i][kw-1-j][c][o], then
  // packed for that problem.
  thread_local std::vector<float> wb;
  wb.resize(size_t(f.kh * f.kw * f.c * f.o));
  for (int64_t i = 0; i < f.kh; ++i)
    for (int64_t j = 0; j < f.kw; ++j)
      for (int64_t o = 0; o < f.o; ++o)
        for (int64_t k = 0; k < f.c; ++k)
          wb[size_t(((i * f.kw + j) * f.o + o) * f.c + k)] =
              hwio[(((f.kh - 1 - i) * f.kw + (f.kw - 1 - j)) * f.c + k) * f.o + o];
  pack_filter(backward_data_problem(f), wb.data(), packed);
}

bool supports_backward_filter(const Problem& p) { return handles(p); }

#ifdef KILN_DIRECT_CONV_AVX2
namespace {
void winograd_backward_filter(const Problem& p, const float* x, const float* dy, float* dw) {
  const int64_t c = p.c, o = p.o, th = (p.oh() + 1) / 2, units = p.n * th, usize = 16 * c * o;
  const int64_t macs = p.n * p.oh() * p.ow() * 9 * c * o;
  const int64_t parts = onednn::runs_serial(macs) ? 1 : std::min<int64_t>(num_threads(), units);
  thread_local std::vector<float> partial;
  partial.assign(size_t(parts * usize), 0.0f);
  thread_local std::vector<int64_t> off;
  off.resize(size_t(c));
  for (int64_t k = 0; k < c; ++k) off[size_t(k)] = k;
  float* sums = partial.data();  // (pointers: pool threads would see their own thread_locals)
  const int64_t* offsets = off.data();
  parallel_for(parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      by_image(units * t / parts, units * (t + 1) / parts, th, [&](int64_t n, int64_t i0, int64_t i1) {
        winograd_grad_rows(p, x, dy, n, i0, i1, offsets, sums + t * usize);
      });
  });
  for (int64_t t = 1; t < parts; ++t)
    for (int64_t i = 0; i < usize; ++i) sums[i] += sums[t * usize + i];
  // dw[i][j][ci][oc] = (G^T dU G)[i][j], G^T = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1].
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t oc = 0; oc < o; ++oc) {
      float u[4][4], gu[3][4];
      for (int xi = 0; xi < 16; ++xi) u[xi / 4][xi % 4] = sums[(xi * c + ci) * o + oc];
      for (int q = 0; q < 4; ++q) {
        gu[0][q] = u[0][q] + 0.5f * (u[1][q] + u[2][q]);
        gu[1][q] = 0.5f * (u[1][q] - u[2][q]);
        gu[2][q] = 0.5f * (u[1][q] + u[2][q]) + u[3][q];
      }
      for (int i = 0; i < 3; ++i) {
        float* d = dw + (i * 3 * c + ci) * o + oc;
        d[0] = gu[i][0] + 0.5f * (gu[i][1] + gu[i][2]);
        d[c * o] = 0.5f * (gu[i][1] - gu[i][2]);
        d[2 * c * o] = 0.5f * (gu[i][1] + gu[i][2]) + gu[i][3];
      }
    }
}
}  // namespace
#endif

void backward_filter(const Problem& p, const float* x, const float* dy, float* dw) {
#ifdef KILN_DIRECT_CONV_AVX2
  if (winograd_applies(p)) {
    winograd_backward_filter(p, x, dy, dw);
    return;
  }
  const int64_t m = p.kh * p.kw * p.c, wsize = m * p.o;
  // Row m = (i*kw + j)*c + k of dw reads the padded input at offset (i*(w+pl+pr) + j)*c + k.
  thread_local std::vector<int64_t> off;
  off.resize(size_t(m));
  for (int64_t i = 0; i < p.kh; ++i)
    for (int64_t j = 0; j < p.kw; ++j)
      for (int64_t k = 0; k < p.c; ++k) off[size_t((i * p.kw + j) * p.c + k)] = (i * (p.w + p.pl + p.pr) + j) * p.c + k;
  // (image, output row) pairs split over the pool; each part sums into its own copy of dw,
  // added up at the end.
  const int64_t oh = p.oh(), units = p.n * oh, macs = units * p.ow() * m * p.o;
  const int64_t parts = onednn::runs_serial(macs) ? 1 : std::min<int64_t>(num_threads(), units);
  thread_local std::vector<float> partial;
  partial.assign(size_t((parts - 1) * wsize), 0.0f);
  std::memset(dw, 0, sizeof(float) * size_t(wsize));
  // (Pointers, not the thread_local vectors: pool threads would see their own, empty ones.)
  const int64_t* offsets = off.data();
  float* sums = partial.data();
  parallel_for(parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = t == 0 ? dw : sums + (t - 1) * wsize;
      by_image(units * t / parts, units * (t + 1) / parts, oh,
               [&](int64_t n, int64_t r0, int64_t r1) { grad_rows(p, x, dy, n, r0, r1, offsets, acc); });
    }
  });
  for (int64_t t = 1; t < parts; ++t) {
    const float* s = partial.data() + (t - 1) * wsize;
    for (int64_t i = 0; i < wsize; ++i) dw[i] += s[i];
  }
#else
  (void)p, (void)x, (void)dy, (void)dw;
  std::abort();
#endif
}

void run(const Problem& p, const float* x, const float* packed, const float* bias, float* y, bool relu) {
#ifdef KILN_DIRECT_CONV_AVX2
  thread_local std::vector<float> zeros;
  if (!bias) {
    if (zeros.size() < size_t(p.o)) zeros.assign(size_t(p.o), 0.0f);
    bias = zeros.data();
  }
  const int64_t oh = p.oh(), units = p.n * oh;
  const int64_t macs = units * p.ow() * p.o * p.kh * p.kw * p.c;
  if (winograd_applies(p)) {  // (image, tile row) ranges per thread
    const int64_t th = (oh + 1) / 2, tile_rows = p.n * th;
    parallel_for(tile_rows, onednn::runs_serial(macs) ? tile_rows : 1, [&](int64_t u0, int64_t u1) {
      by_image(u0, u1, th,
               [&](int64_t n, int64_t i0, int64_t i1) { winograd_rows(p, x, packed, bias, y, relu, n, i0, i1); });
    });
    return;
  }
  // Contiguous (image, output row) ranges per thread; small problems stay on
  // this thread.
  parallel_for(units, onednn::runs_serial(macs) ? units : 1, [&](int64_t u0, int64_t u1) {
    by_image(u0, u1, oh, [&](int64_t n, int64_t r0, int64_t r1) { rows(p, x, packed, bias, y, relu, n, r0, r1); });
  });
#else
  (void)p, (void)x, (void)packed, (void)bias, (void)y, (void)relu;
  std::abort();  // supports() is false without AVX2
#endif
}

}  // namespace kiln::cpu::direct_conv
