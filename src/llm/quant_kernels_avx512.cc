// The integer row and group kernels compiled for AVX-512 + VNNI (flags in src/CMakeLists.txt);
// quant_kernels.cc calls them only where cpu_has(CpuIsa::kAvx512Vnni).
#define KILN_LLM_ISA avx512_impl
#include "llm/quant_kernels_impl.h"

namespace kiln::llm::kernels::avx512 {
RowsFn integer_kernel(GgmlType type) { return avx512_impl::integer_kernel(type); }
GroupsFn group_kernel(GgmlType type) { return avx512_impl::group_kernel(type); }
}  // namespace kiln::llm::kernels::avx512
