// scaled_dot_product_attention on CUDA: one fused kernel (attention_kernels.cu).
// Batch dims of q, k, v and the mask broadcast (right-aligned); the mask is bool (false
// masks out) or q's dtype (f32 for f16/bf16 q) and is added to the scaled scores;
// causal is top-left aligned (query i sees keys j <= i); rows that see no key are 0.
// And paged_attention over a paged KV cache (one warp per query and head).
#include <algorithm>
#include <cmath>
#include <string>

#include "attention_launch.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

Shape batch_of(const Shape& s, int trail = 2) { return Shape(std::span<const int64_t>(s.begin(), s.end() - trail)); }

void attention(OpContext& ctx) {
  const Tensor &q = ctx.in[0], &k = ctx.in[1], &v = ctx.in[2];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  AttentionProblem p;
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.out = out.raw_data();
  p.lq = q.dim(-2);
  p.d = q.dim(-1);
  p.lk = k.dim(-2);
  p.dv = v.dim(-1);
  p.causal = ctx.attrs.get_bool("causal", false);
  p.scale = ctx.attrs.has("scale") ? ctx.attrs.get_float("scale") : 1.0 / std::sqrt(static_cast<double>(p.d));
  const Shape ob = batch_of(out.shape());
  p.batch = ob.numel();
  p.qm = make_broadcast_map(ob, batch_of(q.shape()));
  p.km = make_broadcast_map(ob, batch_of(k.shape()));
  p.vm = make_broadcast_map(ob, batch_of(v.shape()));
  if (ctx.in.size() == 4) {
    const Tensor& mask = ctx.in[3];
    Shape full = mask.shape();
    while (full.rank() < 2) full.insert(0, 1);
    const int64_t mq = full.dim(-2), mk = full.dim(-1);
    p.mask = mask.raw_data();
    p.mask_kind = mask.dtype() == DType::kBool ? 1 : mask.dtype() == q.dtype() ? 2 : 3;
    p.mask_mat = mq * mk;
    p.m_sk = mk == 1 ? 0 : 1;
    p.m_sq = mq == 1 ? 0 : mk;
    p.mm = make_broadcast_map(ob, batch_of(full));
  }
  KernelScope s(out);
  const size_t smem = attention_smem_bytes(out.dtype(), p.d, p.dv);
  if (smem > s.ctx.props.sharedMemPerBlockOptin)
    throw UnimplementedError("scaled_dot_product_attention on CUDA: head dim " + std::to_string(p.d) + " (" +
                             std::string(dtype_name(out.dtype())) + ") needs " + std::to_string(smem) +
                             " bytes of shared memory, the device has " +
                             std::to_string(s.ctx.props.sharedMemPerBlockOptin));
  const int64_t blocks = ((p.lq + 63) / 64) * ((p.dv + 127) / 128) * p.batch;
  if (blocks > 0x7fffffff)
    throw UnimplementedError("scaled_dot_product_attention on CUDA: problem too large (" + out.shape().str() + ")");
  launch_attention(p, out.dtype(), s.stream);
}

KILN_REGISTER_KERNEL("scaled_dot_product_attention", kCUDA, KILN_CUDA_FLOAT_DTYPES, attention);

// paged_attention: indices are the caller's contract here (not checked on the device).
void paged_attention(OpContext& ctx) {
  const Tensor &q = ctx.in[0], &kc = ctx.in[1], &tables = ctx.in[3];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  PagedAttentionProblem p;
  p.q = q.raw_data();
  p.k = kc.raw_data();
  p.v = ctx.in[2].raw_data();
  p.tables = static_cast<const int32_t*>(tables.raw_data());
  p.seq = static_cast<const int32_t*>(ctx.in[4].raw_data());
  p.pos = static_cast<const int32_t*>(ctx.in[5].raw_data());
  p.out = out.raw_data();
  p.T = q.dim(0);
  p.H = static_cast<int>(q.dim(1));
  p.d = static_cast<int>(q.dim(2));
  p.B = static_cast<int>(kc.dim(1));
  p.hkv = static_cast<int>(kc.dim(2));
  p.M = static_cast<int>(tables.dim(1));
  p.scale = static_cast<float>(ctx.attrs.has("scale") ? ctx.attrs.get_float("scale") : 1.0 / std::sqrt(static_cast<double>(p.d)));
  const int64_t window = ctx.attrs.get_int("window", 0);
  p.window = static_cast<int>(std::min<int64_t>(window, 0x7fffffff));
  p.softcap = static_cast<float>(ctx.attrs.has("softcap") ? ctx.attrs.get_float("softcap") : 0.0);
  if (p.d > kPagedMaxHeadDim)
    throw UnimplementedError("paged_attention on CUDA: head size " + std::to_string(p.d) + " (at most " +
                             std::to_string(kPagedMaxHeadDim) + ")");
  if (p.T * p.H > 0x7fffffff) throw UnimplementedError("paged_attention on CUDA: too many queries x heads");
  KernelScope s(out);
  launch_paged_attention(p, q.dtype(), kc.dtype(), s.stream);
}

KILN_REGISTER_KERNEL("paged_attention", kCUDA, (std::initializer_list<DType>{DType::kF32, DType::kF16, DType::kBF16}),
                     paged_attention);

}  // namespace
}  // namespace kiln::cuda
