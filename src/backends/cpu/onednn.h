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
#include "kiln/core/parallel.h"

namespace kiln::cpu::onednn {

dnnl::engine& engine();
dnnl::stream& stream();  // one per thread
dnnl::memory::data_type to_dnnl(DType t);

// Returns the primitive cached under `key`, creating it with `make` on first use, in
// the calling thread's cache: one primitive never runs on two threads at once. oneDNN
// 2.6 as Debian builds it (DNNL_ENABLE_CONCURRENT_EXEC off) gives each thread one
// library scratchpad shared by its primitives, so a primitive must run on the thread
// that created it; sharing them across threads made concurrent calls (eager matmuls on
// two threads, two server threads running one model) return wrong results now and then
// (tests/ops/onednn_threads_test.cc).
dnnl::primitive cached(const std::string& key, const std::function<dnnl::primitive()>& make);
// Small primitives run on the calling thread alone. Below serial_macs() multiply-adds
// (KILN_SERIAL_MACS, default 192k), waking the OpenMP pool costs more than a second
// core gains (measured on the 2-core VM, oneDNN 2.6 matmul in a loop: 1x256x128 3.3 us
// on one thread vs 11 us on two, 64x128x10 7.5 vs 12.6, 1x512x256 9.1 vs 14.5;
// 1x784x256 17.6 vs 14.3, 16x256x128 17.0 vs 12.7). oneDNN fixes a primitive's thread
// count when it is created, so a serial primitive is created and executed inside a
// SerialScope and cached under its own key (serial_tag).
int64_t serial_macs();
// Inside a parallel region (kiln::parallel_invoke: two graph nodes at once) every
// primitive runs on its caller's thread.
inline bool runs_serial(int64_t macs) { return macs < serial_macs() || detail::in_parallel_region(); }
inline const char* serial_tag(bool serial) { return serial ? "|serial" : ""; }

// Whether oneDNN runs AVX-512 kernels on this CPU (its effective ISA, which
// ONEDNN_MAX_CPU_ISA can lower): kiln's AVX2 kernels then lose to some of its
// primitives (direct_conv::uses_general_tile).
bool runs_avx512();
// Limits the calling thread's OpenMP regions to one thread while alive (when `on`).
class SerialScope {
 public:
  explicit SerialScope(bool on);
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int saved_ = 0;  // the thread's pool size before; 0 when not on
};

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
