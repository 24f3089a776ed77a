// Random ops (random_uniform, random_normal, truncated_normal, bernoulli) and dropout
// on CUDA, on the CPU backend's counter layout (src/backends/cpu/random_kernels.cc):
// Philox4x32-10 block b is keyed by the seed at counter (hi = 0, lo = offset + b), and
// element i of an op uses
//   uniform f32/f16/bf16, bernoulli, dropout: word i % 4 of block i / 4;
//   normal f32/f16/bf16:  block i / 4, Box-Muller on words (0, 1) -> elements 4b, 4b+1
//                         (cos, sin), on (2, 3) -> 4b+2, 4b+3;
//   uniform f64 / integers: words 2(i % 2), 2(i % 2) + 1 of block i / 2 (64 bits);
//   normal f64:           block i / 2, u1 from words (0, 1), u2 from (2, 3) -> 2b (cos),
//                         2b+1 (sin);
//   truncated_normal:     blocks (hi = attempt, lo = offset + i); candidates in order (f32:
//                         cos, sin of words (0, 1), then of (2, 3); f64: cos, sin), the
//                         first with |z| < 2 kept.
// One thread per Philox block. The integer arithmetic and every rounding step are the
// CPU's (its build contracts base + span * u and mean + stddev * z into fmas, as here),
// so uniform, bernoulli and dropout values are bit-identical; normals differ from the
// CPU only by the libm (log, sin, cos) rounding.
#include "device_util.cuh"
#include "random_launch.h"

namespace kiln::cuda {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

// kiln::Philox::block(key, hi, lo).
__device__ __forceinline__ uint4 philox(uint64_t key, uint64_t hi, uint64_t lo) {
  uint32_t c0 = static_cast<uint32_t>(lo), c1 = static_cast<uint32_t>(lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(hi), c3 = static_cast<uint32_t>(hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return make_uint4(c0, c1, c2, c3);
}

// kiln::uint_to_unit_float / uints_to_unit_double (exact).
__device__ __forceinline__ float unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
__device__ __forceinline__ double unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t v = ((static_cast<uint64_t>(hi) << 21) ^ (lo >> 11)) & ((uint64_t{1} << 53) - 1);
  return static_cast<double>(v) * (1.0 / 9007199254740992.0);
}

constexpr double kTwoPi = 6.283185307179586;

// Box-Muller in C: u1 in (0, 1], u2 in [0, 1).
__device__ __forceinline__ void box_muller(float u1, float u2, float& z0, float& z1) {
  const float r = sqrtf(-2.0f * logf(u1)), t = static_cast<float>(kTwoPi) * u2;
  z0 = r * cosf(t);
  z1 = r * sinf(t);
}
__device__ __forceinline__ void box_muller(double u1, double u2, double& z0, double& z1) {
  const double r = sqrt(-2.0 * log(u1)), t = kTwoPi * u2;
  z0 = r * cos(t);
  z1 = r * sin(t);
}

template <typename T, int P>
struct alignas(sizeof(T) * P) Vec {
  T v[P];
};

// Writes the P values of the block at element `first` (vector store when whole and aligned).
template <typename T, int P, typename C>
__device__ __forceinline__ void store_block(T* out, int64_t first, int64_t n, const C (&v)[P], bool aligned) {
  if (aligned && first + P <= n) {
    Vec<T, P> r;
#pragma unroll
    for (int j = 0; j < P; ++j) store_from(r.v, j, v[j]);
    *reinterpret_cast<Vec<T, P>*>(out + first) = r;
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (first + j < n) store_from(out, first + j, v[j]);
  }
}

// Computation type of a floating output: f64 for f64, else f32.
template <typename T>
using calc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
constexpr int kPer = std::is_same_v<T, double> ? 2 : 4;  // elements per block (uniform, normal)

template <typename T>
__global__ void uniform_kernel(T* __restrict__ out, int64_t n, uint64_t key, uint64_t offset, double base_d,
                               double span_d, double lo_d, double hi_d, bool aligned) {
  using C = calc_t<T>;
  constexpr int P = kPer<T>;
  const C base = static_cast<C>(base_d), span = static_cast<C>(span_d);
  const C lo = static_cast<C>(lo_d), hi = static_cast<C>(hi_d);
  const int64_t blocks = (n + P - 1) / P;
  KILN_GRID_STRIDE_LOOP(b, blocks) {
    const uint4 w = philox(key, 0, offset + static_cast<uint64_t>(b));
    C v[P];
    if constexpr (P == 4) {
      v[0] = unit_float(w.x);
      v[1] = unit_float(w.y);
      v[2] = unit_float(w.z);
      v[3] = unit_float(w.w);
    } else {
      v[0] = unit_double(w.x, w.y);
      v[1] = unit_double(w.z, w.w);
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      C x = fma(span, v[j], base);
      x = x < lo ? lo : x;  // std::min(std::max(x, lo), hi)
      v[j] = hi < x ? hi : x;
    }
    store_block<T, P>(out, b * P, n, v, aligned);
  }
}

template <typename T>
__global__ void uniform_int_kernel(T* __restrict__ out, int64_t n, uint64_t key, uint64_t offset, uint64_t lo,
                                   uint64_t range, bool aligned) {
  const int64_t blocks = (n + 1) / 2;
  KILN_GRID_STRIDE_LOOP(b, blocks) {
    const uint4 w = philox(key, 0, offset + static_cast<uint64_t>(b));
    const uint64_t x[2] = {(static_cast<uint64_t>(w.x) << 32) | w.y, (static_cast<uint64_t>(w.z) << 32) | w.w};
    T v[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      // Lemire's multiply-shift, or all 64 bits for the full span.
      const uint64_t r = range == 0 ? x[q] : __umul64hi(x[q], range);
      v[q] = static_cast<T>(static_cast<int64_t>(lo + r));
    }
    store_block<T, 2>(out, b * 2, n, v, aligned);
  }
}

template <typename T>
__global__ void normal_kernel(T* __restrict__ out, int64_t n, uint64_t key, uint64_t offset, double mean_d,
                              double sd_d, bool aligned) {
  using C = calc_t<T>;
  constexpr int P = kPer<T>;
  const C mean = static_cast<C>(mean_d), sd = static_cast<C>(sd_d);
  const int64_t blocks = (n + P - 1) / P;
  KILN_GRID_STRIDE_LOOP(b, blocks) {
    const uint4 w = philox(key, 0, offset + static_cast<uint64_t>(b));
    C z[P];
    if constexpr (P == 4) {
      box_muller(1.0f - unit_float(w.x), unit_float(w.y), z[0], z[1]);
      box_muller(1.0f - unit_float(w.z), unit_float(w.w), z[2], z[3]);
    } else {
      box_muller(1.0 - unit_double(w.x, w.y), unit_double(w.z, w.w), z[0], z[1]);
    }
#pragma unroll
    for (int j = 0; j < P; ++j) z[j] = fma(sd, z[j], mean);
    store_block<T, P>(out, b * P, n, z, aligned);
  }
}

// The first candidate of block w with |z| < 2, if any.
__device__ __forceinline__ bool accept(const uint4& w, float& z) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    float c, s;
    box_muller(1.0f - unit_float(u[2 * q]), unit_float(u[2 * q + 1]), c, s);
    if (fabsf(c) < 2.0f) return z = c, true;
    if (fabsf(s) < 2.0f) return z = s, true;
  }
  return false;
}
__device__ __forceinline__ bool accept(const uint4& w, double& z) {
  double c, s;
  box_muller(1.0 - unit_double(w.x, w.y), unit_double(w.z, w.w), c, s);
  if (fabs(c) < 2.0) return z = c, true;
  if (fabs(s) < 2.0) return z = s, true;
  return false;
}

template <typename T>
__global__ void truncated_kernel(T* __restrict__ out, int64_t n, uint64_t key, uint64_t offset, double mean_d,
                                 double sd_d) {
  using C = calc_t<T>;
  const C mean = static_cast<C>(mean_d), sd = static_cast<C>(sd_d);
  KILN_GRID_STRIDE_LOOP(i, n) {
    const uint64_t lo = offset + static_cast<uint64_t>(i);
    C z = 0;
    for (uint64_t attempt = 0; !accept(philox(key, attempt, lo), z); ++attempt) {
    }
    store_from(out, i, fma(sd, z, mean));
  }
}

__global__ void bernoulli_kernel(uint8_t* __restrict__ out, int64_t n, uint64_t key, uint64_t offset,
                                 uint64_t threshold, bool aligned) {
  const int64_t blocks = (n + 3) / 4;
  KILN_GRID_STRIDE_LOOP(b, blocks) {
    const uint4 w = philox(key, 0, offset + static_cast<uint64_t>(b));
    const uint8_t v[4] = {uint8_t(w.x < threshold), uint8_t(w.y < threshold), uint8_t(w.z < threshold),
                          uint8_t(w.w < threshold)};
    store_block<uint8_t, 4>(out, b * 4, n, v, aligned);
  }
}

template <typename T>
__global__ void dropout_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, uint64_t key,
                               uint32_t threshold, double scale_d, bool aligned) {
  using C = compute_t<T>;
  const C scale = static_cast<C>(scale_d);
  const int64_t blocks = (n + 3) / 4;
  KILN_GRID_STRIDE_LOOP(b, blocks) {
    const uint4 w = philox(key, 0, static_cast<uint64_t>(b));
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    const int64_t first = b * 4;
    C v[4];
    if (aligned && first + 4 <= n) {
      const Vec<T, 4> in = *reinterpret_cast<const Vec<T, 4>*>(x + first);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = load_as<C>(in.v, j);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = first + j < n ? load_as<C>(x, first + j) : C(0);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = (u[j] >> 8) >= threshold ? static_cast<C>(v[j] * scale) : C(0);
    store_block<T, 4>(y, first, n, v, aligned);
  }
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void launch_random_uniform(DType dtype, void* out, int64_t n, uint64_t key, uint64_t offset, double base, double span,
                           double lo_clamp, double hi_clamp, cudaStream_t stream) {
  if (n <= 0) return;
  auto fail = [&] { throw_bad_dtype("random_uniform", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    constexpr int P = kPer<T>;
    uniform_kernel<T><<<grid_for((n + P - 1) / P), kThreads, 0, stream>>>(
        static_cast<T*>(out), n, key, offset, base, span, lo_clamp, hi_clamp, aligned_to(out, sizeof(T) * P));
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_random_uniform_int(DType dtype, void* out, int64_t n, uint64_t key, uint64_t offset, uint64_t lo,
                               uint64_t range, cudaStream_t stream) {
  if (n <= 0) return;
  auto fail = [&] { throw_bad_dtype("random_uniform", dtype); };
  auto launch = [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    uniform_int_kernel<T><<<grid_for((n + 1) / 2), kThreads, 0, stream>>>(typed, n, key, offset, lo, range,
                                                                           aligned_to(out, sizeof(T) * 2));
  };
  switch (dtype) {
    case DType::kU8: launch(static_cast<uint8_t*>(out)); break;
    case DType::kI8: launch(static_cast<int8_t*>(out)); break;
    case DType::kI32: launch(static_cast<int32_t*>(out)); break;
    case DType::kI64: launch(static_cast<int64_t*>(out)); break;
    default: fail();
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_random_normal(DType dtype, void* out, int64_t n, uint64_t key, uint64_t offset, double mean,
                          double stddev, bool truncated, cudaStream_t stream) {
  if (n <= 0) return;
  auto fail = [&] { throw_bad_dtype(truncated ? "truncated_normal" : "random_normal", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    if (truncated) {
      truncated_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(out), n, key, offset, mean, stddev);
    } else {
      constexpr int P = kPer<T>;
      normal_kernel<T><<<grid_for((n + P - 1) / P), kThreads, 0, stream>>>(static_cast<T*>(out), n, key, offset, mean,
                                                                           stddev, aligned_to(out, sizeof(T) * P));
    }
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_bernoulli(void* out, int64_t n, uint64_t key, uint64_t offset, uint64_t threshold, cudaStream_t stream) {
  if (n <= 0) return;
  bernoulli_kernel<<<grid_for((n + 3) / 4), kThreads, 0, stream>>>(static_cast<uint8_t*>(out), n, key, offset,
                                                                   threshold, aligned_to(out, 4));
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_dropout(DType dtype, const void* x, void* y, int64_t n, uint64_t key, uint32_t threshold, double scale,
                    cudaStream_t stream) {
  if (n <= 0) return;
  auto fail = [&] { throw_bad_dtype("dropout", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    const bool aligned = aligned_to(x, sizeof(T) * 4) && aligned_to(y, sizeof(T) * 4);
    dropout_kernel<T><<<grid_for((n + 3) / 4), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y),
                                                                      n, key, threshold, scale, aligned);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
