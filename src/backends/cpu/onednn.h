#pragma once
// oneDNN plumbing for the CPU backend (internal): the engine, a per-thread stream,
// a cache of created primitives keyed by their shapes, and a batched GEMM.
//
// oneDNN (Debian's build) runs on the OpenMP pool, the same pool as kiln's own
// kernels (see kiln/core/parallel.h), so the two never oversubscribe the cores.
#include <oneapi/dnnl/dnnl.hpp>

#include <functional>
#include <string>

#include "kiln/core/dtype.h"

namespace kiln::cpu::onednn {

dnnl::engine& engine();
dnnl::stream& stream();  // one per thread
dnnl::memory::data_type to_dnnl(DType t);

// Returns the primitive cached under `key`, creating it with `make` on first use.
// Thread-safe. oneDNN primitives may be executed concurrently.
dnnl::primitive cached(const std::string& key, const std::function<dnnl::primitive()>& make);
// Whether oneDNN has an optimised (non-reference) implementation for `pd`.
bool is_optimized(const dnnl::primitive_desc_base& pd);

// Row-major batched GEMM: C[b] = op(A[b]) * op(B[b]), where op transposes when
// trans_* is set. Batch dims (equal rank for A, B, C) broadcast where A or B has 1.
// A is [batch..., M, K] (or [batch..., K, M] when trans_a), B is [batch..., K, N]
// (or [..., N, K]), C is [batch..., M, N]. dtype f32 or bf16/f16 if oneDNN has an
// optimised kernel (see gemm_supported); returns false when it does not.
struct GemmDims {
  dnnl::memory::dims a_batch, b_batch, c_batch;  // same length, may be empty
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
};
bool gemm(const GemmDims& d, DType dtype, const void* a, const void* b, void* c);
// The same with a bias [N] (dtype f32) added to every row and, when `relu`, a ReLU
// post-op: one pass over C (fused_matmul).
bool gemm(const GemmDims& d, DType dtype, const void* a, const void* b, const void* bias, bool relu, void* c);

}  // namespace kiln::cpu::onednn
