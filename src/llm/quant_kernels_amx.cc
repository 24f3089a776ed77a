// The group kernels on AMX tiles (flags in src/CMakeLists.txt; quant_kernels.cc calls
// them only where cpu_has(CpuIsa::kAmx) and a call has 16 tokens or more).
//
// A packed record's quant lines are already an AMX B tile in VNNI layout: line j holds
// the 16 rows' weights 4j..4j+3 (quant_kernels.h, PackFormat), so lines 0-3 are the B
// tile of the block's first 16 weights and lines 4-7 that of the last 16 (4-bit types
// are unpacked once per group into a scratch copy). A tile of 16 tokens' Q8 halves is
// read straight from the activation blocks (a stride of one token's blocks). One
// TDPBSUD per half (signed activations x unsigned weights) gives, per token and row,
// the exact integer dot that the VNNI kernel builds from eight VPDPBUSDs; the float
// steps after it are the VNNI kernel's, in its order, so the results are bit-identical
// to it (and to AVX2): a token's logits never depend on which path or batch ran it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "llm/quant_kernels.h"

namespace kiln::llm::kernels {
namespace avx512 {
GroupsFn group_kernel(GgmlType type);  // quant_kernels_avx512.cc: tokens past the last full tile
}  // namespace avx512
namespace amx {
namespace {

constexpr int kTileTokens = 16;

// Tiles: 0/1 and 6/7 the integer dots of the two halves (16 tokens x 16 rows of int32;
// two pairs, alternate blocks), 2/3 the tokens' activation halves (16 x 16 signed
// bytes), 4/5 the weight halves (4 lines of 16 rows x 4 unsigned bytes).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 16, 16, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 4, 4, 16, 16};
};

// A block's activation scalars for a tile's 16 tokens: the halves' scales, the sum of the
// dequantised values, and the zero-point terms (-zero_point x the halves' integer sums).
struct alignas(64) Scalars {
  float d[2][kTileTokens], s[kTileTokens];
  int32_t zp[2][kTileTokens];
};

inline __m512 load_scales(const uint8_t* p, bool f16) {
  return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))) : _mm512_loadu_ps(p);
}

// The integer dots of block b's two halves for 16 tokens into dots[0] and dots[1]
// (16 tokens x 16 rows each), through tile pair C (0: tiles 0/1, 1: tiles 6/7).
template <int C>
inline void block_dots(const uint8_t* quants, const uint8_t* xq, size_t x_stride, int32_t (*dots)[kTileTokens][16]) {
  _tile_loadd(4, quants, 64);
  _tile_loadd(5, quants + 256, 64);
  _tile_loadd(2, xq, x_stride);
  _tile_loadd(3, xq + 16, x_stride);
  if constexpr (C == 0) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_dpbsud(0, 2, 4);
    _tile_dpbsud(1, 3, 5);
    _tile_stored(0, dots[0], 64);
    _tile_stored(1, dots[1], 64);
  } else {
    _tile_zero(6);
    _tile_zero(7);
    _tile_dpbsud(6, 2, 4);
    _tile_dpbsud(7, 3, 5);
    _tile_stored(6, dots[0], 64);
    _tile_stored(7, dots[1], 64);
  }
}

// Group `rec` (nb records) against the 16 tokens of x (token t's blocks at x + t * nb):
// out[t * out_stride + row] for the group's 16 rows. `quants`: the records' quant lines,
// 512 bytes a block (for 4-bit types the unpacked copy, else the records themselves at
// their own stride). Software-pipelined: block b + 1's tile products run (on the other
// tile pair, into the other buffer) while block b's float steps run on the vector units.
template <GgmlType T>
void tile16(const uint8_t* rec, const uint8_t* quants, size_t quant_stride, int64_t nb, const Q8Block* x,
            const Scalars* scalars, float* out, int64_t out_stride) {
  constexpr PackFormat F = pack_format(T);
  alignas(64) int32_t dots[2][2][kTileTokens][16];
  __m512 acc[kTileTokens];
  for (int t = 0; t < kTileTokens; ++t) acc[t] = _mm512_setzero_ps();
  const size_t x_stride = static_cast<size_t>(nb) * sizeof(Q8Block);
  auto x_q = [&](int64_t b) { return reinterpret_cast<const uint8_t*>(x[b].q); };
  block_dots<0>(quants, x_q(0), x_stride, dots[0]);
  for (int64_t b = 0; b < nb; ++b, rec += F.record_bytes()) {
    if (b + 1 < nb) {
      if (b % 2 == 0) block_dots<1>(quants + (b + 1) * quant_stride, x_q(b + 1), x_stride, dots[1]);
      else block_dots<0>(quants + (b + 1) * quant_stride, x_q(b + 1), x_stride, dots[0]);
    }
    const int32_t (*d)[kTileTokens][16] = dots[b % 2];
    const Scalars& sx = scalars[b];
    const uint8_t* sc = rec + F.q_bytes();
    const __m512 d0 = load_scales(sc, F.f16_scales);
    __m512 d1 = d0, mn = d0;
    if constexpr (F.half_scales) d1 = load_scales(sc + kGroupRows * F.scale_bytes(), F.f16_scales);
    if constexpr (F.with_min) mn = load_scales(sc + F.d_bytes(), F.f16_scales);
    for (int t = 0; t < kTileTokens; ++t) {
      __m512i i0 = _mm512_load_si512(d[0][t]), i1 = _mm512_load_si512(d[1][t]);
      if constexpr (F.zero_point != 0) {
        // The VNNI kernel starts its sums at -zero_point x isum: the same integers.
        i0 = _mm512_add_epi32(_mm512_set1_epi32(sx.zp[0][t]), i0);
        i1 = _mm512_add_epi32(_mm512_set1_epi32(sx.zp[1][t]), i1);
      }
      if constexpr (F.half_scales) {
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(i0), _mm512_set1_ps(sx.d[0][t])), d0, acc[t]);
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(i1), _mm512_set1_ps(sx.d[1][t])), d1, acc[t]);
      } else {
        const __m512 s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_set1_ps(sx.d[1][t]),
                                         _mm512_mul_ps(_mm512_cvtepi32_ps(i0), _mm512_set1_ps(sx.d[0][t])));
        acc[t] = _mm512_fmadd_ps(s, d0, acc[t]);
      }
      if constexpr (F.with_min) acc[t] = _mm512_fmadd_ps(mn, _mm512_set1_ps(sx.s[t]), acc[t]);
    }
  }
  for (int t = 0; t < kTileTokens; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

// Groups [g0, g1) against n >= 16 tokens: full tiles of 16 tokens on AMX, the rest on
// the VNNI kernel.
template <GgmlType T>
void groups_amx(const PackedMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t g0, int64_t g1) {
  constexpr PackFormat F = pack_format(T);
  const int64_t nb = w.cols() / 32, full = n / kTileTokens * kTileTokens;
  static const TileConfig config;
  _tile_loadconfig(&config);
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  thread_local std::vector<Line> unpacked;  // a group's quant lines, 4-bit types
  if constexpr (F.nibbles) unpacked.resize(static_cast<size_t>(nb) * 8);
  alignas(64) float pad[kTileTokens][kGroupRows];  // the last group's rows past w.rows()
  // Per token tile and block, the tokens' scalars side by side (the float steps broadcast
  // them from one base).
  thread_local std::vector<Scalars> scalars;
  scalars.resize(static_cast<size_t>(full / kTileTokens * nb));
  for (int64_t t = 0; t < full; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const Q8Block& q = xq[t * nb + b];
      Scalars& sx = scalars[static_cast<size_t>(t / kTileTokens * nb + b)];
      const int64_t i = t % kTileTokens;
      sx.d[0][i] = q.d[0], sx.d[1][i] = q.d[4], sx.s[i] = q.s;
      sx.zp[0][i] = -F.zero_point * q.isum[0], sx.zp[1][i] = -F.zero_point * q.isum[1];
    }
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* rec = w.group(g);
    const uint8_t* quants = rec;
    size_t quant_stride = F.record_bytes();
    if constexpr (F.nibbles) {
      const __m512i low = _mm512_set1_epi8(0x0F);
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* q = rec + b * F.record_bytes();
        for (int j = 0; j < 4; ++j) {
          const __m512i v = _mm512_loadu_si512(q + 64 * j);
          _mm512_store_si512(unpacked[b * 8 + j].bytes, _mm512_and_si512(v, low));
          _mm512_store_si512(unpacked[b * 8 + j + 4].bytes, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
        }
      }
      quants = reinterpret_cast<const uint8_t*>(unpacked.data());
      quant_stride = 512;
    }
    const int64_t r = g * kGroupRows;
    const bool partial = r + kGroupRows > w.rows();
    for (int64_t t0 = 0; t0 < full; t0 += kTileTokens) {
      float* out = partial ? pad[0] : y + t0 * y_stride + r;
      tile16<T>(rec, quants, quant_stride, nb, xq + t0 * nb, scalars.data() + t0 / kTileTokens * nb, out,
                partial ? kGroupRows : y_stride);
      if (partial)
        for (int t = 0; t < kTileTokens; ++t)
          for (int64_t l = 0; l < w.rows() - r; ++l) y[(t0 + t) * y_stride + r + l] = pad[t][l];
    }
  }
  _tile_release();
  if (full < n) avx512::group_kernel(T)(w, xq + full * nb, n - full, y + full * y_stride, y_stride, g0, g1);
}

}  // namespace

GroupsFn group_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return groups_amx<GgmlType::kQ4_0>;
    case GgmlType::kQ4_1: return groups_amx<GgmlType::kQ4_1>;
    case GgmlType::kQ5_0: return groups_amx<GgmlType::kQ5_0>;
    case GgmlType::kQ5_1: return groups_amx<GgmlType::kQ5_1>;
    case GgmlType::kQ8_0: return groups_amx<GgmlType::kQ8_0>;
    case GgmlType::kQ4_K: return groups_amx<GgmlType::kQ4_K>;
    case GgmlType::kQ5_K: return groups_amx<GgmlType::kQ5_K>;
    case GgmlType::kQ6_K: return groups_amx<GgmlType::kQ6_K>;
    default: return nullptr;
  }
}

}  // namespace amx
}  // namespace kiln::llm::kernels
