#pragma once
// Products of quantised weight rows (ggml block types) with activations, the hot loop
// of LLM inference. Activations are quantised on the fly to 8-bit blocks of 32 (a
// float scale and the scaled integer sum per block, as llama.cpp's q8_1), so that the
// 32-weight block types multiply in integers and scale once per block.
//
// Rows are processed against a small batch of activation vectors at once (decode of
// several sequences, short prompts): a weight row is read from memory once for all of
// them. Long prompts use matmul_f32 (rows decoded to f32, then oneDNN's SGEMM).
//
// Each integer kernel has an AVX2 form (the build's baseline) and an AVX-512 VNNI form
// chosen at run time (kiln/core/cpu_isa.h); types without one decode rows to f32 (exact,
// slower): the K types today.
#include <cstddef>
#include <cstdint>

#include "kiln/llm/ggml_type.h"

namespace kiln::llm::kernels {

struct Q8Block {
  float d[8];  // scales of the two halves, each 4 times: x[i] ~= d[4 * (i / 16)] * q[i]; the
               // layout of the 8 int32 lanes of a 32-byte dot product (lanes 0-3: bytes 0-15)
  float s;     // sum of the dequantised values: what a weight block's offset (min) multiplies
  int8_t q[32];
};
static_assert(sizeof(Q8Block) == 68);

// Quantises n (a multiple of 32) floats into n / 32 blocks.
void quantize_q8(const float* x, Q8Block* out, int64_t n);

// A weight matrix in ggml layout: `rows` rows of `cols` weights, `row_bytes` apart.
struct QMatrix {
  GgmlType type;
  const uint8_t* data;
  int64_t rows, cols;
  size_t row_bytes;
};

// y[t * y_stride + r] = dot(row r of w, x_t) for tokens t < n and rows r in [r0, r1).
// xq: the n activation vectors quantised (cols / 32 blocks each, consecutive); x: the
// same as floats (n x cols, for types without an integer kernel).
void matmul_rows(const QMatrix& w, const Q8Block* xq, const float* x, int64_t n, float* y, int64_t y_stride,
                 int64_t r0, int64_t r1);

using RowsFn = void (*)(const QMatrix& w, const Q8Block* xq, int64_t n, float* y, int64_t y_stride, int64_t r0,
                        int64_t r1);

// Whether `type` has an integer kernel (else rows are decoded to f32).
bool has_integer_kernel(GgmlType type);

// The kernel family in use: "avx512_vnni" or "avx2".
const char* kernel_isa();

}  // namespace kiln::llm::kernels
