#pragma once
// The two products of attention over one cached block of positions, for the query rows
// of one KV head, reading the cache's f16 keys and values directly: scores (queries x
// keys) and the probability-weighted sum of values. Compiled for AVX2 and AVX-512
// (chosen at run time, kiln/core/cpu_isa.h). A vector lane is one position (scores) or
// one head dimension (values), and every lane runs the same sequence of operations
// whatever the instruction set or how many rows share a call, so a query's result never
// depends on the batch or the CPU's level (f16 -> f32 is exact).
#include <cstdint>

#include "kiln/core/half.h"

namespace kiln::llm::kernels {

// The lanes scores are computed in: a block's scores take round_up(positions, 16) floats.
constexpr int64_t kAttnLanes = 16;

// s[r * s_stride + j] = scale * sum_d q[r][d] * kt[d * kt_stride + j] for r < rows and
// j < round_up(m, 16) (lanes at or past m hold values to ignore). kt: a block's keys of
// one head, transposed (hd rows of kt_stride >= m positions). Each score sums d in four
// interleaved chains (d mod 4, fused multiply-adds in order of d), joined as
// (c0 + c1) + (c2 + c3).
void attn_scores(const float* const* q, int64_t rows, const half* kt, int64_t kt_stride, int64_t m, int64_t hd,
                 float scale, float* s, int64_t s_stride);

// out[r][i] += sum_{j < m} p[r * p_stride + j] * v[j * v_stride + i] for r < rows, i < hd,
// one fused multiply-add per term in order of j (v: a block's values of one head).
void attn_values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride, int64_t hd,
                 float* const* out);

}  // namespace kiln::llm::kernels
