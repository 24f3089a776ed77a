// Fused scaled dot-product attention (flash-attention style, CUDA cores).
//
// A block owns 64 query rows of one batch element and one chunk of at most 128 value
// columns. It walks the keys in tiles of 32: K^T and V tiles go to shared memory
// (converted to the compute type), the 64x32 score tile is computed in registers
// (4 rows x 2 keys per thread), masked, and folded into a running (online) softmax:
// per row a running maximum m and sum l, the output accumulators rescaled by
// exp(m_old - m_new) when the maximum grows; P goes through shared memory into
// O += P V (4 rows x 8 columns per thread). Scores live in the log2 domain (q is
// pre-scaled by scale * log2(e)) so that every exponential is one exp2.
//
// 16-bit floats compute in float, f64 in double. Rows that see no key (all masked,
// or no keys) are 0, as on the CPU.
#include "attention_launch.h"
#include "device_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBQ = 64;          // query rows per block
constexpr int kBK = 32;          // keys per tile
constexpr int kDVC = 128;        // value columns per block
constexpr int kThreadsA = 256;   // 16 x 16
constexpr int kLDQ = kBQ + 4;    // Qs is [d][kLDQ] (transposed; rows of 4 read as one vector)
constexpr int kLDK = kBK + 1;    // Ks is [d][kLDK] (transposed)
constexpr int kLDP = kBQ + 4;    // Ps is [kBK][kLDP] (transposed)
constexpr double kLog2e = 1.4426950408889634;

struct Layout {
  int64_t off_k, off_v, off_p, total;  // in elements of the compute type
};

int64_t round4(int64_t x) { return (x + 3) / 4 * 4; }

Layout layout_for(int64_t d, int64_t dv) {
  const int64_t dvc = dv < kDVC ? dv : kDVC;
  Layout l;
  l.off_k = round4(d * kLDQ);
  l.off_v = round4(l.off_k + d * kLDK);
  l.off_p = round4(l.off_v + kBK * dvc);
  l.total = l.off_p + kBK * kLDP;
  return l;
}

template <typename C>
__device__ __forceinline__ C exp2_c(C x) {
  if constexpr (std::is_same_v<C, double>) return exp2(x);
  else return exp2f(x);
}

template <typename C>
__device__ __forceinline__ void load4(const C* p, C (&v)[4]) {
  if constexpr (std::is_same_v<C, float>) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else {
    const double2 a = reinterpret_cast<const double2*>(p)[0];
    const double2 b = reinterpret_cast<const double2*>(p)[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = b.x;
    v[3] = b.y;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreadsA) attention_kernel(AttentionProblem p, Layout lay, int64_t nqt,
                                                              int64_t nvc) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* Qs = reinterpret_cast<C*>(smem_raw);
  C* Ks = Qs + lay.off_k;
  C* Vs = Qs + lay.off_v;
  C* Ps = Qs + lay.off_p;

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  int64_t id = blockIdx.x;
  const int64_t qt = nqt - 1 - id % nqt;  // the longest causal rows first
  id /= nqt;
  const int64_t vc = id % nvc, b = id / nvc;
  const int64_t q0 = qt * kBQ, vc0 = vc * kDVC;
  const int d = static_cast<int>(p.d);
  const int dvc = static_cast<int>(p.dv - vc0 < kDVC ? p.dv - vc0 : kDVC);
  const int nvg = (dvc + 15) / 16;  // column groups of 16 in use
  const T* Q = static_cast<const T*>(p.q) + p.qm.offset(b) * p.lq * p.d;
  const T* K = static_cast<const T*>(p.k) + p.km.offset(b) * p.lk * p.d;
  const T* V = static_cast<const T*>(p.v) + p.vm.offset(b) * p.lk * p.dv + vc0;
  const int64_t mbase = p.mask_kind ? p.mm.offset(b) * p.mask_mat : 0;
  const C neg_inf = -static_cast<C>(__int_as_float(0x7f800000));

  // Q tile, transposed and pre-scaled (rows past lq are 0).
  const C qscale = static_cast<C>(p.scale * kLog2e);
  for (int e = tid; e < kBQ * d; e += kThreadsA) {
    const int r = e / d, kk = e - r * d;
    const int64_t qi = q0 + r;
    Qs[kk * kLDQ + r] = qi < p.lq ? load_as<C>(Q, qi * p.d + kk) * qscale : C(0);
  }

  C o[4][8];
  C m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = neg_inf;
    l[i] = 0;
#pragma unroll
    for (int c = 0; c < 8; ++c) o[i][c] = 0;
  }

  const int64_t kend = p.causal ? (p.lk < q0 + kBQ ? p.lk : q0 + kBQ) : p.lk;
  for (int64_t k0 = 0; k0 < kend; k0 += kBK) {
    __syncthreads();  // the previous tile's Ks / Vs / Ps are consumed (and Qs is written)
    for (int e = tid; e < kBK * d; e += kThreadsA) {
      const int j = e / d, kk = e - j * d;
      const int64_t kj = k0 + j;
      Ks[kk * kLDK + j] = kj < p.lk ? load_as<C>(K, kj * p.d + kk) : C(0);
    }
    for (int e = tid; e < kBK * dvc; e += kThreadsA) {
      const int j = e / dvc, c = e - j * dvc;
      const int64_t kj = k0 + j;
      Vs[j * dvc + c] = kj < p.lk ? load_as<C>(V, kj * p.dv + c) : C(0);
    }
    __syncthreads();

    // Scores of rows ty*4 + i, keys tx and tx + 16 of the tile.
    C s[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = 0;
#pragma unroll 4
    for (int kk = 0; kk < d; ++kk) {
      C qv[4];
      load4(Qs + kk * kLDQ + ty * 4, qv);
      const C ka = Ks[kk * kLDK + tx], kb = Ks[kk * kLDK + tx + 16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[i][0] += qv[i] * ka;
        s[i][1] += qv[i] * kb;
      }
    }

    // Mask, causal limit and the tile's edge.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t qi = q0 + ty * 4 + i;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t kj = k0 + tx + 16 * j;
        bool keep = qi < p.lq && kj < p.lk && !(p.causal && kj > qi);
        if (keep && p.mask_kind) {
          const int64_t mi = mbase + qi * p.m_sq + kj * p.m_sk;
          if (p.mask_kind == 1)
            keep = static_cast<const uint8_t*>(p.mask)[mi] != 0;
          else if (p.mask_kind == 2)
            s[i][j] += load_as<C>(static_cast<const T*>(p.mask), mi) * static_cast<C>(kLog2e);
          else
            s[i][j] += load_as<C>(static_cast<const float*>(p.mask), mi) * static_cast<C>(kLog2e);
        }
        if (!keep) s[i][j] = neg_inf;
      }
    }

    // Online softmax: the 16 threads of a row are one half-warp.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      C mt = s[i][0] > s[i][1] ? s[i][0] : s[i][1];
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) {
        const C other = __shfl_xor_sync(0xffffffffu, mt, off);
        mt = other > mt ? other : mt;
      }
      const C mn = mt > m[i] ? mt : m[i];
      const C mu = mn == neg_inf ? C(0) : mn;  // no key seen yet: every p is 0
      const C alpha = exp2_c(m[i] - mu);
      const C p0 = exp2_c(s[i][0] - mu), p1 = exp2_c(s[i][1] - mu);
      C rs = p0 + p1;
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, off);
      l[i] = l[i] * alpha + rs;
      m[i] = mn;
#pragma unroll
      for (int c = 0; c < 8; ++c) o[i][c] *= alpha;
      Ps[tx * kLDP + ty * 4 + i] = p0;
      Ps[(tx + 16) * kLDP + ty * 4 + i] = p1;
    }
    __syncthreads();

    // O += P V.
#pragma unroll 4
    for (int jj = 0; jj < kBK; ++jj) {
      C pv[4];
      load4(Ps + jj * kLDP + ty * 4, pv);
      const C* vrow = Vs + jj * dvc + tx;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        if (c < nvg) {
          const C vv = vrow[16 * c];  // columns past dvc read scratch and are never stored
#pragma unroll
          for (int i = 0; i < 4; ++i) o[i][c] += pv[i] * vv;
        }
      }
    }
  }

  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t qi = q0 + ty * 4 + i;
    if (qi >= p.lq) continue;
    const C inv = l[i] == C(0) ? C(0) : C(1) / l[i];
    T* row = out + (b * p.lq + qi) * p.dv + vc0;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int col = tx + 16 * c;
      if (col < dvc) store_from(row, col, l[i] == C(0) ? C(0) : o[i][c] * inv);
    }
  }
}

// paged_attention: block (query t, head h) = one warp; lane l holds dimensions l, l + 32,
// ... of q (pre-scaled) and of the output accumulator; per position, the key's partial
// dots are summed across the warp, then the running maximum, sum and accumulator are
// updated (online softmax, f32).
template <typename Q, typename KV>
__global__ void paged_attention_kernel(PagedAttentionProblem p) {
  constexpr int kPer = kPagedMaxHeadDim / 32;
  const int64_t th = blockIdx.x;  // t * H + h
  const int64_t t = th / p.H;
  const int h = static_cast<int>(th % p.H), kh = h / (p.H / p.hkv), lane = threadIdx.x;
  const Q* q = static_cast<const Q*>(p.q);
  const KV* k = static_cast<const KV*>(p.k);
  const KV* v = static_cast<const KV*>(p.v);
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = lane + 32 * r;
    qv[r] = i < p.d ? load_as<float>(q, th * p.d + i) * p.scale : 0.0f;
    acc[r] = 0.0f;
  }
  const int32_t* blocks = p.tables + static_cast<int64_t>(p.seq[t]) * p.M;
  const int n = p.pos[t] + 1;
  float m = -INFINITY, l = 0.0f;
  for (int pos = p.window > 0 && n > p.window ? n - p.window : 0; pos < n; ++pos) {
    const int64_t base = ((static_cast<int64_t>(blocks[pos / p.B]) * p.B + pos % p.B) * p.hkv + kh) * p.d;
    float dot = 0.0f;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int i = lane + 32 * r;
      if (i < p.d) dot += qv[r] * load_as<float>(k, base + i);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (p.softcap > 0) dot = p.softcap * tanhf(dot / p.softcap);
    const float m_new = fmaxf(m, dot), alpha = __expf(m - m_new), w = __expf(dot - m_new);
    l = l * alpha + w;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int i = lane + 32 * r;
      if (i < p.d) acc[r] = acc[r] * alpha + w * load_as<float>(v, base + i);
    }
    m = m_new;
  }
  Q* out = static_cast<Q*>(p.out);
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = lane + 32 * r;
    if (i < p.d) store_from(out, th * p.d + i, acc[r] / l);
  }
}

template <typename Q>
void launch_paged_typed(const PagedAttentionProblem& p, DType kv_dtype, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(p.T * p.H);
  switch (kv_dtype) {
    case DType::kF16: paged_attention_kernel<Q, __half><<<blocks, 32, 0, stream>>>(p); break;
    case DType::kBF16: paged_attention_kernel<Q, __nv_bfloat16><<<blocks, 32, 0, stream>>>(p); break;
    case DType::kF32: paged_attention_kernel<Q, float><<<blocks, 32, 0, stream>>>(p); break;
    default: throw_bad_dtype("paged_attention", kv_dtype);
  }
}

}  // namespace

void launch_paged_attention(const PagedAttentionProblem& p, DType q_dtype, DType kv_dtype, cudaStream_t stream) {
  if (p.T * p.H == 0) return;
  switch (q_dtype) {
    case DType::kF16: launch_paged_typed<__half>(p, kv_dtype, stream); break;
    case DType::kBF16: launch_paged_typed<__nv_bfloat16>(p, kv_dtype, stream); break;
    case DType::kF32: launch_paged_typed<float>(p, kv_dtype, stream); break;
    default: throw_bad_dtype("paged_attention", q_dtype);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

size_t attention_smem_bytes(DType dtype, int64_t d, int64_t dv) {
  const size_t es = dtype == DType::kF64 ? sizeof(double) : sizeof(float);
  return static_cast<size_t>(layout_for(d, dv).total) * es;
}

void launch_attention(const AttentionProblem& p, DType dtype, cudaStream_t stream) {
  const int64_t nqt = (p.lq + kBQ - 1) / kBQ, nvc = (p.dv + kDVC - 1) / kDVC;
  const int64_t blocks = nqt * nvc * p.batch;
  if (blocks == 0) return;
  const Layout lay = layout_for(p.d, p.dv);
  const size_t smem = attention_smem_bytes(dtype, p.d, p.dv);
  auto fail = [&] { throw_bad_dtype("scaled_dot_product_attention", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    if (smem > 48 * 1024)
      KILN_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    attention_kernel<T><<<static_cast<unsigned>(blocks), kThreadsA, smem, stream>>>(p, lay, nqt, nvc);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
