#pragma once
// The two products of attention over one cached block of positions, for the query rows
// of one KV head: scores (queries x keys) and the probability-weighted sum of values.
// Compiled for AVX2 and AVX-512 (chosen at run time, kiln/core/cpu_isa.h). A vector lane
// is one position (scores) or one head dimension (values), and every lane runs the same
// sequence of fused multiply-adds whatever the instruction set or how many rows share a
// call, so a query's result never depends on the batch or the CPU's level.
#include <cstdint>

namespace kiln::llm::kernels {

// The lanes a key block is padded to (positions are multiples of it in `kt`).
constexpr int64_t kAttnLanes = 16;

// s[r * s_stride + j] = scale * sum_d q[r][d] * kt[d * lanes + j] for r < rows, j < lanes
// (lanes a multiple of kAttnLanes; kt: the block's keys transposed, hd x lanes, zero past
// the block's positions); the sum runs over d in order, one fused multiply-add per term.
void attn_scores(const float* const* q, int64_t rows, const float* kt, int64_t lanes, int64_t hd, float scale, float* s,
                 int64_t s_stride);

// out[r][i] += sum_{j < m} p[r * p_stride + j] * v[j * hd + i] for r < rows, i < hd, one
// fused multiply-add per term in order of j (v: the block's values, m x hd).
void attn_values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const float* v, int64_t hd,
                 float* const* out);

}  // namespace kiln::llm::kernels
