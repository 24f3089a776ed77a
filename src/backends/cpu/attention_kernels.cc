// CPU scaled dot-product attention: one fused kernel.
//
// Work items are (batch, tile of query rows). For each item: S = scale * Q_t K^T
// (a tile of at most ~32K scores, kept in cache), the mask and causal limit are
// applied, a stable softmax runs per row (exp through libmvec), and O_t = P V.
// The two products use oneDNN's sgemm for f32 (single-threaded inside the
// parallel region; the items are the parallelism) and plain loops for f64.
// Causal attention is top-left aligned (query i sees keys j <= i) and computes
// only the columns the tile can see.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/core/kernel.h"
#include "kiln/core/parallel.h"
#include "nn_kernel_util.h"
#include "softmax_row.h"
#include "vecmath.h"

namespace kiln::cpu {
namespace {

// Element offsets of each output batch index into an operand whose batch dims
// broadcast to `out_batch` (right-aligned; size-1 dims broadcast). `trail` is the
// operand's number of trailing (non-batch) dims, `trail_stride` their total size.
std::vector<int64_t> batch_offsets(const Shape& s, int trail, const std::vector<int64_t>& out_batch,
                                   std::vector<int64_t>* strides_out = nullptr) {
  const int nb = static_cast<int>(out_batch.size());
  const int own = s.rank() - trail;
  std::vector<int64_t> stride(nb, 0);
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= own; --i) acc *= s[i];
  for (int i = nb - 1; i >= 0; --i) {
    const int j = own - nb + i;
    const int64_t d = j >= 0 ? s[j] : 1;
    stride[i] = d == 1 ? 0 : acc;
    acc *= d;
  }
  int64_t total = 1;
  for (int64_t d : out_batch) total *= d;
  std::vector<int64_t> off(static_cast<size_t>(total), 0);
  for (int64_t b = 0; b < total; ++b) {
    int64_t rem = b, o = 0;
    for (int i = nb - 1; i >= 0; --i) {
      o += rem % out_batch[i] * stride[i];
      rem /= out_batch[i];
    }
    off[b] = o;
  }
  if (strides_out) *strides_out = stride;
  return off;
}

// C[r, c] = alpha * sum_k A[r, k] * B[c, k]  (row-major, A: rows x K, B: cols x K).
template <typename T>
void gemm_nt(int64_t rows, int64_t cols, int64_t K, T alpha, const T* A, const T* B, T* C) {
  if constexpr (std::is_same_v<T, float>) {
    if (K > 0 && dnnl_sgemm('N', 'T', rows, cols, K, alpha, A, K, B, K, 0.f, C, cols) == dnnl_success) return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < K; ++k) s += A[r * K + k] * B[c * K + k];
      C[r * cols + c] = alpha * s;
    }
}

// C[r, :] = sum_k A[r, k] * B[k, :]  (A: rows x K, B: K x N).
template <typename T>
void gemm_nn(int64_t rows, int64_t N, int64_t K, const T* A, const T* B, T* C) {
  if constexpr (std::is_same_v<T, float>) {
    if (K > 0 && dnnl_sgemm('N', 'N', rows, N, K, 1.f, A, K, B, N, 0.f, C, N) == dnnl_success) return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* c = C + r * N;
    std::fill(c, c + N, T(0));
    for (int64_t k = 0; k < K; ++k) {
      const T a = A[r * K + k];
      if (a == T(0)) continue;
      const T* b = B + k * N;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

template <typename T>
void attention(OpContext& ctx) {
  const Tensor &q = ctx.in[0], &k = ctx.in[1], &v = ctx.in[2];
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  const int64_t lq = q.dim(-2), d = q.dim(-1), lk = k.dim(-2), dv = v.dim(-1);
  const bool causal = ctx.attrs.get_bool("causal", false);
  const T scale = static_cast<T>(ctx.attrs.has("scale") ? ctx.attrs.get_float("scale")
                                                        : 1.0 / std::sqrt(static_cast<double>(d)));
  std::vector<int64_t> out_batch(out.shape().begin(), out.shape().end() - 2);
  const std::vector<int64_t> q_off = batch_offsets(q.shape(), 2, out_batch);
  const std::vector<int64_t> k_off = batch_offsets(k.shape(), 2, out_batch);
  const std::vector<int64_t> v_off = batch_offsets(v.shape(), 2, out_batch);
  const int64_t batch = static_cast<int64_t>(q_off.size());

  // Mask: strides over [batch..., Lq, Lk], 0 along broadcast dims.
  const bool has_mask = ctx.in.size() == 4;
  const bool mask_bool = has_mask && ctx.in[3].dtype() == DType::kBool;
  const void* mask = has_mask ? ctx.in[3].raw_data() : nullptr;
  std::vector<int64_t> m_off;
  int64_t m_sq = 0, m_sk = 0;
  if (has_mask) {
    const Shape& ms = ctx.in[3].shape();
    Shape full = ms;  // pad to rank >= 2 from the left for batch_offsets
    while (full.rank() < 2) full.insert(0, 1);
    m_off = batch_offsets(full, 2, out_batch);
    m_sk = full.dim(-1) == 1 ? 0 : 1;
    m_sq = full.dim(-2) == 1 ? 0 : full.dim(-1);
  }

  // Query rows per tile: keep the score tile near 32K values (L2-resident).
  const int64_t tq = std::clamp<int64_t>(32768 / std::max<int64_t>(lk, 1), 16, 128);
  const int64_t ntiles = (lq + tq - 1) / tq;
  const T* Q = static_cast<const T*>(q.raw_data());
  const T* K = static_cast<const T*>(k.raw_data());
  const T* V = static_cast<const T*>(v.raw_data());
  T* O = static_cast<T*>(out.raw_data());
  const T neg_inf = -std::numeric_limits<T>::infinity();

  parallel_for(batch * ntiles, 1, [&](int64_t lo, int64_t hi) {
    std::vector<T> scores(static_cast<size_t>(std::min(tq, lq) * lk));
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t b = item / ntiles, i0 = item % ntiles * tq, rows = std::min(tq, lq - i0);
      const int64_t cols = causal ? std::min(lk, i0 + rows) : lk;  // keys any row of the tile can see
      T* o = O + (b * lq + i0) * dv;
      if (cols == 0) {
        std::fill(o, o + rows * dv, T(0));
        continue;
      }
      T* S = scores.data();
      gemm_nt<T>(rows, cols, d, scale, Q + q_off[b] + i0 * d, K + k_off[b], S);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        T* s = S + r * cols;
        const int64_t lim = causal ? std::min(cols, i + 1) : cols;
        if (has_mask) {
          const int64_t base = m_off[b] + i * m_sq;
          if (mask_bool) {
            const bool* m = static_cast<const bool*>(mask) + base;
            for (int64_t j = 0; j < lim; ++j)
              if (!m[j * m_sk]) s[j] = neg_inf;
          } else {
            const T* m = static_cast<const T*>(mask) + base;
            if (m_sk == 1) {
#pragma omp simd
              for (int64_t j = 0; j < lim; ++j) s[j] += m[j];
            } else {
              for (int64_t j = 0; j < lim; ++j) s[j] += m[0];
            }
          }
        }
        T mx = neg_inf;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < lim; ++j) mx = std::max(mx, s[j]);
        if (mx == neg_inf) {  // every key masked out: a zero row
          std::fill(s, s + cols, T(0));
          continue;
        }
        softmax_row<T, false>(s, s, lim);
        std::fill(s + lim, s + cols, T(0));
      }
      gemm_nn<T>(rows, dv, cols, S, V + v_off[b], o);
    }
  });
}

KILN_NN_REG_FLOAT("scaled_dot_product_attention", attention);

// paged_attention: one job per (query, KV head); the query heads that share the KV head
// walk the query's positions once, block by block, reading keys and values in place;
// scores and sums in f32 (a row of scores per head, then softmax, then the value sum).
template <typename Q, typename KV>
void paged_attention_typed(OpContext& ctx) {
  const Tensor &q = ctx.in[0], &kc = ctx.in[1], &vc = ctx.in[2], &tables = ctx.in[3];
  const int64_t T = q.dim(0), H = q.dim(1), d = q.dim(2), N = kc.dim(0), B = kc.dim(1), hkv = kc.dim(2);
  const int64_t S = tables.dim(0), M = tables.dim(1), group = H / hkv;
  const float scale = static_cast<float>(ctx.attrs.has("scale") ? ctx.attrs.get_float("scale")
                                                                : 1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t window = ctx.attrs.get_int("window", 0);
  const float softcap = static_cast<float>(ctx.attrs.has("softcap") ? ctx.attrs.get_float("softcap") : 0.0);
  const int32_t* tab = static_cast<const int32_t*>(tables.raw_data());
  const int32_t* seq = static_cast<const int32_t*>(ctx.in[4].raw_data());
  const int32_t* pos = static_cast<const int32_t*>(ctx.in[5].raw_data());
  for (int64_t t = 0; t < T; ++t) {
    if (seq[t] < 0 || seq[t] >= S)
      throw OutOfRangeError("paged_attention: query " + std::to_string(t) + " names sequence " + std::to_string(seq[t]) +
                            ", block_tables has " + std::to_string(S));
    if (pos[t] < 0 || pos[t] >= M * B)
      throw OutOfRangeError("paged_attention: query " + std::to_string(t) + " is at position " + std::to_string(pos[t]) +
                            ", a block table holds " + std::to_string(M * B));
    for (int64_t j = 0; j <= pos[t] / B; ++j) {
      const int32_t b = tab[seq[t] * M + j];
      if (b < 0 || b >= N)
        throw OutOfRangeError("paged_attention: block_tables[" + std::to_string(seq[t]) + "][" + std::to_string(j) + "] is " +
                              std::to_string(b) + ", the cache has " + std::to_string(N) + " blocks");
    }
  }
  const Q* qd = static_cast<const Q*>(q.raw_data());
  const KV* kd = static_cast<const KV*>(kc.raw_data());
  const KV* vd = static_cast<const KV*>(vc.raw_data());
  Q* od = static_cast<Q*>(ctx.out[0].raw_data());
  parallel_for(T * hkv, 1, [&](int64_t j0, int64_t j1) {
    std::vector<float> qf(static_cast<size_t>(d)), acc(static_cast<size_t>(d)), sc;
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t t = job / hkv, kh = job % hkv, n = pos[t] + 1, lo = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      const int32_t* blocks = tab + seq[t] * M;
      sc.resize(static_cast<size_t>(n));
      auto row = [&](const KV* base, int64_t p) { return base + ((blocks[p / B] * B + p % B) * hkv + kh) * d; };
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kh * group + g;
        for (int64_t i = 0; i < d; ++i) qf[static_cast<size_t>(i)] = static_cast<float>(qd[(t * H + h) * d + i]);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t p = lo; p < n; ++p) {
          const KV* k = row(kd, p);
          float dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += qf[static_cast<size_t>(i)] * static_cast<float>(k[i]);
          sc[static_cast<size_t>(p)] = softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
          mx = std::max(mx, sc[static_cast<size_t>(p)]);
        }
        float sum = 0;
        for (int64_t p = lo; p < n; ++p) sum += sc[static_cast<size_t>(p)] = std::exp(sc[static_cast<size_t>(p)] - mx);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t p = lo; p < n; ++p) {
          const KV* v = row(vd, p);
          const float w = sc[static_cast<size_t>(p)] / sum;
          for (int64_t i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += w * static_cast<float>(v[i]);
        }
        for (int64_t i = 0; i < d; ++i) od[(t * H + h) * d + i] = static_cast<Q>(acc[static_cast<size_t>(i)]);
      }
    }
  });
}

template <typename Q>
void paged_attention(OpContext& ctx) {
  switch (ctx.in[1].dtype()) {
    case DType::kF16: return paged_attention_typed<Q, half>(ctx);
    case DType::kBF16: return paged_attention_typed<Q, bfloat16>(ctx);
    default: return paged_attention_typed<Q, float>(ctx);
  }
}

KILN_REGISTER_KERNEL("paged_attention", kCPU, DType::kF32, paged_attention<float>);
KILN_REGISTER_KERNEL("paged_attention", kCPU, DType::kF16, paged_attention<half>);
KILN_REGISTER_KERNEL("paged_attention", kCPU, DType::kBF16, paged_attention<bfloat16>);

}  // namespace
}  // namespace kiln::cpu
