#pragma once
// Helpers shared by the nn kernels of the CPU backend (internal).
#include <cstring>
#include <string>

#include "kernel_util.h"
#include "kiln/core/kernel.h"
#include "../common/nn_geometry.h"
#include "onednn.h"

namespace kiln::cpu::nn {

using dnnl::memory;

// Plain activation memory: logical dims {n, c, h, w}, stored NHWC or NCHW.
inline memory::desc act_md(bool nchw, int64_t n, int64_t c, int64_t h, int64_t w,
                           memory::data_type dt = memory::data_type::f32) {
  return memory::desc({n, c, h, w}, dt, nchw ? memory::format_tag::nchw : memory::format_tag::nhwc);
}

// The memory descriptor a primitive wants for `what` (e.g. dnnl_query_weights_md).
inline memory::desc queried_md(const dnnl::primitive& p, dnnl_query_t what) {
  const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(p.get_primitive_desc(), what, 0);
  return memory::desc(*md);
}

inline std::string window_key(const nn_geometry::Window2d& w) {
  std::string s;
  for (int64_t v : {w.kh, w.kw, w.sh, w.sw, w.dh, w.dw, w.pt, w.pb, w.pl, w.pr, w.oh, w.ow})
    s += std::to_string(v) + ",";
  return s;
}

// f32 and f64 kernels from a template; f16/bf16 through f32.
#define KILN_NN_REG_FLOAT(op, K)                                    \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF32, K<float>);            \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF64, K<double>);           \
  KILN_REGISTER_KERNEL(op, kCPU, (std::initializer_list<DType>{DType::kF16, DType::kBF16}), via_f32<K<float>>)

}  // namespace kiln::cpu::nn
