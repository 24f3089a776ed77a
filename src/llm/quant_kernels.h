#pragma once
// Products of quantised weight rows (ggml block types) with activations, the hot loop
// of LLM inference. Activations are quantised on the fly to 8-bit blocks of 32 (a
// float scale and the scaled integer sum per block, as llama.cpp's q8_1), so that the
// 32-weight block types multiply in integers and scale once per block.
//
// Two kernel families:
// - Group kernels (the fast path) over a PackedMatrix: the weights repacked at load so
//   that 16 rows x 4 consecutive weights fill one 512-bit register (8 rows on AVX2); one
//   VNNI dot product then advances 16 outputs by 4 weights, with the token's 4
//   activations broadcast. Every supported type (q4_0 ... q8_0 and q4_K, q5_K, q6_K)
//   becomes unsigned integer weights with a per-32 (q6_K: per-16) float scale, an optional
//   per-32 offset term, and an integer zero point that is subtracted exactly through the
//   activations' integer sums. Each output lane runs the same integer and float
//   operations whatever the tile or instruction set, so results are bit-identical across
//   batch composition and ISA.
// - Row kernels over the file's own blocks (types and shapes the packer does not take):
//   integer dots for the 32-blocks, rows decoded to f32 for the others.
//
// Rows are processed against a small batch of activation vectors at once (decode of
// several sequences, prompt chunks): the weights are read from memory once for all.
// Each kernel has an AVX2 form (the build's baseline) and an AVX-512 VNNI form chosen
// at run time (kiln/core/cpu_isa.h); the group kernels also an AMX form, for calls of
// kAmxMinTokens tokens or more (prefill, large decode batches).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kiln/llm/ggml_type.h"

namespace kiln::llm::kernels {

struct Q8Block {
  float d[8];  // scales of the two halves, each 4 times: x[i] ~= d[4 * (i / 16)] * q[i]; the
               // layout of the 8 int32 lanes of a 32-byte dot product (lanes 0-3: bytes 0-15)
  float s;     // sum of the dequantised values: what a weight block's offset (min) multiplies
  int32_t isum[2];  // integer sums of q over each half: what a weight zero point multiplies
  int8_t q[32];
};
static_assert(sizeof(Q8Block) == 76);

// Quantises n (a multiple of 32) floats into n / 32 blocks.
void quantize_q8(const float* x, Q8Block* out, int64_t n);

class PackedMatrix;

// A weight matrix in ggml layout: `rows` rows of `cols` weights, `row_bytes` apart, and
// its packed copy if it has one (then the group kernels multiply it).
struct QMatrix {
  GgmlType type;
  const uint8_t* data;
  int64_t rows, cols;
  size_t row_bytes;
  const PackedMatrix* packed = nullptr;
};

// y[t * y_stride + r] = dot(row r of w, x_t) for tokens t < n and rows r in [r0, r1).
// xq: the n activation vectors quantised (cols / 32 blocks each, consecutive); x: the
// same as floats (n x cols, for types without an integer kernel).
void matmul_rows(const QMatrix& w, const Q8Block* xq, const float* x, int64_t n, float* y, int64_t y_stride,
                 int64_t r0, int64_t r1);

using RowsFn = void (*)(const QMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t r0,
                        int64_t r1);

// Whether `type` has an integer row kernel (else rows are decoded to f32).
bool has_integer_kernel(GgmlType type);

// How a type's blocks of 32 weights are stored once packed. A packed matrix is groups of
// 16 rows (the last zero-padded); a group is cols / 32 records, one per 32 columns:
//   quants: 8 lines of 64 bytes (line j: rows 0..15 x weights 4j..4j+3 of the block, as
//           unsigned bytes), or for 4-bit types 4 lines whose low nibbles are lines 0..3
//           and high nibbles lines 4..7;
//   scales: 16 (half_scales: 2 x 16, per 16 weights) f16 or f32, row order;
//   offsets (with_min): 16 of the same type.
// Weight (r, k) = scale(r) x (q(r, k) - zero_point) + offset(r).
struct PackFormat {
  bool nibbles, with_min, half_scales, f16_scales;
  int zero_point;
  constexpr size_t q_bytes() const { return nibbles ? 256 : 512; }
  constexpr size_t scale_bytes() const { return f16_scales ? 2 : 4; }
  constexpr size_t d_bytes() const { return (half_scales ? 32 : 16) * scale_bytes(); }
  constexpr size_t m_bytes() const { return with_min ? 16 * scale_bytes() : 0; }
  constexpr size_t record_bytes() const { return q_bytes() + d_bytes() + m_bytes(); }
};

// The packed form of `type`, if it has one.
constexpr bool packable(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1: case GgmlType::kQ8_0:
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K: return true;
    default: return false;
  }
}
constexpr PackFormat pack_format(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {true, false, false, true, 8};
    case GgmlType::kQ4_1: return {true, true, false, true, 0};
    case GgmlType::kQ5_0: return {false, false, false, true, 16};
    case GgmlType::kQ5_1: return {false, true, false, true, 0};
    case GgmlType::kQ8_0: return {false, false, false, true, 128};
    case GgmlType::kQ4_K: return {true, true, false, false, 0};
    case GgmlType::kQ5_K: return {false, true, false, false, 0};
    case GgmlType::kQ6_K: return {false, false, true, false, 32};
    default: return {false, false, false, false, 0};
  }
}

constexpr int64_t kGroupRows = 16;
constexpr int64_t kAmxMinTokens = 16;  // one AMX tile of tokens

// A QMatrix repacked (owns its memory, 64-byte aligned).
class PackedMatrix {
 public:
  // Packs `w` (a packable type, cols a multiple of 32) on kiln's intra-op pool.
  explicit PackedMatrix(const QMatrix& w);
  GgmlType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t groups() const { return (rows_ + kGroupRows - 1) / kGroupRows; }
  size_t bytes() const { return bytes_; }
  // The first record of group g.
  const uint8_t* group(int64_t g) const { return data_.get() + static_cast<size_t>(g) * group_bytes_; }

 private:
  struct Free { void operator()(uint8_t* p) const; };
  GgmlType type_;
  int64_t rows_, cols_;
  size_t group_bytes_, bytes_;
  std::unique_ptr<uint8_t[], Free> data_;
};

// y[t * y_stride + r] = dot(row r of w, x_t) for tokens t < n and rows r of groups
// [g0, g1) (rows past w.rows() are not written). Bit-identical whatever n, the group
// range and the instruction set.
void matmul_groups(const PackedMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t g0, int64_t g1);

using GroupsFn = void (*)(const PackedMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t g0,
                          int64_t g1);

// The kernel families in use: "amx from 16 tokens, else avx512_vnni", "avx512_vnni" or "avx2".
const char* kernel_isa();

}  // namespace kiln::llm::kernels
