// softmax / log_softmax kernels (see softmax_launch.h).
//
// Contiguous rows (inner == 1): a group of threads per row (a power of two up to a
// warp for rows of up to 1024 elements, else the whole block), reductions by warp
// shuffles (and shared memory across warps). The row is cached in shared memory in
// the compute type when it fits, so x is read from global memory once. Strided rows
// (inner > 1): one thread per (outer, inner) column, coalesced across columns.
// Max-shifted as on the CPU: NaN anywhere in a row makes the row NaN.
#include <algorithm>
#include <cmath>
#include <limits>

#include "device_util.cuh"
#include "softmax_launch.h"

namespace kiln::cuda {
namespace {

constexpr int kCacheBytes = 40 * 1024;

template <typename C>
__device__ __forceinline__ C max_c(C a, C b) {
  return fmax(a, b);  // ignores NaN, like std::max(m, x) on the CPU; the sum then propagates it
}

// Reduces v over the group of `group` threads holding one row (group <= 32: aligned
// lanes of one warp; else the whole block, with `red` 32 entries of shared memory).
// Every thread of the block must call it; all threads of the group get the result.
template <bool kMax, typename C>
__device__ __forceinline__ C group_reduce(C v, int group, C* red) {
  const int lane = threadIdx.x & 31;
  const int width = group < 32 ? group : 32;
  for (int off = width >> 1; off > 0; off >>= 1) {
    const C o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? max_c(v, o) : v + o;
  }
  if (group <= 32) return v;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < nw; ++w) v = kMax ? max_c(v, red[w]) : v + red[w];
  __syncthreads();
  return v;
}

template <typename T>
__global__ void softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, int group,
                                    bool log_out, bool cache) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ C red[32];
  const int rpb = blockDim.x / group;
  const int g = threadIdx.x / group, lane = threadIdx.x % group;
  C* c = reinterpret_cast<C*>(dyn) + static_cast<int64_t>(g) * n;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rpb; base < rows; base += static_cast<int64_t>(gridDim.x) * rpb) {
    const int64_t row = base + g;
    const bool active = row < rows;
    const T* xr = x + row * n;
    T* yr = y + row * n;
    C m = -std::numeric_limits<C>::infinity();
    if (active) {
      for (int64_t i = lane; i < n; i += group) {
        const C v = load_as<C>(xr, i);
        if (cache) c[i] = v;
        m = max_c(m, v);
      }
    }
    m = group_reduce<true>(m, group, red);
    C s = 0;
    if (active) {
      for (int64_t i = lane; i < n; i += group) {
        const C e = exp((cache ? c[i] : load_as<C>(xr, i)) - m);
        if (cache && !log_out) c[i] = e;
        s += e;
      }
    }
    s = group_reduce<false>(s, group, red);
    if (active) {
      if (log_out) {
        const C shift = m + log(s);
        for (int64_t i = lane; i < n; i += group) store_from(yr, i, (cache ? c[i] : load_as<C>(xr, i)) - shift);
      } else {
        const C inv = C(1) / s;
        for (int64_t i = lane; i < n; i += group)
          store_from(yr, i, (cache ? c[i] : exp(load_as<C>(xr, i) - m)) * inv);
      }
    }
  }
}

template <typename T>
__global__ void softmax_cols_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n,
                                    int64_t inner, bool log_out) {
  using C = compute_t<T>;
  KILN_GRID_STRIDE_LOOP(col, outer * inner) {
    const int64_t o = col / inner, j = col - o * inner;
    const T* xc = x + o * n * inner + j;
    T* yc = y + o * n * inner + j;
    C m = -std::numeric_limits<C>::infinity();
    for (int64_t k = 0; k < n; ++k) m = max_c(m, load_as<C>(xc, k * inner));
    C s = 0;
    for (int64_t k = 0; k < n; ++k) s += exp(load_as<C>(xc, k * inner) - m);
    if (log_out) {
      const C shift = m + log(s);
      for (int64_t k = 0; k < n; ++k) store_from(yc, k * inner, load_as<C>(xc, k * inner) - shift);
    } else {
      const C inv = C(1) / s;
      for (int64_t k = 0; k < n; ++k) store_from(yc, k * inner, exp(load_as<C>(xc, k * inner) - m) * inv);
    }
  }
}

}  // namespace

void launch_softmax(const void* x, void* y, DType dtype, int64_t outer, int64_t n, int64_t inner, bool log,
                    cudaStream_t stream) {
  if (outer * n * inner == 0) return;
  auto fail = [&] { throw_bad_dtype(log ? "log_softmax" : "softmax", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    using C = compute_t<T>;
    if (inner == 1) {
      int group, threads;
      if (n <= 32) {
        group = 1;
        while (group < n) group *= 2;
        threads = 256;
      } else if (n <= 1024) {
        group = 32;
        threads = 256;
      } else {
        threads = n <= 4096 ? 256 : n <= 16384 ? 512 : 1024;
        group = threads;
      }
      const int rpb = threads / group;
      const int64_t smem_bytes = static_cast<int64_t>(rpb) * n * static_cast<int64_t>(sizeof(C));
      const bool cache = smem_bytes <= kCacheBytes;
      const int64_t blocks = std::min<int64_t>((outer + rpb - 1) / rpb, int64_t{1} << 20);
      softmax_rows_kernel<T><<<static_cast<unsigned>(blocks), threads, cache ? smem_bytes : 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), outer, n, group, log, cache);
    } else {
      softmax_cols_kernel<T><<<grid_for(outer * inner), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                               static_cast<T*>(y), outer, n, inner,
                                                                               log);
    }
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
