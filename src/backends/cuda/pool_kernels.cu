#include "device_util.cuh"
#include "pool_launch.h"

namespace kiln::cuda {
namespace {

template <typename C>
__device__ __forceinline__ C neg_inf() {
  return -static_cast<C>(__int_as_float(0x7f800000));
}

// max as the CPU kernels take it: a NaN wins (and stays).
template <typename C>
__device__ __forceinline__ C max_nan(C acc, C e) {
  return (e > acc || e != e) ? e : acc;
}

// The pooling dims in index type I (int32 when every flat index fits: cheaper division).
template <typename I>
struct Dims {
  I n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl;
  bool nchw, relu;
  __device__ explicit Dims(const PoolDims& d)
      : n(static_cast<I>(d.n)), c(static_cast<I>(d.c)), h(static_cast<I>(d.h)), w(static_cast<I>(d.w)),
        oh(static_cast<I>(d.oh)), ow(static_cast<I>(d.ow)), kh(static_cast<I>(d.kh)), kw(static_cast<I>(d.kw)),
        sh(static_cast<I>(d.sh)), sw(static_cast<I>(d.sw)), pt(static_cast<I>(d.pt)), pl(static_cast<I>(d.pl)),
        nchw(d.nchw), relu(d.relu) {}
  // Splits a flat index of an (n, c, H, W) tensor in this layout.
  __device__ void split(I i, I H, I W, I& nn, I& cc, I& hh, I& ww) const {
    if (nchw) {
      ww = i % W;
      i /= W;
      hh = i % H;
      i /= H;
      cc = i % c;
      nn = i / c;
    } else {
      cc = i % c;
      i /= c;
      ww = i % W;
      i /= W;
      hh = i % H;
      nn = i / H;
    }
  }
  // Offset of (nn, cc, hh, ww) in an (n, c, H, W) tensor.
  __device__ I at(I nn, I cc, I hh, I ww, I H, I W) const {
    return nchw ? ((nn * c + cc) * H + hh) * W + ww : ((nn * H + hh) * W + ww) * c + cc;
  }
};

// ---- forward ---------------------------------------------------------------------------------

template <typename I, typename T>
__device__ __forceinline__ void pool_one(I i, const T* __restrict__ x, T* __restrict__ y, const Dims<I>& d,
                                         bool max) {
  using C = compute_t<T>;
  I n, c, oh, ow;
  d.split(i, d.oh, d.ow, n, c, oh, ow);
  const I hs = oh * d.sh - d.pt, ws = ow * d.sw - d.pl;
  const I h0 = hs > 0 ? hs : 0, h1 = hs + d.kh < d.h ? hs + d.kh : d.h;
  const I w0 = ws > 0 ? ws : 0, w1 = ws + d.kw < d.w ? ws + d.kw : d.w;
  C acc = max ? neg_inf<C>() : C(0);
  for (I r = h0; r < h1; ++r)
    for (I s = w0; s < w1; ++s) {
      const C e = load_as<C>(x, d.at(n, c, r, s, d.h, d.w));
      acc = max ? max_nan(acc, e) : acc + e;
    }
  if (!max) acc /= static_cast<C>((h1 - h0) * (w1 - w0));
  store_from(y, i, acc);
}

template <typename T>
__global__ void pool_kernel(const T* __restrict__ x, T* __restrict__ y, PoolDims pd, int64_t total, bool small,
                            bool max) {
  if (small) {
    const Dims<int32_t> d(pd);
    KILN_GRID_STRIDE_LOOP(i, total) pool_one<int32_t>(static_cast<int32_t>(i), x, y, d, max);
  } else {
    const Dims<int64_t> d(pd);
    KILN_GRID_STRIDE_LOOP(i, total) pool_one<int64_t>(i, x, y, d, max);
  }
}

// ---- backward (gather: one thread per input cell, deterministic) ------------------------------

// The output windows [lo, hi] (inclusive) holding input row / column `p`.
template <typename I>
__device__ __forceinline__ void windows_of(I p, I pad, I k, I s, I out, I& lo, I& hi) {
  const I a = p + pad - k + 1;
  lo = a <= 0 ? 0 : (a + s - 1) / s;
  hi = (p + pad) / s;
  if (hi > out - 1) hi = out - 1;
}

template <typename I, typename T>
__device__ __forceinline__ void pool_grad_one(I i, const T* __restrict__ x, const T* __restrict__ dy,
                                              T* __restrict__ dx, const Dims<I>& d, bool max) {
  using C = compute_t<T>;
  I n, c, hh, ww;
  d.split(i, d.h, d.w, n, c, hh, ww);
  I oh0, oh1, ow0, ow1;
  windows_of(hh, d.pt, d.kh, d.sh, d.oh, oh0, oh1);
  windows_of(ww, d.pl, d.kw, d.sw, d.ow, ow0, ow1);
  C acc = 0;
  for (I oh = oh0; oh <= oh1; ++oh) {
    const I hs = oh * d.sh - d.pt;
    const I h0 = hs > 0 ? hs : 0, h1 = hs + d.kh < d.h ? hs + d.kh : d.h;
    for (I ow = ow0; ow <= ow1; ++ow) {
      const I ws = ow * d.sw - d.pl;
      const I w0 = ws > 0 ? ws : 0, w1 = ws + d.kw < d.w ? ws + d.kw : d.w;
      const C g = load_as<C>(dy, d.at(n, c, oh, ow, d.oh, d.ow));
      if (max) {
        // The window's first maximal cell (the first NaN when it holds one).
        C best = load_as<C>(x, d.at(n, c, h0, w0, d.h, d.w));
        I br = h0, bs = w0;
        for (I r = h0; r < h1; ++r)
          for (I s = (r == h0 ? w0 + 1 : w0); s < w1; ++s) {
            const C e = load_as<C>(x, d.at(n, c, r, s, d.h, d.w));
            if (e > best || (e != e && best == best)) {
              best = e;
              br = r;
              bs = s;
            }
          }
        if (br == hh && bs == ww) acc += g;
      } else {
        acc += g / static_cast<C>((h1 - h0) * (w1 - w0));
      }
    }
  }
  if (d.relu && !(load_as<C>(x, i) > C(0))) acc = 0;
  store_from(dx, i, acc);
}

template <typename T>
__global__ void pool_grad_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, PoolDims pd,
                                 int64_t total, bool small, bool max) {
  if (small) {
    const Dims<int32_t> d(pd);
    KILN_GRID_STRIDE_LOOP(i, total) pool_grad_one<int32_t>(static_cast<int32_t>(i), x, dy, dx, d, max);
  } else {
    const Dims<int64_t> d(pd);
    KILN_GRID_STRIDE_LOOP(i, total) pool_grad_one<int64_t>(i, x, dy, dx, d, max);
  }
}

// ---- global pooling --------------------------------------------------------------------------

// NCHW: one warp per contiguous row of hw values.
template <typename T>
__global__ void global_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t hw, bool max) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31, wpb = blockDim.x / 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * wpb + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * wpb) {  // uniform per warp
    const T* p = x + r * hw;
    if (max) {
      C m = neg_inf<C>();
      for (int64_t i = lane; i < hw; i += 32) m = max_nan(m, load_as<C>(p, i));
      for (int off = 16; off > 0; off >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, off));
      if (lane == 0) store_from(y, r, m);
    } else {
      double s = 0;
      for (int64_t i = lane; i < hw; i += 32) s += load_as<double>(p, i);
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) store_from(y, r, s / static_cast<double>(hw));
    }
  }
}

// NHWC: blocks of 32 channels x 8 slices of the hw cells, reduced through shared memory.
constexpr int kGX = 32, kGY = 8;

template <typename T>
__global__ void global_cols_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t c, int64_t hw,
                                   bool max) {
  using C = compute_t<T>;
  __shared__ double part[kGY][kGX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t cblocks = (c + kGX - 1) / kGX;
  for (int64_t t = blockIdx.x; t < n * cblocks; t += gridDim.x) {  // uniform per block
    const int64_t b = t / cblocks, ch = t % cblocks * kGX + tx;
    double acc;
    if (ch < c) {
      const T* p = x + b * hw * c + ch;
      if (max) {
        C m = neg_inf<C>();
        for (int64_t i = ty; i < hw; i += kGY) m = max_nan(m, load_as<C>(p, i * c));
        acc = static_cast<double>(m);
      } else {
        double s = 0;
        for (int64_t i = ty; i < hw; i += kGY) s += load_as<double>(p, i * c);
        acc = s;
      }
    } else {
      acc = 0;
    }
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && ch < c) {
      double r = part[0][tx];
      for (int j = 1; j < kGY; ++j) r = max ? max_nan(r, part[j][tx]) : r + part[j][tx];
      if (max) store_from(y, b * c + ch, static_cast<C>(r));
      else store_from(y, b * c + ch, r / static_cast<double>(hw));
    }
    __syncthreads();
  }
}

// ---- the 2x2 pool's mask (fused_conv2d pool_mask) and its gradient ---------------------

__global__ void pool_mask_kernel(const float* __restrict__ x, uint8_t* __restrict__ mask, int64_t total, int64_t pw,
                                 int64_t c, bool relu) {
  KILN_GRID_STRIDE_LOOP(i, total) {  // i over [n, ph, pw, c]
    const int64_t ch = i % c, col = i / c % pw, row = i / (c * pw);  // row = n * ph + pooled row
    const int64_t w = 2 * pw;
    const float* a = x + ((2 * row) * w + 2 * col) * c + ch;
    const float cell[4] = {a[0], a[c], a[w * c], a[w * c + c]};
    float best = cell[0];
    uint8_t win = 0;
    for (int q = 1; q < 4; ++q)
      if (cell[q] > best || (cell[q] != cell[q] && best == best)) {
        best = cell[q];
        win = static_cast<uint8_t>(q);
      }
    mask[i] = relu && !(best > 0.0f) ? uint8_t{4} : win;
  }
}

__global__ void mask_pool_grad_kernel(const uint8_t* __restrict__ mask, const float* __restrict__ dy,
                                      float* __restrict__ dx, int64_t total, int64_t pw, int64_t c) {
  KILN_GRID_STRIDE_LOOP(i, total) {  // i over dx [n, 2 ph, 2 pw, c]
    const int64_t ch = i % c, w = i / c % (2 * pw), h = i / (c * 2 * pw);  // h = n * 2 ph + row
    const int64_t p = ((h / 2) * pw + w / 2) * c + ch;
    dx[i] = mask[p] == (h % 2) * 2 + w % 2 ? dy[p] : 0.0f;
  }
}

unsigned capped(int64_t blocks) {
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < 65535LL * 8 ? blocks : 65535LL * 8);
}

}  // namespace

void launch_pool2d(const void* x, void* y, DType dtype, const PoolDims& d, bool max, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.oh * d.ow;
  if (total == 0) return;
  const bool small = total <= 0x7fffffff && d.n * d.c * d.h * d.w <= 0x7fffffff;
  auto fail = [&] { throw_bad_dtype(max ? "max_pool2d" : "avg_pool2d", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    pool_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), d, total,
                                                             small, max);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_max_pool2d_backward(const void* x, const void* dy, void* dx, DType dtype, const PoolDims& d,
                                cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.h * d.w;
  if (total == 0) return;
  const bool small = total <= 0x7fffffff && d.n * d.c * d.oh * d.ow <= 0x7fffffff;
  auto fail = [&] { throw_bad_dtype("max_pool2d_backward", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    pool_grad_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), d, total, small, true);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_pool_mask_2x2(const float* x, uint8_t* mask, int64_t n, int64_t ph, int64_t pw, int64_t c, bool relu,
                          cudaStream_t stream) {
  const int64_t total = n * ph * pw * c;
  if (total == 0) return;
  pool_mask_kernel<<<grid_for(total), kThreads, 0, stream>>>(x, mask, total, pw, c, relu);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_mask_pool_backward_2x2(const uint8_t* mask, const float* dy, float* dx, int64_t n, int64_t ph, int64_t pw,
                                   int64_t c, cudaStream_t stream) {
  const int64_t total = n * 4 * ph * pw * c;
  if (total == 0) return;
  mask_pool_grad_kernel<<<grid_for(total), kThreads, 0, stream>>>(mask, dy, dx, total, pw, c);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_avg_pool2d_backward(const void* dy, void* dx, DType dtype, const PoolDims& d, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.h * d.w;
  if (total == 0) return;
  const bool small = total <= 0x7fffffff && d.n * d.c * d.oh * d.ow <= 0x7fffffff;
  auto fail = [&] { throw_bad_dtype("avg_pool2d_backward", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    pool_grad_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(nullptr, static_cast<const T*>(dy),
                                                                  static_cast<T*>(dx), d, total, small, false);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_global_pool2d(const void* x, void* y, DType dtype, bool nchw, int64_t n, int64_t c, int64_t hw, bool max,
                          cudaStream_t stream) {
  const int64_t rows = n * c;
  if (rows == 0) return;
  auto fail = [&] { throw_bad_dtype(max ? "global_max_pool2d" : "global_avg_pool2d", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    if (nchw) {
      global_rows_kernel<T><<<capped((rows + 7) / 8), 256, 0, stream>>>(static_cast<const T*>(x),
                                                                        static_cast<T*>(y), rows, hw, max);
    } else {
      global_cols_kernel<T><<<capped(n * ((c + kGX - 1) / kGX)), dim3(kGX, kGY), 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), n, c, hw, max);
    }
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
