// Indexing kernels (see indexing_launch.h).
//
// gather / gather_nd / one_hot move bytes (words of 1-16 bytes, chosen by the
// launchers from sizes and alignment); scatter_add uses atomics (byte types through a
// CAS on the enclosing 32-bit word); top_k runs one block per row: a radix select
// (8 bits per pass over order-preserving integer keys) finds the k-th largest key,
// a block scan collects the selected elements in index order, and for sorted output a
// bitonic sort in shared memory orders them (key descending, index ascending).
#include <algorithm>
#include <climits>
#include <cstring>

#include "device_util.cuh"
#include "indexing_launch.h"

namespace kiln::cuda {
namespace {

template <typename F>
void dispatch_word(int64_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(static_cast<unsigned long long>(0)); break;
    default: f(uint4{}); break;  // 16
  }
}

bool aligned(const void* p, int64_t u) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(u) == 0; }

// Widest word (<= 16 bytes) dividing `bytes` with every pointer aligned to it.
int64_t word_for(int64_t bytes, std::initializer_list<const void*> ptrs) {
  for (int64_t u : {int64_t{16}, int64_t{8}, int64_t{4}, int64_t{2}}) {
    if (bytes % u != 0) continue;
    bool ok = true;
    for (const void* p : ptrs) ok = ok && aligned(p, u);
    if (ok) return u;
  }
  return 1;
}

__device__ __forceinline__ int64_t load_index(const void* ix, bool idx64, int64_t k) {
  return idx64 ? static_cast<int64_t>(static_cast<const long long*>(ix)[k])
               : static_cast<int64_t>(static_cast<const int*>(ix)[k]);
}

// ---- gather ------------------------------------------------------------------------

template <typename I, typename U>
__device__ __forceinline__ void gather_body(const U* __restrict__ P, const void* __restrict__ ix, bool idx64,
                                            U* __restrict__ out, int64_t outer, int64_t n, int64_t ni, int64_t su,
                                            int64_t total) {
  const I tot = static_cast<I>(total), s = static_cast<I>(su), m = static_cast<I>(ni), ou = static_cast<I>(outer);
  for (I f = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; f < tot;
       f += static_cast<I>(blockDim.x) * gridDim.x) {
    const I q = f / s, e = f - q * s;
    const I row = q / m, i = q - row * m;
    const int64_t idx = load_index(ix, idx64, static_cast<int64_t>(row / ou) * ni + i);
    out[f] = (idx >= 0 && idx < n) ? P[(static_cast<int64_t>(row) * n + idx) * su + e] : U{};
  }
}

template <typename U>
__global__ void gather_kernel(const U* __restrict__ P, const void* __restrict__ ix, bool idx64, U* __restrict__ out,
                              int64_t outer, int64_t n, int64_t ni, int64_t su, int64_t total) {
  if (total <= INT_MAX) gather_body<uint32_t>(P, ix, idx64, out, outer, n, ni, su, total);
  else gather_body<int64_t>(P, ix, idx64, out, outer, n, ni, su, total);
}

// ---- gather_nd ---------------------------------------------------------------------

struct NdMap {
  int k;
  int64_t dims[8];
  int64_t strides[8];  // in slices
};

template <typename U>
__global__ void gather_nd_kernel(const U* __restrict__ P, const void* __restrict__ ix, bool idx64,
                                 U* __restrict__ out, NdMap m, int64_t su, int64_t total) {
  KILN_GRID_STRIDE_LOOP(f, total) {
    const int64_t t = f / su, e = f - t * su;
    int64_t off = 0;
    bool ok = true;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < m.k) {
        const int64_t v = load_index(ix, idx64, t * m.k + j);
        ok = ok && v >= 0 && v < m.dims[j];
        off += v * m.strides[j];
      }
    }
    out[f] = ok ? P[off * su + e] : U{};
  }
}

// ---- scatter_add -------------------------------------------------------------------

template <typename O>
__device__ __forceinline__ void atomic_add(O* p, O v) {
  if constexpr (std::is_same_v<O, float> || std::is_same_v<O, double>) {
    atomicAdd(p, v);
  } else if constexpr (sizeof(O) == 4) {
    atomicAdd(reinterpret_cast<int*>(p), static_cast<int>(v));
  } else if constexpr (sizeof(O) == 8) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));  // wraps as int64
  } else {
    // One byte: CAS on the aligned word holding it (kiln buffers are 64-byte aligned
    // and padded, so the word lies inside the allocation); adds modulo 256.
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    unsigned int* word = reinterpret_cast<unsigned int*>(a & ~uintptr_t{3});
    const unsigned int shift = static_cast<unsigned int>(a & 3) * 8;
    const unsigned int add = static_cast<unsigned int>(static_cast<uint8_t>(v));
    unsigned int old = *word, assumed;
    do {
      assumed = old;
      const unsigned int byte = ((assumed >> shift) + add) & 0xffu;
      old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
    } while (old != assumed);
  }
}

template <typename O, typename V>
__global__ void scatter_add_kernel(O* out, const V* __restrict__ upd, const void* __restrict__ ix, bool idx64,
                                   int64_t n, int64_t ni, int64_t inner, int64_t total) {
  KILN_GRID_STRIDE_LOOP(f, total) {
    const int64_t q = f / inner, c = f - q * inner;
    const int64_t r = q / ni, i = q - r * ni;
    const int64_t idx = load_index(ix, idx64, i);
    if (idx < 0 || idx >= n) continue;  // out of range: skipped (TF GPU semantics)
    atomic_add(out + (r * n + idx) * inner + c, load_as<O>(upd, f));
  }
}

// ---- index_copy --------------------------------------------------------------------

// Element f of the rows (words of W bytes) to its index's row.
template <typename W>
__global__ void index_copy_kernel(W* out, const W* __restrict__ rows, const void* __restrict__ ix, bool idx64, int64_t n,
                                  int64_t words, int64_t total) {
  KILN_GRID_STRIDE_LOOP(f, total) {
    const int64_t i = f / words, c = f - i * words;
    const int64_t idx = load_index(ix, idx64, i);
    if (idx < 0 || idx >= n) continue;  // out of range: skipped
    out[idx * words + c] = rows[f];
  }
}

// ---- one_hot -----------------------------------------------------------------------

template <typename U>
__global__ void one_hot_kernel(const void* __restrict__ ix, bool idx64, U* __restrict__ out, int64_t depth,
                               int64_t inner, U on, U off, int64_t total) {
  KILN_GRID_STRIDE_LOOP(f, total) {
    const int64_t q = f / inner, i = f - q * inner;
    const int64_t r = q / depth, d = q - r * depth;
    out[f] = load_index(ix, idx64, r * inner + i) == d ? on : off;
  }
}

// ---- top_k -------------------------------------------------------------------------

constexpr int kMaxSortedK = 4096;

template <typename T>
using KeyT = std::conditional_t<sizeof(T) == 8, unsigned long long, unsigned int>;

// Order-preserving unsigned key: larger value -> larger key; every NaN -> the largest
// key; -0 and +0 -> one key (they tie, as on the CPU).
template <typename T>
__device__ __forceinline__ KeyT<T> key_of(T x) {
  if constexpr (std::is_same_v<T, double>) {
    if (x != x) return ~0ull;
    const unsigned long long u = static_cast<unsigned long long>(__double_as_longlong(x == 0.0 ? 0.0 : x));
    return (u >> 63) ? ~u : (u | (1ull << 63));
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    const float f = load_as<float>(&x, 0);
    if (f != f) return ~0u;
    const unsigned int u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (u >> 31) ? ~u : (u | 0x80000000u);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<unsigned int>(x);
  } else if constexpr (sizeof(T) == 8) {
    return static_cast<unsigned long long>(x) ^ (1ull << 63);
  } else {
    return static_cast<unsigned int>(static_cast<int>(x)) ^ 0x80000000u;
  }
}

// Exclusive prefix count of `flag` over the block (in thread order); `total` gets the
// block's count. All threads must call it.
__device__ __forceinline__ int block_scan_flag(bool flag, int* warp_sums, int& total) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const unsigned int m = __ballot_sync(0xffffffffu, flag);
  const int pre = __popc(m & ((1u << lane) - 1u));
  if (lane == 0) warp_sums[warp] = __popc(m);
  __syncthreads();
  int off = 0, tot = 0;
  for (int w = 0; w < nw; ++w) {
    const int c = warp_sums[w];
    off += w < warp ? c : 0;
    tot += c;
  }
  __syncthreads();
  total = tot;
  return off + pre;
}

template <typename T>
__global__ void top_k_kernel(const T* __restrict__ x, T* __restrict__ vals, long long* __restrict__ idx_out,
                             int64_t rows, int n, int k, bool sorted, int sort_size) {
  using Key = KeyT<T>;
  constexpr int kBits = sizeof(Key) * 8;
  extern __shared__ __align__(16) unsigned char dyn[];
  Key* skey = reinterpret_cast<Key*>(dyn);
  unsigned int* sidx = reinterpret_cast<unsigned int*>(dyn + sizeof(Key) * sort_size);
  __shared__ int hist[256];
  __shared__ int warp_sums[32];
  __shared__ Key s_prefix;
  __shared__ int s_remaining;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    const bool take_all = k == n;
    // 1. Radix select: kth = the k-th largest key, need_eq = how many elements equal
    //    to it belong to the top k.
    Key kth = 0;
    int need_eq = 0;
    if (!take_all) {
      Key prefix = 0, mask = 0;
      int remaining = k;
      for (int shift = kBits - 8; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += nt) hist[b] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += nt) {
          const Key key = key_of(xr[i]);
          if ((key & mask) == prefix) atomicAdd(&hist[static_cast<int>((key >> shift) & 0xff)], 1);
        }
        __syncthreads();
        if (tid == 0) {
          for (int b = 255; b >= 0; --b) {
            const int c = hist[b];
            if (c >= remaining) {
              prefix |= static_cast<Key>(b) << shift;
              break;
            }
            remaining -= c;
          }
          s_prefix = prefix;
          s_remaining = remaining;
        }
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= static_cast<Key>(0xff) << shift;
        __syncthreads();  // hist and s_* are rewritten next pass
      }
      kth = prefix;
      need_eq = remaining;
    }
    // 2. Collect the selected elements in index order.
    int base = 0, eq_base = 0;
    for (int chunk = 0; chunk < n; chunk += nt) {
      const int i = chunk + tid;
      Key key = 0;
      bool gt = false, eq = false;
      if (i < n) {
        key = key_of(xr[i]);
        gt = take_all || key > kth;
        eq = !take_all && key == kth;
      }
      int eq_total, sel_total;
      const int eq_rank = block_scan_flag(eq, warp_sums, eq_total);
      const bool sel = gt || (eq && eq_base + eq_rank < need_eq);
      const int pos = base + block_scan_flag(sel, warp_sums, sel_total);
      if (sel) {
        if (sorted) {
          skey[pos] = key;
          sidx[pos] = static_cast<unsigned int>(i);
        } else {
          vals[row * k + pos] = xr[i];
          idx_out[row * k + pos] = i;
        }
      }
      base += sel_total;
      eq_base += eq_total;
    }
    if (sorted) {
      // 3. Bitonic sort of [0, sort_size): padding sorts last (key 0, largest index).
      for (int p = k + tid; p < sort_size; p += nt) {
        skey[p] = 0;
        sidx[p] = 0xffffffffu;
      }
      __syncthreads();
      for (int size = 2; size <= sort_size; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
          for (int t = tid; t < sort_size / 2; t += nt) {
            const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
            const Key klo = skey[lo], khi = skey[hi];
            const unsigned int ilo = sidx[lo], ihi = sidx[hi];
            const bool hi_first = khi > klo || (khi == klo && ihi < ilo);
            const bool lo_first = klo > khi || (klo == khi && ilo < ihi);
            if ((lo & size) == 0 ? hi_first : lo_first) {
              skey[lo] = khi;
              skey[hi] = klo;
              sidx[lo] = ihi;
              sidx[hi] = ilo;
            }
          }
          __syncthreads();
        }
      }
      for (int p = tid; p < k; p += nt) {
        const unsigned int i = sidx[p];
        vals[row * k + p] = xr[i];
        idx_out[row * k + p] = static_cast<long long>(i);
      }
    }
    __syncthreads();  // shared memory is reused by the next row
  }
}

int pow2_at_least(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

void launch_gather(const GatherArgs& a, cudaStream_t stream) {
  const int64_t total_bytes = a.rows * a.ni * a.slice_bytes;
  if (total_bytes == 0) return;
  const int64_t w = word_for(a.slice_bytes, {a.params, a.out});
  const int64_t su = a.slice_bytes / w, total = total_bytes / w;
  dispatch_word(w, [&](auto u) {
    using U = decltype(u);
    gather_kernel<U><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const U*>(a.params), a.indices, a.idx64,
                                                               static_cast<U*>(a.out), a.outer, a.n, a.ni, su, total);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_gather_nd(const GatherNdArgs& a, cudaStream_t stream) {
  const int64_t total_bytes = a.tuples * a.slice_bytes;
  if (total_bytes == 0) return;
  const int64_t w = word_for(a.slice_bytes, {a.params, a.out});
  const int64_t su = a.slice_bytes / w, total = total_bytes / w;
  NdMap m{};
  m.k = a.k;
  for (int j = 0; j < a.k; ++j) {
    m.dims[j] = a.dims[j];
    m.strides[j] = a.strides[j];
  }
  dispatch_word(w, [&](auto u) {
    using U = decltype(u);
    gather_nd_kernel<U><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const U*>(a.params), a.indices, a.idx64,
                                                                  static_cast<U*>(a.out), m, su, total);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_scatter_add(void* out, DType out_dtype, const void* updates, DType updates_dtype, const void* indices,
                        bool idx64, int64_t outer, int64_t n, int64_t ni, int64_t inner, cudaStream_t stream) {
  const int64_t total = outer * ni * inner;
  if (total == 0) return;
  auto go = [&](auto o, auto v) {
    using O = decltype(o);
    using V = decltype(v);
    scatter_add_kernel<O, V><<<grid_for(total), kThreads, 0, stream>>>(static_cast<O*>(out),
                                                                       static_cast<const V*>(updates), indices, idx64,
                                                                       n, ni, inner, total);
  };
  if (updates_dtype == DType::kF16 || updates_dtype == DType::kBF16) {
    if (out_dtype != DType::kF32) throw_bad_dtype("scatter_add (accumulator)", out_dtype);
    if (updates_dtype == DType::kF16) go(float{}, __half{});
    else go(float{}, __nv_bfloat16{});
  } else {
    if (out_dtype != updates_dtype) throw_bad_dtype("scatter_add (accumulator)", out_dtype);
    switch (updates_dtype) {
      case DType::kU8: go(uint8_t{}, uint8_t{}); break;
      case DType::kI8: go(int8_t{}, int8_t{}); break;
      case DType::kI32: go(int32_t{}, int32_t{}); break;
      case DType::kI64: go(int64_t{}, int64_t{}); break;
      case DType::kF32: go(float{}, float{}); break;
      case DType::kF64: go(double{}, double{}); break;
      default: throw_bad_dtype("scatter_add", updates_dtype);
    }
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_one_hot(const void* indices, bool idx64, void* out, int64_t itemsize, int64_t outer, int64_t depth,
                    int64_t inner, const void* on, const void* off, cudaStream_t stream) {
  const int64_t total = outer * depth * inner;
  if (total == 0) return;
  dispatch_word(itemsize, [&](auto u) {
    using U = decltype(u);
    if constexpr (sizeof(U) <= 8) {
      U on_v, off_v;
      std::memcpy(&on_v, on, sizeof(U));
      std::memcpy(&off_v, off, sizeof(U));
      one_hot_kernel<U><<<grid_for(total), kThreads, 0, stream>>>(indices, idx64, static_cast<U*>(out), depth, inner,
                                                                  on_v, off_v, total);
    }
  });
  KILN_CUDA_CHECK_LAUNCH();
}

int64_t top_k_max_sorted() { return kMaxSortedK; }

void launch_top_k(const void* x, DType dtype, void* values, int64_t* indices, int64_t rows, int64_t n, int64_t k,
                  bool sorted, cudaStream_t stream) {
  if (rows == 0 || k == 0) return;
  if (n > INT_MAX - 1024 || (sorted && k > kMaxSortedK)) throw_bad_dtype("top_k (size beyond the CUDA kernel's limits)", dtype);
  const int threads = std::clamp(pow2_at_least((n + 7) / 8), 32, 1024);
  const int sort_size = sorted ? pow2_at_least(k) : 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
  auto fail = [&] { throw_bad_dtype("top_k", dtype); };
  KILN_CUDA_DISPATCH_ALL(dtype, fail, {
    const size_t smem = static_cast<size_t>(sort_size) * (sizeof(KeyT<T>) + sizeof(unsigned int));
    if (smem > 32 * 1024)
      KILN_CUDA_CHECK(cudaFuncSetAttribute(top_k_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    top_k_kernel<T><<<blocks, threads, smem, stream>>>(static_cast<const T*>(x), static_cast<T*>(values),
                                                       reinterpret_cast<long long*>(indices), rows, static_cast<int>(n),
                                                       static_cast<int>(k), sorted, sort_size);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_index_copy(void* out, const void* rows, const void* indices, bool idx64, int64_t n, int64_t ni,
                       int64_t row_bytes, cudaStream_t stream) {
  if (ni == 0 || row_bytes == 0) return;
  auto go = [&](auto word) {
    using W = decltype(word);
    const int64_t words = row_bytes / static_cast<int64_t>(sizeof(W)), total = ni * words;
    index_copy_kernel<W><<<grid_for(total), kThreads, 0, stream>>>(static_cast<W*>(out), static_cast<const W*>(rows), indices,
                                                                   idx64, n, words, total);
  };
  if (row_bytes % 8 == 0) go(uint64_t{});
  else if (row_bytes % 4 == 0) go(uint32_t{});
  else if (row_bytes % 2 == 0) go(uint16_t{});
  else go(uint8_t{});
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
