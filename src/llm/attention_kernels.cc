// Attention's block products: the AVX2 form (the build's baseline) and the dispatch to
// the AVX-512 one (attention_kernels_avx512.cc).
#define KILN_LLM_ISA avx2
#include "llm/quant_kernels_impl.h"
#include "llm/attention_kernels_impl.h"
#undef KILN_LLM_ISA

#include "kiln/core/cpu_isa.h"

namespace kiln::llm::kernels {
namespace avx512 {  // attention_kernels_avx512.cc
void attn_scores(const float* const* q, int64_t rows, const half* kt, int64_t kt_stride, int64_t m, int64_t hd,
                 float scale, float* s, int64_t s_stride);
void attn_values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride, int64_t hd,
                 float* const* out);
}  // namespace avx512

void attn_scores(const float* const* q, int64_t rows, const half* kt, int64_t kt_stride, int64_t m, int64_t hd,
                 float scale, float* s, int64_t s_stride) {
  if (cpu_has(CpuIsa::kAvx512)) avx512::attn_scores(q, rows, kt, kt_stride, m, hd, scale, s, s_stride);
  else avx2::scores(q, rows, kt, kt_stride, m, hd, scale, s, s_stride);
}

void attn_values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride, int64_t hd,
                 float* const* out) {
  if (cpu_has(CpuIsa::kAvx512)) avx512::attn_values(p, p_stride, rows, m, v, v_stride, hd, out);
  else avx2::values(p, p_stride, rows, m, v, v_stride, hd, out);
}

}  // namespace kiln::llm::kernels
