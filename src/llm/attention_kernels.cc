// Attention's block products: the AVX2 form (the build's baseline) and the dispatch to
// the AVX-512 one (attention_kernels_avx512.cc).
#define KILN_LLM_ISA avx2
#include "llm/quant_kernels_impl.h"
#include "llm/attention_kernels_impl.h"
#undef KILN_LLM_ISA

#include <algorithm>
#include <vector>

#include "kiln/core/cpu_isa.h"

namespace kiln::llm::kernels {
namespace avx512 {  // attention_kernels_avx512.cc
void attn_scores(const float* const* q, int64_t rows, const half* kt, int64_t kt_stride, int64_t lanes, int64_t hd,
                 float scale, float* s, int64_t s_stride);
void attn_values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride, int64_t hd,
                 float* const* out);
}  // namespace avx512

void attn_scores(const float* const* q, int64_t rows, const half* kt, int64_t kt_stride, int64_t m, int64_t hd,
                 float scale, float* s, int64_t s_stride) {
  constexpr int64_t L = kAttnLanes;
  auto run = [&](const half* k, int64_t stride, int64_t lanes, float* out) {
    if (cpu_has(CpuIsa::kAvx512)) avx512::attn_scores(q, rows, k, stride, lanes, hd, scale, out, s_stride);
    else avx2::scores(q, rows, k, stride, lanes, hd, scale, out, s_stride);
  };
  // Whole vectors of 16 positions straight from the rows; a last one that would read past
  // a row (block sizes that are no multiple of 16) from a zero-padded copy.
  const int64_t lanes = (m + L - 1) / L * L, direct = std::min(lanes, kt_stride / L * L);
  if (direct > 0) run(kt, kt_stride, direct, s);
  if (direct < lanes) {
    thread_local std::vector<half> tail;
    tail.assign(static_cast<size_t>(hd * L), half{});
    for (int64_t d = 0; d < hd; ++d)
      std::copy(kt + d * kt_stride + direct, kt + (d + 1) * kt_stride, tail.begin() + d * L);
    run(tail.data(), L, L, s + direct);
  }
}

void attn_values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride, int64_t hd,
                 float* const* out) {
  if (cpu_has(CpuIsa::kAvx512)) avx512::attn_values(p, p_stride, rows, m, v, v_stride, hd, out);
  else avx2::values(p, p_stride, rows, m, v, v_stride, hd, out);
}

}  // namespace kiln::llm::kernels
