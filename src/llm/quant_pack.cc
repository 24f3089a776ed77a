// Repacking ggml blocks into the group kernels' layout (PackFormat in quant_kernels.h):
// every block of 32 weights becomes 32 unsigned integers with a scale (two for q6_K's
// blocks of 16), an offset for the types with a min, and the type's zero point.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/core/parallel.h"
#include "llm/quant_kernels.h"

namespace kiln::llm::kernels {
namespace {

inline uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float f16(const uint8_t* p) { return half::to_float(u16(p)); }

// Block b (of 32 weights) of a row, decomposed: the weights (q, or for 4-bit types
// `nib`, weight i in the low and weight 16 + i in the high nibble of byte i: the packed
// lines' layout), the scales as the file's f16 bits (d16/m16) where the format keeps
// f16, as f32 otherwise.
struct Parts {
  uint8_t q[32];
  uint8_t nib[16];
  uint16_t d16 = 0, m16 = 0;
  float d[2] = {0, 0}, m = 0;
};

// Scale and min j (0..7) of a q4_K/q5_K super-block (6 bits each in 12 bytes).
inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <GgmlType T>
inline void decompose(const uint8_t* row, int64_t b, Parts& p) {
  if constexpr (T == GgmlType::kQ4_0 || T == GgmlType::kQ4_1) {
    constexpr bool kMin = T == GgmlType::kQ4_1;
    const uint8_t* blk = row + b * (kMin ? 20 : 18);
    p.d16 = u16(blk);
    if (kMin) p.m16 = u16(blk + 2);
    std::memcpy(p.nib, blk + (kMin ? 4 : 2), 16);  // already weight i | weight 16 + i << 4
  } else if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
    constexpr bool kMin = T == GgmlType::kQ5_1;
    const uint8_t* blk = row + b * (kMin ? 24 : 22);
    p.d16 = u16(blk);
    if (kMin) p.m16 = u16(blk + 2);
    const uint8_t* h = blk + (kMin ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, h, 4);
    const uint8_t* qs = h + 4;
    for (int j = 0; j < 16; ++j) {
      p.q[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10));
      p.q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
    }
  } else if constexpr (T == GgmlType::kQ8_0) {
    const uint8_t* blk = row + b * 34;
    p.d16 = u16(blk);
    for (int j = 0; j < 32; ++j) p.q[j] = static_cast<uint8_t>(blk[2 + j] ^ 0x80);  // q + 128
  } else if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K) {
    constexpr bool kFive = T == GgmlType::kQ5_K;
    const uint8_t* sb = row + (b / 8) * (kFive ? 176 : 144);
    const int j = static_cast<int>(b % 8);
    int sc, mn;
    scale_min_k4(j, sb + 4, &sc, &mn);
    p.d[0] = f16(sb) * static_cast<float>(sc);
    p.m = -(f16(sb + 2) * static_cast<float>(mn));
    const uint8_t* qs = sb + (kFive ? 48 : 16) + 32 * (j / 2);
    const int shift = 4 * (j & 1);
    if constexpr (kFive) {
      for (int l = 0; l < 32; ++l) p.q[l] = static_cast<uint8_t>(((qs[l] >> shift) & 0xF) | (((sb[16 + l] >> j) & 1) << 4));
    } else {
      for (int i = 0; i < 16; ++i) p.nib[i] = static_cast<uint8_t>(((qs[i] >> shift) & 0xF) | (((qs[16 + i] >> shift) & 0xF) << 4));
    }
  } else if constexpr (T == GgmlType::kQ6_K) {
    const uint8_t* sb = row + (b / 8) * 210;
    const int j = static_cast<int>(b % 8), chunk = j / 4, k = j % 4;
    const uint8_t* ql = sb + 64 * chunk + ((k & 1) ? 32 : 0);
    const uint8_t* qh = sb + 128 + 32 * chunk;
    const auto* sc = reinterpret_cast<const int8_t*>(sb + 192 + 8 * chunk);
    const float d = f16(sb + 208);
    p.d[0] = d * static_cast<float>(sc[2 * k]);
    p.d[1] = d * static_cast<float>(sc[2 * k + 1]);
    const int shift = k >= 2 ? 4 : 0;
    for (int l = 0; l < 32; ++l) p.q[l] = static_cast<uint8_t>(((ql[l] >> shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4));
  }
}

template <class S>
void put(uint8_t* dst, int64_t i, S v) {
  std::memcpy(dst + i * static_cast<int64_t>(sizeof(S)), &v, sizeof(S));
}

// Packs groups [g0, g1) of `w` into `data`.
template <GgmlType T>
void pack_groups(const QMatrix& w, uint8_t* data, size_t group_bytes, int64_t g0, int64_t g1) {
  constexpr PackFormat f = pack_format(T);
  const int64_t nb = w.cols / 32;
  Parts p;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t rows = std::min(kGroupRows, w.rows - g * kGroupRows);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = w.data + static_cast<size_t>(g * kGroupRows + r) * w.row_bytes;
      uint8_t* rec = data + static_cast<size_t>(g) * group_bytes;
      for (int64_t b = 0; b < nb; ++b, rec += f.record_bytes()) {
        decompose<T>(row, b, p);
        // Weights 4j..4j+3 of the block go to line j at byte 4r (4-bit: lines 4..7 are the high nibbles of 0..3).
        for (int j = 0; j < (f.nibbles ? 4 : 8); ++j) std::memcpy(rec + 64 * j + 4 * r, (f.nibbles ? p.nib : p.q) + 4 * j, 4);
        uint8_t* sc = rec + f.q_bytes();
        uint8_t* mn = sc + f.d_bytes();
        if constexpr (f.f16_scales) {
          put(sc, r, p.d16);
          if (f.with_min) put(mn, r, p.m16);
        } else {
          put(sc, r, p.d[0]);
          if (f.half_scales) put(sc, kGroupRows + r, p.d[1]);
          if (f.with_min) put(mn, r, p.m);
        }
      }
    }
  }
}

using PackFn = void (*)(const QMatrix&, uint8_t*, size_t, int64_t, int64_t);

PackFn pack_fn(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return pack_groups<GgmlType::kQ4_0>;
    case GgmlType::kQ4_1: return pack_groups<GgmlType::kQ4_1>;
    case GgmlType::kQ5_0: return pack_groups<GgmlType::kQ5_0>;
    case GgmlType::kQ5_1: return pack_groups<GgmlType::kQ5_1>;
    case GgmlType::kQ8_0: return pack_groups<GgmlType::kQ8_0>;
    case GgmlType::kQ4_K: return pack_groups<GgmlType::kQ4_K>;
    case GgmlType::kQ5_K: return pack_groups<GgmlType::kQ5_K>;
    case GgmlType::kQ6_K: return pack_groups<GgmlType::kQ6_K>;
    default: return nullptr;
  }
}

}  // namespace

void PackedMatrix::Free::operator()(uint8_t* p) const { std::free(p); }

PackedMatrix::PackedMatrix(const QMatrix& w) : type_(w.type), rows_(w.rows), cols_(w.cols) {
  if (!packable(w.type) || w.cols % 32 != 0 || w.rows < 1)
    throw InvalidArgumentError(detail::str_cat("PackedMatrix: cannot pack ", w.rows, " x ", w.cols, " ",
                                               ggml_type_name(static_cast<uint32_t>(w.type))));
  const PackFormat f = pack_format(w.type);
  const int64_t nb = w.cols / 32;
  group_bytes_ = static_cast<size_t>(nb) * f.record_bytes();
  bytes_ = group_bytes_ * static_cast<size_t>(groups());
  const size_t alloc = (bytes_ + 63) / 64 * 64;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, alloc)));
  if (!data_) throw ResourceExhaustedError(detail::str_cat("PackedMatrix: cannot allocate ", alloc, " bytes"));
  std::memset(data_.get(), 0, alloc);  // the last group's padding rows: zero weights and scales
  const PackFn fn = pack_fn(w.type);
  parallel_for(groups(), 16, [&](int64_t g0, int64_t g1) { fn(w, data_.get(), group_bytes_, g0, g1); });
}

}  // namespace kiln::llm::kernels
