#pragma once
// Launchers of attention_kernels.cu (internal): fused scaled dot-product attention.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "broadcast.h"
#include "kiln/core/dtype.h"

namespace kiln::cuda {

struct AttentionProblem {
  const void* q = nullptr;     // [batch_q..., lq, d]
  const void* k = nullptr;     // [batch_k..., lk, d]
  const void* v = nullptr;     // [batch_v..., lk, dv]
  const void* mask = nullptr;  // [batch_m..., mq, mk] with mq in {1, lq}, mk in {1, lk}; or null
  void* out = nullptr;         // [batch..., lq, dv], contiguous
  int64_t batch = 1, lq = 0, lk = 0, d = 0, dv = 0;
  double scale = 1.0;
  bool causal = false;  // query i sees keys j <= i
  // 0: no mask; 1: bool (false masks out); 2: q's dtype, added; 3: f32 (q f16/bf16), added.
  int mask_kind = 0;
  int64_t mask_mat = 0;       // elements per mask matrix (mq * mk)
  int64_t m_sq = 0, m_sk = 0;  // mask strides along queries and keys (0: broadcast)
  // Output batch index -> operand batch index (in matrices).
  BroadcastMap qm, km, vm, mm;
};

// Dynamic shared memory the kernel needs for head dim d, value dim dv.
size_t attention_smem_bytes(DType dtype, int64_t d, int64_t dv);

// out = softmax(scale * q k^T + mask, causal limit) v per batch; rows that see no key
// are 0. Floating dtypes; 16-bit floats compute in float, f64 in double.
void launch_attention(const AttentionProblem& p, DType dtype, cudaStream_t stream);

// paged_attention: q [T, H, d], caches [N, B, Hkv, d], block tables i32 [S, M], per
// query its sequence and last position (i32 [T]); out [T, H, d] in q's dtype.
struct PagedAttentionProblem {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const int32_t *tables = nullptr, *seq = nullptr, *pos = nullptr;
  void* out = nullptr;
  int64_t T = 0;
  int H = 0, d = 0, B = 0, hkv = 0, M = 0;
  float scale = 1.0f;
  int window = 0;      // > 0: the last `window` positions only (sliding window)
  float softcap = 0;   // > 0: scores become softcap * tanh(score / softcap)
};
constexpr int kPagedMaxHeadDim = 256;

// One warp per (query, head) walks the query's positions with an online softmax in f32.
void launch_paged_attention(const PagedAttentionProblem& p, DType q_dtype, DType kv_dtype, cudaStream_t stream);

}  // namespace kiln::cuda
