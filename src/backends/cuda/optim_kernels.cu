// Fused optimizer updates (sgd_update, adam_update, rmsprop_update): one pass over
// param, grad and the slots, 16-byte vectors when every pointer allows. The update
// kind is a runtime code, uniform across the grid. Expressions: the CPU kernels'
// (src/backends/cpu/optim_kernels.cc), in the compute type (float for f16/bf16).
#include <cmath>

#include "device_util.cuh"
#include "optim_launch.h"

namespace kiln::cuda {
namespace {

// The coefficients that depend on (lr, step), in double as on the CPU.
struct Coeffs {
  double lr, decay, alpha;
};
__host__ __device__ inline Coeffs derive(const OptimArgs& a, double lr, double step) {
  Coeffs c;
  c.lr = lr;
  c.decay = 1.0 - lr * a.weight_decay;  // decoupled weight decay as a factor on param
  c.alpha = a.kind == OptimKind::kAdam ? lr * sqrt(1 - pow(a.beta_2, step)) / (1 - pow(a.beta_1, step)) : 0.0;
  return c;
}

__device__ __forceinline__ float c_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double c_sqrt(double x) { return sqrt(x); }

template <typename C>
struct Consts {
  C lr, decay, alpha, mu, eps, c1, c2, rho, crho;
};

// y = the update of one element's inputs x (the op's order; see optim_launch.h).
template <typename C>
__device__ __forceinline__ void update(const OptimArgs& a, const Consts<C>& k, const C (&x)[5], C (&y)[4]) {
  const C p = x[0], g = x[1];
  switch (a.kind) {
    case OptimKind::kSgd:
      y[0] = p * k.decay - k.lr * g;
      break;
    case OptimKind::kSgdMomentum: {
      const C mn = k.mu * x[2] - k.lr * g;
      y[1] = mn;
      y[0] = p * k.decay + mn;
      break;
    }
    case OptimKind::kSgdNesterov: {
      const C step = -k.lr * g;
      const C mn = k.mu * x[2] + step;
      y[1] = mn;
      y[0] = p * k.decay + (k.mu * mn + step);
      break;
    }
    case OptimKind::kAdam: {
      const C m = x[2], v = x[3];
      const C mn = m + (g - m) * k.c1;
      const C vn = v + (g * g - v) * k.c2;
      y[1] = mn;
      y[2] = vn;
      y[0] = p * k.decay - k.alpha * mn / (c_sqrt(vn) + k.eps);
      break;
    }
    case OptimKind::kRmsprop: {
      const C vn = k.rho * x[2] + k.crho * (g * g);
      y[1] = vn;
      C denom;
      if (a.centered) {
        // Static indices only (the arrays stay in registers).
        const C mgn = k.rho * (a.rms_momentum ? x[4] : x[3]) + k.crho * g;
        if (a.rms_momentum)
          y[3] = mgn;
        else
          y[2] = mgn;
        denom = vn - mgn * mgn + k.eps;
      } else {
        denom = vn + k.eps;
      }
      const C inc = k.lr * g / c_sqrt(denom);
      if (a.rms_momentum) {
        const C mn = k.mu * x[3] + inc;
        y[2] = mn;
        y[0] = p * k.decay - mn;
      } else {
        y[0] = p * k.decay - inc;
      }
      break;
    }
  }
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T>
__global__ void optim_kernel(const __grid_constant__ OptimArgs a, Coeffs host, int n_in, int n_out, bool vec) {
  using C = compute_t<T>;
  constexpr int V = static_cast<int>(16 / sizeof(T));
  Coeffs c = host;
  if (a.hyper != nullptr) {  // uniform: every thread reaches the barrier
    __shared__ Coeffs shared;
    if (threadIdx.x == 0) shared = derive(a, a.hyper[0], a.hyper[1]);
    __syncthreads();
    c = shared;
  }
  Consts<C> k;
  k.lr = static_cast<C>(c.lr);
  k.decay = static_cast<C>(c.decay);
  k.alpha = static_cast<C>(c.alpha);
  k.mu = static_cast<C>(a.momentum);
  k.eps = static_cast<C>(a.epsilon);
  k.c1 = static_cast<C>(1 - a.beta_1);
  k.c2 = static_cast<C>(1 - a.beta_2);
  k.rho = static_cast<C>(a.rho);
  k.crho = static_cast<C>(1 - a.rho);
  const int64_t n = a.n;
  int64_t start = 0;
  if (vec) {
    const int64_t groups = n / V;
    KILN_GRID_STRIDE_LOOP(g, groups) {
      C x[V][5] = {}, y[V][4] = {};
#pragma unroll
      for (int i = 0; i < 5; ++i)
        if (i < n_in) {
          const Vec<T, V> in = static_cast<const Vec<T, V>*>(a.in[i])[g];
#pragma unroll
          for (int j = 0; j < V; ++j) x[j][i] = load_as<C>(in.v, j);
        }
#pragma unroll
      for (int j = 0; j < V; ++j) update<C>(a, k, x[j], y[j]);
#pragma unroll
      for (int o = 0; o < 4; ++o)
        if (o < n_out) {
          Vec<T, V> out;
#pragma unroll
          for (int j = 0; j < V; ++j) store_from(out.v, j, y[j][o]);
          static_cast<Vec<T, V>*>(a.out[o])[g] = out;
        }
    }
    start = groups * V;
  }
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t e = start + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    C x[5] = {}, y[4] = {};
#pragma unroll
    for (int i = 0; i < 5; ++i)
      if (i < n_in) x[i] = load_as<C>(static_cast<const T*>(a.in[i]), e);
    update<C>(a, k, x, y);
#pragma unroll
    for (int o = 0; o < 4; ++o)
      if (o < n_out) store_from(static_cast<T*>(a.out[o]), e, y[o]);
  }
}

}  // namespace

void launch_optim(const OptimArgs& args, DType dtype, cudaStream_t stream) {
  const int64_t n = args.n;
  if (n <= 0) return;
  int n_in = 2, n_out = 1;
  switch (args.kind) {
    case OptimKind::kSgd: break;
    case OptimKind::kSgdMomentum:
    case OptimKind::kSgdNesterov: n_in = 3, n_out = 2; break;
    case OptimKind::kAdam: n_in = 4, n_out = 3; break;
    case OptimKind::kRmsprop:
      n_in = 3 + args.rms_momentum + args.centered;
      n_out = n_in - 1;
      break;
  }
  // With the (lr, step) array on the device, the kernel derives the coefficients.
  const Coeffs host = args.hyper ? Coeffs{0, 0, 0} : derive(args, args.lr, args.step);
  bool aligned = true;
  for (int i = 0; i < n_in; ++i) aligned = aligned && reinterpret_cast<uintptr_t>(args.in[i]) % 16 == 0;
  for (int o = 0; o < n_out; ++o) aligned = aligned && reinterpret_cast<uintptr_t>(args.out[o]) % 16 == 0;
  auto fail = [&] { throw_bad_dtype("optimizer update", dtype); };
  KILN_CUDA_DISPATCH_FLOAT(dtype, fail, {
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const bool vec = aligned && n >= V;
    optim_kernel<T><<<grid_for(vec ? n / V : n), kThreads, 0, stream>>>(args, host, n_in, n_out, vec);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
