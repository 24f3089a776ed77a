// Attention's block products compiled for AVX-512 (flags in src/CMakeLists.txt);
// attention_kernels.cc calls them only where cpu_has(CpuIsa::kAvx512).
#define KILN_LLM_ISA avx512_impl
#include "llm/quant_kernels_impl.h"
#include "llm/attention_kernels_impl.h"

namespace kiln::llm::kernels::avx512 {
void attn_scores(const float* const* q, int64_t rows, const half* kt, int64_t kt_stride, int64_t lanes, int64_t hd,
                 float scale, float* s, int64_t s_stride) {
  avx512_impl::scores(q, rows, kt, kt_stride, lanes, hd, scale, s, s_stride);
}
void attn_values(const float* p, int64_t p_stride, int64_t rows, int64_t m, const half* v, int64_t v_stride, int64_t hd,
                 float* const* out) {
  avx512_impl::values(p, p_stride, rows, m, v, v_stride, hd, out);
}
}  // namespace kiln::llm::kernels::avx512
