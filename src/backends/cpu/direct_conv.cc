// Direct NHWC convolution (direct_conv.h): padded row buffers and a 6x16
// register tile.
#include "direct_conv.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "direct_conv_tiles.h"
#include "kiln/core/cpu_isa.h"
#include "kiln/core/flags.h"
#include "kiln/core/parallel.h"
#include "onednn.h"
#include "winograd_conv.h"

namespace kiln::cpu::direct_conv {
using namespace detail;
namespace {

bool enabled() { return kernel_preferences().direct_conv != DirectConv::kOff; }

// Whether p takes small_tile: fewer than 8 input channels and kw * c <= kMaxSmallTaps.
constexpr int64_t kMaxSmallTaps = 9;  // 3x3 on RGB
bool few_channels(const Problem& p) { return p.c < 8 && p.kw * p.c <= kMaxSmallTaps; }
// Output channels per filter block: 16 (tile()), or 32 for small_tile when o allows.
int64_t block_width(const Problem& p) { return few_channels(p) && p.o % 32 == 0 ? 32 : kBlock; }

#ifdef KILN_DIRECT_CONV_AVX2

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

// Output rows [r0, r1) of image n.
void rows(const Problem& p, const float* x, const float* packed, const float* bias, float* y, bool relu, int64_t n,
          int64_t r0, int64_t r1) {
  const int64_t c = p.c, oh = p.oh(), ow = p.ow(), row = (p.w + p.pl + p.pr) * c, block = block_rows(p);
  const int64_t bw = block_width(p), max_tile = 96 / bw, taps = p.kh * p.kw * c;  // 12 accumulators a tile
  const int64_t tiles = (ow + max_tile - 1) / max_tile;
  const bool small = few_channels(p), wide = !small && cpu_has(CpuIsa::kAvx512);
  SmallTileFn small_fns[kMaxTile + 1] = {};
  if (small)
    for (int r = 1; r <= max_tile; ++r) small_fns[r] = small_tile_for(p.kw * c, static_cast<int>(bw / 8), r);
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    const float* buf = pad_rows(p, x, n, b0, b1 - b0 + p.kh - 1);
    // The AVX-512 tile takes up to kAvx512Blocks blocks of 16 channels at once.
    const int64_t nblk = p.o / bw;
    for (int64_t cb = 0, nb = 1; cb < nblk; cb += nb) {
      nb = wide ? std::min(kAvx512Blocks, nblk - cb) : 1;
      const float* w = packed + cb * taps * bw;
      for (int64_t r = b0; r < b1; ++r) {
        float* out = y + ((n * oh + r) * ow) * p.o + cb * bw;
        const float* in = buf + (r - b0) * row;
        // Balanced tiles: widths differ by at most one (14 -> 5, 5, 4).
        for (int64_t t = 0, col = 0; t < tiles; ++t) {
          const int64_t width = (ow - col) / (tiles - t);
          if (small)
            small_fns[width](in + col * c, row, c, p.kh, w, bias + cb * bw, out + col * p.o, p.o, relu);
          else if (wide)
            tile_avx512(width, nb, in + col * c, row, c, p.kh, p.kw * c, w, taps * bw, bias + cb * bw, out + col * p.o,
                        p.o, relu);
          else
            kTiles[width](in + col * c, row, c, p.kh, p.kw * c, w, bias + cb * bw, out + col * p.o, p.o, relu);
          col += width;
        }
      }
    }
  }
}

// Row m = (i*kw + j)*c + k of dw reads the padded input at offset (i*(w+pl+pr) + j)*c + k:
// those offsets, in the calling thread's buffer (valid until its next call).
const int64_t* filter_offsets(const Problem& p) {
  thread_local std::vector<int64_t> off;
  off.resize(size_t(p.kh * p.kw * p.c));
  for (int64_t i = 0; i < p.kh; ++i)
    for (int64_t j = 0; j < p.kw; ++j)
      for (int64_t k = 0; k < p.c; ++k) off[size_t((i * p.kw + j) * p.c + k)] = (i * (p.w + p.pl + p.pr) + j) * p.c + k;
  return off.data();
}

// Adds the filter gradient of output rows [r0, r1) of image n to dw (HWIO, [kh*kw*c][o]);
// dy_rows: those rows of dy, [r1 - r0, ow, o].
void grad_rows(const Problem& p, const float* x, const float* dy_rows, int64_t n, int64_t r0, int64_t r1,
               const int64_t* off, float* dw) {
  const int64_t ow = p.ow(), row = (p.w + p.pl + p.pr) * p.c, block = block_rows(p);
  const int64_t m = p.kh * p.kw * p.c, nblk = p.o / kBlock;
  const bool wide = cpu_has(CpuIsa::kAvx512);  // the AVX-512 tile: up to kAvx512Blocks blocks at once
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    const float* buf = pad_rows(p, x, n, b0, b1 - b0 + p.kh - 1);
    const float* dyb = dy_rows + (b0 - r0) * ow * p.o;
    for (int64_t cb = 0, nb = 1; cb < nblk; cb += nb) {
      nb = wide ? std::min(kAvx512Blocks, nblk - cb) : 1;
      for (int64_t m0 = 0; m0 < m; m0 += kMaxTile) {
        const int64_t r = std::min(kMaxTile, m - m0);
        if (wide)
          grad_tile_avx512(r, nb, buf, off + m0, row, p.c, b1 - b0, ow, dyb + cb * kBlock, p.o,
                           dw + m0 * p.o + cb * kBlock);
        else
          kGradTiles[r](buf, off + m0, row, p.c, b1 - b0, ow, dyb + cb * kBlock, p.o, dw + m0 * p.o + cb * kBlock);
      }
    }
  }
}
#endif

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

}  // namespace

bool uses_winograd(const Problem& p) {
#ifdef KILN_DIRECT_CONV_AVX2
  return handles(p) && winograd::applies(p);
#else
  (void)p;
  return false;
#endif
}

bool supports(const Problem& p) { return (p.c >= 8 || few_channels(p)) && handles(p); }

bool uses_general_tile(const Problem& p) { return handles(p) && !few_channels(p) && !uses_winograd(p); }

bool general_tile_forced() { return kernel_preferences().direct_conv == DirectConv::kForceTile; }

size_t packed_size(const Problem& p) { return size_t((uses_winograd(p) ? 16 : p.kh * p.kw) * p.c * p.o); }

void pack_filter(const Problem& p, const float* hwio, float* packed) {
  if (uses_winograd(p)) {
#ifdef KILN_DIRECT_CONV_AVX2
    winograd::pack_filter(p, hwio, packed);
#endif
    return;
  }
  // packed[cb][i][j][k][bw] = hwio[i][j][k][cb*bw + 0..bw-1], bw = 16 (or 32: small_tile)
  const int64_t taps = p.kh * p.kw * p.c, bw = block_width(p);
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

void backward_filter(const Problem& p, const float* x, const float* dy, float* dw) {
#ifdef KILN_DIRECT_CONV_AVX2
  if (uses_winograd(p)) {
    winograd::backward_filter(p, x, dy, dw);
    return;
  }
  const int64_t m = p.kh * p.kw * p.c, wsize = m * p.o;
  // (image, output row) pairs split over the pool; each part sums into its own copy of dw,
  // added up at the end.
  const int64_t oh = p.oh(), units = p.n * oh, macs = units * p.ow() * m * p.o;
  const int64_t* offsets = filter_offsets(p);
  const int64_t parts = onednn::runs_serial(macs) ? 1 : std::min<int64_t>(num_threads(), units);
  thread_local std::vector<float> partial;
  partial.assign(size_t((parts - 1) * wsize), 0.0f);
  std::memset(dw, 0, sizeof(float) * size_t(wsize));
  // (Pointers, not the thread_local vectors: pool threads would see their own, empty ones.)
  float* sums = partial.data();
  parallel_for(parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = t == 0 ? dw : sums + (t - 1) * wsize;
      by_image(units * t / parts, units * (t + 1) / parts, oh, [&](int64_t n, int64_t r0, int64_t r1) {
        grad_rows(p, x, dy + (n * oh + r0) * p.ow() * p.o, n, r0, r1, offsets, acc);
      });
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

void backward_filter_rows(const Problem& p, const float* x, int64_t n, int64_t r0, int64_t r1, const float* dy_rows,
                          float* dw) {
#ifdef KILN_DIRECT_CONV_AVX2
  grad_rows(p, x, dy_rows, n, r0, r1, filter_offsets(p), dw);
#else
  (void)p, (void)x, (void)n, (void)r0, (void)r1, (void)dy_rows, (void)dw;
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
  if (uses_winograd(p)) {
    winograd::run(p, x, packed, bias, y, relu);
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
