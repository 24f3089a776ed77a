// Reduction kernels (see reduce_launch.h).
//
// One kernel per (dtype, accumulator kind) reduces the (O, R, I) view: a block of
// bx * by = 256 threads owns bx consecutive outputs (a tile) and a range of R; thread
// (tx, ty) folds rows ty, ty + by, ... of output tx, then the block folds the by
// partials (warp shuffles, then shared memory). bx is 1 for long contiguous rows
// (threads stride along the row), >= 32 for wide inner dims (threads along I), and in
// between for short reductions, so warps read contiguous memory in every case. When
// there are too few tiles to fill the device, R is split over gridDim.y blocks whose
// partials a second kernel folds in order. Kinds: "wide" (f64 for floats, uint64 for
// integers: sum/mean/prod/all/any/var/std/logsumexp), "ext" (compute type: max/min),
// "arg" (value + index: argmax/argmin). The op runs as a compile-time accumulator
// class inside the kernel (one switch per launch, no per-element branching).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "device_util.cuh"
#include "reduce_launch.h"

namespace kiln::cuda {
namespace {

template <typename T>
inline constexpr bool kFloat = std::is_floating_point_v<T> || std::is_same_v<T, __half> ||
                               std::is_same_v<T, __nv_bfloat16>;

template <typename V>
struct ArgAcc {
  V v;
  long long i;  // -1: empty
};

enum Kind { kKindWide = 0, kKindExt = 1, kKindArg = 2 };
enum AccClass { kSum, kProd, kAll, kAny, kSqDev, kExp, kMax, kMin, kArgMax, kArgMin };

constexpr int kind_of(int a) { return a <= kExp ? kKindWide : a <= kMin ? kKindExt : kKindArg; }
template <typename T, int A>
constexpr bool class_ok() {
  return (A != kSqDev && A != kExp) || kFloat<T>;
}

template <typename T>
using WideT = std::conditional_t<kFloat<T>, double, unsigned long long>;
template <typename T, int K>
using AccT = std::conditional_t<K == kKindWide, WideT<T>,
                                std::conditional_t<K == kKindExt, compute_t<T>, ArgAcc<compute_t<T>>>>;

struct Params {
  const void* x;
  void* out;
  const void* center;
  void* partial;
  int64_t R, I, nout, Rc;
  int S;  // R splits; 0: R == 0 (finalize only)
  int op;
  int acc;
  int64_t ddof;
};

template <typename T>
__device__ __forceinline__ compute_t<T> to_c(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return x;
}

template <typename V>
__device__ __forceinline__ bool is_nan(V v) {
  if constexpr (std::is_floating_point_v<V>) return v != v;
  else return false;
}

template <typename V>
__device__ __forceinline__ V shfl_down(V v, int off) {
  if constexpr (sizeof(V) < 4) {
    return static_cast<V>(__shfl_down_sync(0xffffffffu, static_cast<int>(v), off));
  } else {
    return __shfl_down_sync(0xffffffffu, v, off);
  }
}
template <typename V>
__device__ __forceinline__ ArgAcc<V> shfl_down(ArgAcc<V> a, int off) {
  return ArgAcc<V>{shfl_down(a.v, off), shfl_down(a.i, off)};
}

// Center of output j: logsumexp's max (non-finite -> 0), var/std's mean; 0 without one.
template <typename T>
__device__ __forceinline__ double center_at(const Params& p, int64_t j) {
  if (!p.center) return 0.0;
  if (p.op == kReduceLogsumexp) {
    const double c = static_cast<double>(load_as<compute_t<T>>(static_cast<const T*>(p.center), j));
    return isfinite(c) ? c : 0.0;
  }
  return static_cast<const double*>(p.center)[j];
}

template <typename T, int A>
__device__ __forceinline__ AccT<T, kind_of(A)> identity() {
  using C = compute_t<T>;
  using Acc = AccT<T, kind_of(A)>;
  if constexpr (A == kProd || A == kAll) {
    return Acc(1);
  } else if constexpr (A == kMax) {
    if constexpr (kFloat<T>) return -std::numeric_limits<C>::infinity();
    else return std::numeric_limits<C>::lowest();
  } else if constexpr (A == kMin) {
    if constexpr (kFloat<T>) return std::numeric_limits<C>::infinity();
    else return std::numeric_limits<C>::max();
  } else if constexpr (A == kArgMax || A == kArgMin) {
    return Acc{C(0), -1};
  } else {
    return Acc(0);
  }
}

template <typename T, int A>
__device__ __forceinline__ AccT<T, kind_of(A)> load(T x, int64_t r, double c) {
  using C = compute_t<T>;
  using Acc = AccT<T, kind_of(A)>;
  if constexpr (A == kSum || A == kProd) {
    if constexpr (kFloat<T>) return static_cast<double>(to_c(x));
    else return static_cast<unsigned long long>(static_cast<long long>(x));
  } else if constexpr (A == kAll || A == kAny) {
    return to_c(x) != C(0) ? Acc(1) : Acc(0);
  } else if constexpr (A == kSqDev) {
    const double d = static_cast<double>(to_c(x)) - c;
    return d * d;
  } else if constexpr (A == kExp) {
    const C d = to_c(x) - static_cast<C>(c);  // exp in the input's compute precision, as the CPU
    return static_cast<double>(exp(d));
  } else if constexpr (A == kMax || A == kMin) {
    return to_c(x);
  } else {
    return Acc{to_c(x), static_cast<long long>(r)};
  }
}

// a strictly better than b for argmax (Max) / argmin: NaN beats every number.
template <bool Max, typename V>
__device__ __forceinline__ bool arg_better(V a, V b) {
  return (Max ? a > b : a < b) || (is_nan(a) && !is_nan(b));
}

template <typename T, int A, typename Acc>
__device__ __forceinline__ Acc combine(Acc a, Acc b) {
  if constexpr (A == kSum || A == kSqDev || A == kExp) {
    return a + b;
  } else if constexpr (A == kProd || A == kAll) {
    return a * b;
  } else if constexpr (A == kAny) {
    return a > b ? a : b;
  } else if constexpr (A == kMax) {
    return (a > b || is_nan(a)) ? a : b;
  } else if constexpr (A == kMin) {
    return (a < b || is_nan(a)) ? a : b;
  } else {
    constexpr bool kMaxArg = A == kArgMax;
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (arg_better<kMaxArg>(a.v, b.v)) return a;
    if (arg_better<kMaxArg>(b.v, a.v)) return b;
    return a.i <= b.i ? a : b;  // equal (or both NaN): the first index
  }
}

// Writes output j from its folded accumulator.
template <typename T, int K>
__device__ __forceinline__ void finish(const Params& p, int64_t j, AccT<T, K> t) {
  if constexpr (K == kKindWide) {
    if constexpr (kFloat<T>) {
      const double v = t, n = static_cast<double>(p.R);
      T* out = static_cast<T*>(p.out);
      switch (p.op) {
        case kReduceMean: store_from(out, j, v / n); break;
        case kReduceMeanF64: static_cast<double*>(p.out)[j] = v / n; break;
        case kReduceAll:
        case kReduceAny: static_cast<uint8_t*>(p.out)[j] = v != 0.0 ? 1 : 0; break;
        case kReduceVar:
        case kReduceStd: {
          const double q = v / static_cast<double>(p.R - p.ddof > 0 ? p.R - p.ddof : 0);
          store_from(out, j, p.op == kReduceStd ? sqrt(q) : q);
          break;
        }
        case kReduceLogsumexp: store_from(out, j, log(v) + center_at<T>(p, j)); break;
        default: store_from(out, j, v); break;  // sum, prod
      }
    } else {
      const unsigned long long u = t;
      switch (p.op) {
        case kReduceMean:
          static_cast<float*>(p.out)[j] =
              static_cast<float>(static_cast<double>(static_cast<long long>(u)) / static_cast<double>(p.R));
          break;
        case kReduceAll:
        case kReduceAny: static_cast<uint8_t*>(p.out)[j] = u != 0 ? 1 : 0; break;
        default: static_cast<long long*>(p.out)[j] = static_cast<long long>(u); break;  // sum, prod
      }
    }
  } else if constexpr (K == kKindExt) {
    store_from(static_cast<T*>(p.out), j, t);
  } else {
    static_cast<long long*>(p.out)[j] = t.i;
  }
}

constexpr int kBlock = 256;

// Folds the block's by partials per column tx; the result is valid in threads ty == 0.
template <typename T, int A, typename Acc>
__device__ __forceinline__ Acc block_fold(Acc a, Acc* sm) {
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * bx + tx, lane = tid & 31, warp = tid >> 5;
  int rows;
  if (bx < 32) {
    // Lanes l and l + off (off a multiple of bx) hold the same column.
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
      if (off >= bx) a = combine<T, A>(a, shfl_down(a, off));
    rows = kBlock / 32;
    if (lane < bx) sm[warp * bx + lane] = a;
  } else {
    rows = by;
    sm[ty * bx + tx] = a;
  }
  __syncthreads();
  if (ty == 0) {
    a = sm[tx];
    for (int k = 1; k < rows; ++k) a = combine<T, A>(a, sm[k * bx + tx]);
  }
  __syncthreads();
  return a;
}

template <typename T, int K, int A>
__device__ __forceinline__ void reduce_tiles(const Params& p, AccT<T, K>* sm) {
  using Acc = AccT<T, K>;
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const T* x = static_cast<const T*>(p.x);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * p.Rc;
  const int64_t r1 = r0 + p.Rc < p.R ? r0 + p.Rc : p.R;
  const int64_t ntiles = (p.nout + bx - 1) / bx;
  const int64_t step = static_cast<int64_t>(by) * p.I;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int64_t j = tile * bx + tx;
    const bool valid = j < p.nout;
    double c = 0.0;
    if constexpr (A == kSqDev || A == kExp)
      if (valid) c = center_at<T>(p, j);
    Acc a = identity<T, A>();
    if (valid) {
      const int64_t o = j / p.I, i = j - o * p.I;
      int64_t r = r0 + ty;
      const T* px = x + (o * p.R + r) * p.I + i;
      // Four independent loads in flight per thread.
      for (; r + 3 * by < r1; r += 4 * by) {
        const T v0 = px[0], v1 = px[step], v2 = px[2 * step], v3 = px[3 * step];
        a = combine<T, A>(a, load<T, A>(v0, r, c));
        a = combine<T, A>(a, load<T, A>(v1, r + by, c));
        a = combine<T, A>(a, load<T, A>(v2, r + 2 * by, c));
        a = combine<T, A>(a, load<T, A>(v3, r + 3 * by, c));
        px += 4 * step;
      }
      for (; r < r1; r += by) {
        a = combine<T, A>(a, load<T, A>(*px, r, c));
        px += step;
      }
    }
    a = block_fold<T, A>(a, sm);
    if (ty == 0 && valid) {
      if (p.S == 1) finish<T, K>(p, j, a);
      else static_cast<Acc*>(p.partial)[blockIdx.y * p.nout + j] = a;
    }
  }
}

template <typename T, int K, int A>
__device__ __forceinline__ void finalize_body(const Params& p) {
  using Acc = AccT<T, K>;
  const Acc* part = static_cast<const Acc*>(p.partial);
  KILN_GRID_STRIDE_LOOP(j, p.nout) {
    Acc a = identity<T, A>();
    for (int s = 0; s < p.S; ++s) a = combine<T, A>(a, part[s * p.nout + j]);
    finish<T, K>(p, j, a);
  }
}

// Runs BODY<T, K, A> for the accumulator class p.acc (only classes of kind K that
// apply to T are compiled).
#define KILN_REDUCE_CLASS(A, ...)                                   \
  if constexpr (kind_of(A) == K && class_ok<T, A>()) {              \
    if (p.acc == A) {                                               \
      __VA_ARGS__;                                                  \
      return;                                                       \
    }                                                               \
  }
#define KILN_REDUCE_CLASSES(BODY, ...)                   \
  KILN_REDUCE_CLASS(kSum, BODY<T, K, kSum>(__VA_ARGS__))       \
  KILN_REDUCE_CLASS(kProd, BODY<T, K, kProd>(__VA_ARGS__))     \
  KILN_REDUCE_CLASS(kAll, BODY<T, K, kAll>(__VA_ARGS__))       \
  KILN_REDUCE_CLASS(kAny, BODY<T, K, kAny>(__VA_ARGS__))       \
  KILN_REDUCE_CLASS(kSqDev, BODY<T, K, kSqDev>(__VA_ARGS__))   \
  KILN_REDUCE_CLASS(kExp, BODY<T, K, kExp>(__VA_ARGS__))       \
  KILN_REDUCE_CLASS(kMax, BODY<T, K, kMax>(__VA_ARGS__))       \
  KILN_REDUCE_CLASS(kMin, BODY<T, K, kMin>(__VA_ARGS__))       \
  KILN_REDUCE_CLASS(kArgMax, BODY<T, K, kArgMax>(__VA_ARGS__)) \
  KILN_REDUCE_CLASS(kArgMin, BODY<T, K, kArgMin>(__VA_ARGS__))

template <typename T, int K>
__global__ void __launch_bounds__(kBlock) reduce_kernel(Params p) {
  using Acc = AccT<T, K>;
  __shared__ __align__(16) unsigned char sm_raw[kBlock * sizeof(Acc)];
  Acc* sm = reinterpret_cast<Acc*>(sm_raw);
  KILN_REDUCE_CLASSES(reduce_tiles, p, sm)
}

template <typename T, int K>
__global__ void reduce_finalize_kernel(Params p) {
  KILN_REDUCE_CLASSES(finalize_body, p)
}

int acc_class(int op) {
  switch (op) {
    case kReduceProd: return kProd;
    case kReduceAll: return kAll;
    case kReduceAny: return kAny;
    case kReduceVar:
    case kReduceStd: return kSqDev;
    case kReduceLogsumexp: return kExp;
    case kReduceMax: return kMax;
    case kReduceMin: return kMin;
    case kReduceArgmax: return kArgMax;
    case kReduceArgmin: return kArgMin;
    default: return kSum;  // sum, mean, mean_f64
  }
}

int64_t acc_bytes(DType dt, int kind) {
  if (kind == kKindWide) return 8;
  const int64_t c = (dt == DType::kF16 || dt == DType::kBF16) ? 4 : static_cast<int64_t>(dtype_size(dt));
  return kind == kKindExt ? c : 16;
}

int64_t pow2_at_least(int64_t n, int64_t cap) {
  int64_t p = 1;
  while (p < n && p < cap) p *= 2;
  return p;
}

struct Plan {
  int bx = 1, by = kBlock;
  int S = 1;
  int64_t Rc = 0;
  int64_t tiles = 0;
};

Plan make_plan(const ReduceArgs& a, int num_sms) {
  Plan pl;
  const int64_t R = a.reduced, I = a.inner, nout = a.outer * a.inner;
  const int64_t bxi = pow2_at_least(I, 32);
  pl.by = static_cast<int>(std::min<int64_t>(kBlock / bxi, pow2_at_least(R, kBlock)));
  pl.bx = kBlock / pl.by;
  pl.tiles = (nout + pl.bx - 1) / pl.bx;
  if (R == 0) {
    pl.S = 0;
    return pl;
  }
  const int64_t target = static_cast<int64_t>(std::max(num_sms, 1)) * 8;
  int64_t S = 1;
  if (pl.tiles < target) {
    const int64_t want = (target + pl.tiles - 1) / pl.tiles;
    const int64_t most = std::max<int64_t>(1, R / (static_cast<int64_t>(pl.by) * 16));
    S = std::min<int64_t>({want, most, 65535});
  }
  pl.Rc = (R + S - 1) / S;
  pl.S = static_cast<int>((R + pl.Rc - 1) / pl.Rc);
  return pl;
}

bool is_float_dtype(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kF16 || d == DType::kBF16; }

}  // namespace

int64_t reduce_scratch_bytes(const ReduceArgs& a, int num_sms) {
  const int64_t nout = a.outer * a.inner;
  if (nout == 0) return 0;
  const Plan pl = make_plan(a, num_sms);
  if (pl.S <= 1) return 0;
  return static_cast<int64_t>(pl.S) * nout * acc_bytes(a.dtype, kind_of(acc_class(a.op)));
}

void launch_reduce(const ReduceArgs& a, void* scratch, int num_sms, cudaStream_t stream) {
  const int64_t nout = a.outer * a.inner;
  if (nout == 0) return;
  const int acc = acc_class(a.op);
  if ((acc == kSqDev || acc == kExp || a.op == kReduceMeanF64) && !is_float_dtype(a.dtype))
    throw_bad_dtype("reduction (floating only)", a.dtype);
  const Plan pl = make_plan(a, num_sms);
  Params p{a.x, a.out, a.center, scratch, a.reduced, a.inner, nout, pl.Rc, pl.S, a.op, acc, a.ddof};
  const int kind = kind_of(acc);
  const unsigned gx = static_cast<unsigned>(std::min<int64_t>(pl.tiles, int64_t{1} << 30));
  auto fail = [&] { throw_bad_dtype("reduction", a.dtype); };
  KILN_CUDA_DISPATCH_ALL(a.dtype, fail, {
    auto run = [&](auto kind_tag) {
      constexpr int K = decltype(kind_tag)::value;
      if (pl.S >= 1)
        reduce_kernel<T, K><<<dim3(gx, static_cast<unsigned>(pl.S)), dim3(pl.bx, pl.by), 0, stream>>>(p);
      if (pl.S != 1) reduce_finalize_kernel<T, K><<<grid_for(nout), kThreads, 0, stream>>>(p);
    };
    if (kind == kKindWide) run(std::integral_constant<int, kKindWide>{});
    else if (kind == kKindExt) run(std::integral_constant<int, kKindExt>{});
    else run(std::integral_constant<int, kKindArg>{});
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
