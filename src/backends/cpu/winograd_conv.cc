// Winograd F(2x2, 3x3) convolution (winograd_conv.h) on the direct kernel's tiles.
#include "winograd_conv.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "direct_conv_tiles.h"
#include "kiln/core/cpu_isa.h"
#include "kiln/core/flags.h"
#include "kiln/core/parallel.h"
#include "onednn.h"

#ifdef KILN_DIRECT_CONV_AVX2
namespace kiln::cpu::winograd {
using direct_conv::Problem;
using namespace direct_conv::detail;

namespace {

// Forward: blocks of up to kMaxTile tiles; input transform into V [16][tiles][c], the
// 16 GEMMs [tiles x c] x [c x o] on tile() (kh = 1, the tiles' transformed inputs c
// apart) into M [16][tiles][o], output transform (+ bias, ReLU) into y.

// V[xi][t][0..c) for one tile: d = the 4x4 input tile at `in` (rows ldr apart, pixels c
// apart), 8 channels at a time.
void transform_input(const float* in, int64_t ldr, int64_t c, float* v, int64_t xi_stride) {
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
void transform_output(const float* m, int64_t xi_stride, int64_t o, const float* bias, bool relu, float* y,
                      int64_t ldy_row, int64_t rows, int64_t cols) {
  const __m256 z = _mm256_setzero_ps();
  for (int64_t k = 0; k < o; k += 8) {
    __m256 s[2][4];  // A^T M
    for (int q = 0; q < 4; ++q) {
      const __m256 m0 = _mm256_loadu_ps(m + q * xi_stride + k), m1 = _mm256_loadu_ps(m + (4 + q) * xi_stride + k);
      const __m256 m2 = _mm256_loadu_ps(m + (8 + q) * xi_stride + k),
                   m3 = _mm256_loadu_ps(m + (12 + q) * xi_stride + k);
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
void tile_rows(const Problem& p, const float* x, const float* u, const float* bias, float* y, bool relu, int64_t n,
               int64_t i0, int64_t i1) {
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
  const bool wide = cpu_has(CpuIsa::kAvx512);
  for (int64_t b = 0, t0 = 0; b < blocks; ++b) {
    const int64_t nt = (tiles - t0) / (blocks - b);  // balanced: sizes differ by at most one
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t i = (t0 + t) / tw, j = (t0 + t) % tw;
      transform_input(buf + 2 * i * row + 2 * j * c, row, c, v + t * c, kMaxTile * c);
    }
    const int64_t nblk = o / kBlock;
    for (int64_t xi = 0; xi < 16; ++xi) {
      if (wide) {
        for (int64_t ob = 0; ob < nblk; ob += kAvx512Blocks)
          tile_avx512(nt, std::min(kAvx512Blocks, nblk - ob), v + xi * kMaxTile * c, 0, c, 1, c,
                      u + (xi * nblk + ob) * c * kBlock, c * kBlock, zeros.data(), m + xi * kMaxTile * o + ob * kBlock,
                      o, false);
        continue;
      }
      for (int64_t ob = 0; ob < nblk; ++ob)
        kTiles[nt](v + xi * kMaxTile * c, 0, c, 1, c, u + (xi * nblk + ob) * c * kBlock, zeros.data(),
                   m + xi * kMaxTile * o + ob * kBlock, o, false);
    }
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t i = i0 + (t0 + t) / tw, j = (t0 + t) % tw;
      transform_output(m + t * o, kMaxTile * o, o, bias, relu, y + ((n * oh + 2 * i) * ow + 2 * j) * o, ow * o,
                       std::min<int64_t>(2, oh - 2 * i), std::min<int64_t>(2, ow - 2 * j));
    }
    t0 += nt;
  }
}

// The filter gradient: dU[xi][c][o] = sum over tiles of
// V[xi][t][c] * W[xi][t][o], V = B^T d B as above, W = A dY A^T (the tile's 2x2 output
// gradient, zeros past the edge), then dw = G^T dU G. The 16 sums over tiles run on
// grad_tile() (the tiles as its pixels), blocks of kWinogradGradTiles tiles.
constexpr int64_t kWinogradGradTiles = 64;

// W[xi][0..o) for one tile: dy's 2x2 tile at `dy` (rows ldy apart, pixels o apart), of
// which rows x cols exist.
void transform_output_gradient(const float* dy, int64_t ldy, int64_t o, int64_t rows, int64_t cols, float* w,
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
void gradient_tile_rows(const Problem& p, const float* x, const float* dy, int64_t n, int64_t i0, int64_t i1,
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
  const bool wide = cpu_has(CpuIsa::kAvx512);
  for (int64_t t0 = 0; t0 < tiles; t0 += kWinogradGradTiles) {
    const int64_t nt = std::min(kWinogradGradTiles, tiles - t0);
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t i = (t0 + t) / tw, j = (t0 + t) % tw, r = 2 * (i0 + i);
      transform_input(buf + 2 * i * row + 2 * j * c, row, c, v + t * c, vs);
      transform_output_gradient(dy + ((n * oh + r) * ow + 2 * j) * o, ow * o, o, std::min<int64_t>(2, oh - r),
                                std::min<int64_t>(2, ow - 2 * j), w + t * o, ws);
    }
    const int64_t groups = (c + kMaxTile - 1) / kMaxTile;  // rows of dU per tile: balanced (32 -> 6,6,5,5,5,5)
    const int64_t nblk = o / kBlock;
    for (int64_t xi = 0; xi < 16; ++xi)
      for (int64_t ob = 0, nb = 1; ob < nblk; ob += nb) {
        nb = wide ? std::min(kAvx512Blocks, nblk - ob) : 1;  // the AVX-512 tile: up to 4 blocks at once
        for (int64_t g = 0, m0 = 0; g < groups; ++g) {
          const int64_t r = (c - m0) / (groups - g);
          if (wide)
            grad_tile_avx512(r, nb, v + xi * vs, off + m0, 0, c, 1, nt, w + xi * ws + ob * kBlock, o,
                             du + (xi * c + m0) * o + ob * kBlock);
          else
            kGradTiles[r](v + xi * vs, off + m0, 0, c, 1, nt, w + xi * ws + ob * kBlock, o,
                          du + (xi * c + m0) * o + ob * kBlock);
          m0 += r;
        }
      }
  }
}

}  // namespace

bool applies(const Problem& p) {
  return p.allow_winograd && p.kh == 3 && p.kw == 3 && p.c >= 8 && p.c % 8 == 0 && p.o % kBlock == 0 &&
         kernel_preferences().winograd;
}

void pack_filter(const Problem& p, const float* hwio, float* packed) {
  // U = G g G^T per (input, output) channel, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
  // as U[xi = 4 * row + col][o/16][c][16].
  const int64_t ob = p.o / kBlock;
  for (int64_t ci = 0; ci < p.c; ++ci)
    for (int64_t b = 0; b < ob; ++b) {
      float u[16][kBlock];                            // 16 output channels at a time (the loops over l vectorise)
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
}

void run(const Problem& p, const float* x, const float* u, const float* bias, float* y, bool relu) {
  const int64_t th = (p.oh() + 1) / 2, units = p.n * th;
  const int64_t macs = p.n * p.oh() * p.ow() * 9 * p.c * p.o;
  // (image, tile row) ranges per thread; small problems stay on this thread.
  parallel_for(units, onednn::runs_serial(macs) ? units : 1, [&](int64_t u0, int64_t u1) {
    by_image(u0, u1, th, [&](int64_t n, int64_t i0, int64_t i1) { tile_rows(p, x, u, bias, y, relu, n, i0, i1); });
  });
}

void backward_filter(const Problem& p, const float* x, const float* dy, float* dw) {
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
        gradient_tile_rows(p, x, dy, n, i0, i1, offsets, sums + t * usize);
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

}  // namespace kiln::cpu::winograd
#endif
