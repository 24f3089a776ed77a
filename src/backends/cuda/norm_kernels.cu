// Normalisation kernels (see norm_launch.h).
//
// layer_norm / rms_norm: a group of threads per row (a power of two up to a warp for
// rows of up to 1024 elements, else the block), the row cached in shared memory in the
// compute type when it fits; two-pass statistics (mean, then squared deviations) as
// on the CPU, accumulated in the compute type.
// batch norm: per-channel sums over [outer, *, inner] by tiles (channels across
// threads when inner == 1, else one channel per block with threads along the
// contiguous runs), split over the batch when there are few channels; partials fold
// in order in f64; then per-channel scale/shift and one elementwise pass.
#include <algorithm>
#include <climits>
#include <cmath>

#include "device_util.cuh"
#include "norm_launch.h"

namespace kiln::cuda {
namespace {

constexpr int kCacheBytes = 40 * 1024;
constexpr int kBlock = 256;

// A parameter (gamma, beta, mean, var): of the input's dtype T, or f32 with 16-bit
// inputs (ops::param_for keeps f32 parameters for f16/bf16 inputs, as the CPU's via_f32).
template <typename C, typename T>
__device__ __forceinline__ C load_param(const void* p, bool f32, int64_t i) {
  return f32 ? static_cast<C>(static_cast<const float*>(p)[i]) : load_as<C>(static_cast<const T*>(p), i);
}

// Sum over the group of `group` threads holding one row (see softmax_kernels.cu).
template <typename C>
__device__ __forceinline__ C group_sum(C v, int group, C* red) {
  const int lane = threadIdx.x & 31;
  const int width = group < 32 ? group : 32;
  for (int off = width >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (group <= 32) return v;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < nw; ++w) v += red[w];
  __syncthreads();
  return v;
}

template <typename T>
__global__ void row_norm_kernel(const T* __restrict__ x, const void* __restrict__ gamma,
                                const void* __restrict__ beta, T* __restrict__ y, int64_t rows, int64_t d, double eps_d,
                                int group, bool cache, bool rms, unsigned f32_mask) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ C red[32];
  const C eps = static_cast<C>(eps_d), dc = static_cast<C>(d);
  const bool g32 = f32_mask & 1u, b32 = f32_mask & 2u;
  const int rpb = blockDim.x / group;
  const int g = threadIdx.x / group, lane = threadIdx.x % group;
  C* c = reinterpret_cast<C*>(dyn) + static_cast<int64_t>(g) * d;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * rpb; base < rows; base += static_cast<int64_t>(gridDim.x) * rpb) {
    const int64_t row = base + g;
    const bool active = row < rows;
    const T* xr = x + row * d;
    T* yr = y + row * d;
    if (rms) {
      C q = 0;
      if (active) {
        for (int64_t i = lane; i < d; i += group) {
          const C v = load_as<C>(xr, i);
          if (cache) c[i] = v;
          q += v * v;
        }
      }
      q = group_sum(q, group, red);
      const C rr = C(1) / sqrt(q / dc + eps);
      if (active)
        for (int64_t i = lane; i < d; i += group)
          store_from(yr, i, (cache ? c[i] : load_as<C>(xr, i)) * rr * load_param<C, T>(gamma, g32, i));
    } else {
      C s = 0;
      if (active) {
        for (int64_t i = lane; i < d; i += group) {
          const C v = load_as<C>(xr, i);
          if (cache) c[i] = v;
          s += v;
        }
      }
      s = group_sum(s, group, red);
      const C mean = s / dc;
      C q = 0;
      if (active) {
        for (int64_t i = lane; i < d; i += group) {
          const C dv = (cache ? c[i] : load_as<C>(xr, i)) - mean;
          q += dv * dv;
        }
      }
      q = group_sum(q, group, red);
      const C rstd = C(1) / sqrt(q / dc + eps);
      if (active)
        for (int64_t i = lane; i < d; i += group)
          store_from(yr, i,
                     ((cache ? c[i] : load_as<C>(xr, i)) - mean) * rstd * load_param<C, T>(gamma, g32, i) +
                         load_param<C, T>(beta, b32, i));
    }
  }
}

template <typename T>
void launch_row_norm(const T* x, const void* gamma, const void* beta, T* y, int64_t rows, int64_t d, double eps,
                     bool rms, unsigned f32_mask, cudaStream_t stream) {
  using C = compute_t<T>;
  int group, threads;
  if (d <= 32) {
    group = 1;
    while (group < d) group *= 2;
    threads = kBlock;
  } else if (d <= 1024) {
    group = 32;
    threads = kBlock;
  } else {
    threads = d <= 4096 ? 256 : d <= 16384 ? 512 : 1024;
    group = threads;
  }
  const int rpb = threads / group;
  const int64_t smem_bytes = static_cast<int64_t>(rpb) * d * static_cast<int64_t>(sizeof(C));
  const bool cache = smem_bytes <= kCacheBytes;
  const int64_t blocks = std::min<int64_t>((rows + rpb - 1) / rpb, int64_t{1} << 20);
  row_norm_kernel<T><<<static_cast<unsigned>(blocks), threads, cache ? smem_bytes : 0, stream>>>(
      x, gamma, beta, y, rows, d, eps, group, cache, rms, f32_mask);
}

// ---- batch norm --------------------------------------------------------------------

// Per-channel tiles of bx channels; threads ty stride over k in [k0, k1) of the
// K = outer * inner positions. Pass 2 (meanc given) sums squared deviations.
template <typename T>
__global__ void __launch_bounds__(kBlock) bn_stats_kernel(const T* __restrict__ x, int64_t c, int64_t inner,
                                                          int64_t K, int64_t Kc, const double* __restrict__ meanc,
                                                          double* __restrict__ partial) {
  using C = compute_t<T>;
  __shared__ double sm[kBlock];
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * bx + tx, lane = tid & 31, warp = tid >> 5;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * Kc, k1 = std::min(K, k0 + Kc);
  const int64_t ntiles = (c + bx - 1) / bx;
  const bool small = K <= INT_MAX && inner <= INT_MAX;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int64_t ch = tile * bx + tx;
    const bool valid = ch < c;
    const C m = (valid && meanc) ? static_cast<C>(meanc[ch]) : C(0);
    double a = 0.0;
    if (valid) {
      for (int64_t k = k0 + ty; k < k1; k += by) {
        int64_t addr;
        if (inner == 1) {
          addr = k * c + ch;
        } else if (small) {
          const uint32_t o = static_cast<uint32_t>(k) / static_cast<uint32_t>(inner);
          const uint32_t i = static_cast<uint32_t>(k) - o * static_cast<uint32_t>(inner);
          addr = (static_cast<int64_t>(o) * c + ch) * inner + i;
        } else {
          const int64_t o = k / inner, i = k - o * inner;
          addr = (o * c + ch) * inner + i;
        }
        const C v = load_as<C>(x, addr);
        if (meanc) {
          const C dv = v - m;
          a += static_cast<double>(dv * dv);
        } else {
          a += static_cast<double>(v);
        }
      }
    }
    // Fold the by partials of each channel.
    int rows;
    if (bx < 32) {
      for (int off = 16; off >= bx; off >>= 1) a += __shfl_down_sync(0xffffffffu, a, off);
      rows = kBlock / 32;
      if (lane < bx) sm[warp * bx + lane] = a;
    } else {
      rows = by;
      sm[ty * bx + tx] = a;
    }
    __syncthreads();
    if (ty == 0) {
      a = sm[tx];
      for (int r = 1; r < rows; ++r) a += sm[r * bx + tx];
      if (valid) partial[blockIdx.y * c + ch] = a;
    }
    __syncthreads();
  }
}

// mode 0: sums and rounded means from pass-1 partials; mode 1: statistics outputs and
// scale/shift from pass-2 partials; mode 2: scale/shift from given statistics.
template <typename T>
__global__ void bn_channel_kernel(int mode, int64_t c, int S, double count, const double* __restrict__ partial,
                                  double* sum, double* meanc, double* scale, double* shift, const void* __restrict__ mean,
                                  const void* __restrict__ var, const void* __restrict__ gamma,
                                  const void* __restrict__ beta, unsigned f32_mask, T* mean_out, T* var_out,
                                  double eps) {
  using C = compute_t<T>;
  KILN_GRID_STRIDE_LOOP(ch, c) {
    double acc = 0.0;
    if (mode != 2)
      for (int s = 0; s < S; ++s) acc += partial[s * c + ch];
    if (mode == 0) {
      sum[ch] = acc;
      meanc[ch] = static_cast<double>(static_cast<C>(acc / count));
      continue;
    }
    double mu, v;
    if (mode == 1) {
      mu = sum[ch] / count;
      v = acc / count;
      store_from(mean_out, ch, mu);
      store_from(var_out, ch, v);
    } else {
      mu = load_param<double, T>(mean, f32_mask & 1u, ch);
      v = load_param<double, T>(var, f32_mask & 2u, ch);
    }
    const double s = load_param<double, T>(gamma, f32_mask & 4u, ch) / sqrt(v + eps);
    scale[ch] = static_cast<double>(static_cast<C>(s));
    shift[ch] = static_cast<double>(static_cast<C>(load_param<double, T>(beta, f32_mask & 8u, ch) - mu * s));
  }
}

template <typename T>
__global__ void bn_apply_kernel(const T* __restrict__ x, T* __restrict__ y, const double* __restrict__ scale,
                                const double* __restrict__ shift, int64_t c, int64_t inner, int64_t n) {
  using C = compute_t<T>;
  if (n <= INT_MAX) {
    const uint32_t n32 = static_cast<uint32_t>(n), c32 = static_cast<uint32_t>(c), in32 = static_cast<uint32_t>(inner);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += blockDim.x * gridDim.x) {
      const uint32_t ch = (in32 == 1 ? i : i / in32) % c32;
      store_from(y, i, load_as<C>(x, i) * static_cast<C>(scale[ch]) + static_cast<C>(shift[ch]));
    }
  } else {
    KILN_GRID_STRIDE_LOOP(i, n) {
      const int64_t ch = (i / inner) % c;
      store_from(y, i, load_as<C>(x, i) * static_cast<C>(scale[ch]) + static_cast<C>(shift[ch]));
    }
  }
}

struct BnPlan {
  int bx = 1, by = kBlock, S = 1;
  int64_t K = 0, Kc = 0, tiles = 0;
};

BnPlan bn_plan(int64_t outer, int64_t c, int64_t inner, int num_sms) {
  BnPlan p;
  p.K = outer * inner;
  if (inner == 1) {
    p.bx = 1;
    while (p.bx < c && p.bx < 32) p.bx *= 2;
  }
  p.by = kBlock / p.bx;
  p.tiles = (c + p.bx - 1) / p.bx;
  if (p.K == 0) {
    p.S = 1;
    p.Kc = 0;
    return p;
  }
  const int64_t target = static_cast<int64_t>(std::max(num_sms, 1)) * 8;
  int64_t S = 1;
  if (p.tiles < target) {
    const int64_t want = (target + p.tiles - 1) / p.tiles;
    const int64_t most = std::max<int64_t>(1, p.K / (static_cast<int64_t>(p.by) * 16));
    S = std::min<int64_t>({want, most, 65535});
  }
  p.Kc = (p.K + S - 1) / S;
  p.S = static_cast<int>((p.K + p.Kc - 1) / p.Kc);
  return p;
}

}  // namespace

void launch_layer_norm(const void* x, const void* gamma, const void* beta, void* y, DType dtype, int64_t rows,
                       int64_t d, double eps, unsigned f32_params, cudaStream_t stream) {
  if (rows * d == 0) return;
  auto fail = [&] { throw_bad_dtype("layer_norm", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    launch_row_norm<T>(static_cast<const T*>(x), gamma, beta, static_cast<T*>(y), rows, d, eps, false, f32_params,
                       stream);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_rms_norm(const void* x, const void* gamma, void* y, DType dtype, int64_t rows, int64_t d, double eps,
                     unsigned f32_params, cudaStream_t stream) {
  if (rows * d == 0) return;
  auto fail = [&] { throw_bad_dtype("rms_norm", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    launch_row_norm<T>(static_cast<const T*>(x), gamma, nullptr, static_cast<T*>(y), rows, d, eps, true, f32_params,
                       stream);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

int64_t batch_norm_scratch_bytes(bool training, int64_t outer, int64_t c, int64_t inner, int num_sms) {
  if (!training) return 2 * c * 8;
  const BnPlan p = bn_plan(outer, c, inner, num_sms);
  return (static_cast<int64_t>(p.S) * c + 4 * c) * 8;
}

void launch_batch_norm_inference(const void* x, const void* mean, const void* var, const void* gamma,
                                 const void* beta, unsigned f32_params, void* y, DType dtype, int64_t outer, int64_t c,
                                 int64_t inner, double eps, void* scratch, cudaStream_t stream) {
  if (c == 0) return;
  double* scale = static_cast<double*>(scratch);
  double* shift = scale + c;
  const int64_t n = outer * c * inner;
  auto fail = [&] { throw_bad_dtype("batch_norm_inference", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    bn_channel_kernel<T><<<grid_for(c), kThreads, 0, stream>>>(2, c, 0, 0.0, nullptr, nullptr, nullptr, scale, shift,
                                                                mean, var, gamma, beta, f32_params, nullptr, nullptr,
                                                                eps);
    if (n > 0)
      bn_apply_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), scale,
                                                               shift, c, inner, n);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_batch_norm_training(const void* x, const void* gamma, const void* beta, unsigned f32_params, void* y,
                                void* mean_out, void* var_out, DType dtype, int64_t outer, int64_t c, int64_t inner,
                                double eps, void* scratch, int num_sms, cudaStream_t stream) {
  if (c == 0) return;
  const BnPlan p = bn_plan(outer, c, inner, num_sms);
  double* partial = static_cast<double*>(scratch);
  double* sum = partial + static_cast<int64_t>(p.S) * c;
  double* meanc = sum + c;
  double* scale = meanc + c;
  double* shift = scale + c;
  const double count = static_cast<double>(p.K);
  const int64_t n = outer * c * inner;
  const unsigned gx = static_cast<unsigned>(std::min<int64_t>(p.tiles, int64_t{1} << 30));
  const dim3 grid(gx, static_cast<unsigned>(p.S)), block(p.bx, p.by);
  // bn_channel_kernel's mask: bit 2 gamma, bit 3 beta.
  const unsigned mask = (f32_params & 3u) << 2;
  auto fail = [&] { throw_bad_dtype("batch_norm_training", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    const T* xt = static_cast<const T*>(x);
    bn_stats_kernel<T><<<grid, block, 0, stream>>>(xt, c, inner, p.K, p.Kc, nullptr, partial);
    bn_channel_kernel<T><<<grid_for(c), kThreads, 0, stream>>>(0, c, p.S, count, partial, sum, meanc, scale, shift,
                                                                nullptr, nullptr, gamma, beta, mask, nullptr, nullptr,
                                                                eps);
    bn_stats_kernel<T><<<grid, block, 0, stream>>>(xt, c, inner, p.K, p.Kc, meanc, partial);
    bn_channel_kernel<T><<<grid_for(c), kThreads, 0, stream>>>(1, c, p.S, count, partial, sum, meanc, scale, shift,
                                                                nullptr, nullptr, gamma, beta, mask,
                                                                static_cast<T*>(mean_out), static_cast<T*>(var_out),
                                                                eps);
    if (n > 0)
      bn_apply_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(xt, static_cast<T*>(y), scale, shift, c, inner, n);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
