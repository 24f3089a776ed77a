// Elementwise kernels: unary math, broadcasting binary ops and comparisons, where.
//
// One kernel template per family, instantiated per storage type; the op is a runtime
// code (uniform across the grid, switched on once per group of values). Contiguous
// operands move in 16-byte vectors when every pointer allows it; broadcast operands
// are indexed through a BroadcastMap with 32-bit index arithmetic when the output is
// small enough.
#include "device_util.cuh"
#include "elementwise_launch.h"

namespace kiln::cuda {
namespace {

using ew::binary_group;
using ew::unary_group;

// V values of T moved as one aligned vector.
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));  // values per 16-byte vector

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() { return static_cast<int64_t>(blockDim.x) * gridDim.x; }

// The offset of output index `flat` in a broadcast operand. I: the index type of the
// divisions (uint32_t when every index fits). Fully unrolled over kMaxDims so that
// the map stays in registers / parameter space.
template <typename I>
__device__ __forceinline__ int64_t map_offset(const BroadcastMap& m, int64_t flat) {
  I f = static_cast<I>(flat);
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d > 0; --d) {
    if (d < m.rank) {
      const I s = static_cast<I>(m.sizes[d]);
      const I q = f / s;
      off += static_cast<int64_t>(f - q * s) * m.strides[d];
      f = q;
    }
  }
  return off + static_cast<int64_t>(f) * m.strides[0];
}

struct DevOperand {
  const void* data;
  EwAccess access;
  BroadcastMap map;
};

__device__ __forceinline__ int64_t operand_index(const DevOperand& o, int64_t i, bool idx32) {
  switch (o.access) {
    case EwAccess::kContiguous:
      return i;
    case EwAccess::kScalar:
      return 0;
    default:
      return idx32 ? map_offset<uint32_t>(o.map, i) : map_offset<int64_t>(o.map, i);
  }
}

// ---- unary -------------------------------------------------------------------------

template <typename T>
__global__ void unary_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, EwUnaryOp op,
                             EwUnaryParams prm, bool vec) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  C p0, p1;
  if constexpr (std::is_floating_point_v<C>) {
    p0 = static_cast<C>(prm.f0);
    p1 = static_cast<C>(prm.f1);
  } else {
    p0 = static_cast<C>(prm.i0);
    p1 = static_cast<C>(prm.i1);
  }
  int64_t start = 0;
  if (vec) {
    const int64_t groups = n / V;
    const Vec<T, V>* xv = reinterpret_cast<const Vec<T, V>*>(x);
    Vec<T, V>* yv = reinterpret_cast<Vec<T, V>*>(y);
    KILN_GRID_STRIDE_LOOP(g, groups) {
      const Vec<T, V> in = xv[g];
      C v[V];
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = load_as<C>(in.v, j);
      unary_group<C, V>(op, v, p0, p1);
      Vec<T, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) store_from(out.v, j, v[j]);
      yv[g] = out;
    }
    start = groups * V;
  }
  for (int64_t i = start + thread_index(); i < n; i += thread_count()) {
    C v[1] = {load_as<C>(x, i)};
    unary_group<C, 1>(op, v, p0, p1);
    store_from(y, i, v[0]);
  }
}

template <typename T>
void unary_typed(EwUnaryOp op, const void* x, void* y, int64_t n, const EwUnaryParams& p, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  const bool vec = n >= V && aligned(x, 16) && aligned(y, 16);
  unary_kernel<T><<<grid_for(vec ? n / V : n), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y),
                                                                     n, op, p, vec);
}

// ---- binary ------------------------------------------------------------------------

template <typename T, typename O>
struct BinaryArgs {
  DevOperand a, b;
  O* out;
  int64_t n;
  EwBinaryOp op;
  bool vec;    // a and b contiguous or scalar, every contiguous pointer 16-byte aligned
  bool idx32;  // n < 2^32
};

template <typename T, int V, typename C>
__device__ __forceinline__ void load_group(const DevOperand& o, C scalar, int64_t g, C (&v)[V]) {
  if (o.access == EwAccess::kScalar) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = scalar;
  } else {
    const Vec<T, V> in = reinterpret_cast<const Vec<T, V>*>(o.data)[g];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = load_as<C>(in.v, j);
  }
}

template <typename T, typename O>
__global__ void binary_kernel(const __grid_constant__ BinaryArgs<T, O> args) {
  using C = compute_t<T>;
  constexpr int V = kVec<T>;
  const T* a = static_cast<const T*>(args.a.data);
  const T* b = static_cast<const T*>(args.b.data);
  O* out = args.out;
  const int64_t n = args.n;
  int64_t start = 0;
  if (args.vec) {
    const C sa = args.a.access == EwAccess::kScalar ? load_as<C>(a, 0) : C(0);
    const C sb = args.b.access == EwAccess::kScalar ? load_as<C>(b, 0) : C(0);
    const int64_t groups = n / V;
    KILN_GRID_STRIDE_LOOP(g, groups) {
      C x[V], y[V];
      load_group<T, V>(args.a, sa, g, x);
      load_group<T, V>(args.b, sb, g, y);
      binary_group<C, V>(args.op, x, y, x);
      Vec<O, V> r;
#pragma unroll
      for (int j = 0; j < V; ++j) store_from(r.v, j, x[j]);
      reinterpret_cast<Vec<O, V>*>(out)[g] = r;
    }
    start = groups * V;
  }
  for (int64_t i = start + thread_index(); i < n; i += thread_count()) {
    C x[1] = {load_as<C>(a, operand_index(args.a, i, args.idx32))};
    const C y[1] = {load_as<C>(b, operand_index(args.b, i, args.idx32))};
    binary_group<C, 1>(args.op, x, y, x);
    store_from(out, i, x[0]);
  }
}

DevOperand dev_operand(const EwOperand& o) { return {o.data, o.access, o.map}; }

template <typename T, typename O>
void binary_typed(EwBinaryOp op, const EwOperand& a, const EwOperand& b, void* out, int64_t n, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  BinaryArgs<T, O> args{dev_operand(a), dev_operand(b), static_cast<O*>(out), n, op, false, n <= 0xffffffffLL};
  auto vec_ok = [](const EwOperand& o) {
    return o.access == EwAccess::kScalar || (o.access == EwAccess::kContiguous && aligned(o.data, 16));
  };
  args.vec = n >= V && vec_ok(a) && vec_ok(b) && aligned(out, sizeof(O) * V);
  binary_kernel<T, O><<<grid_for(args.vec ? n / V : n), kThreads, 0, stream>>>(args);
}

// ---- where -------------------------------------------------------------------------

// Bitwise select: U is the unsigned integer of the dtype's size.
template <size_t Bytes> struct SameSizeUInt;
template <> struct SameSizeUInt<1> { using type = uint8_t; };
template <> struct SameSizeUInt<2> { using type = uint16_t; };
template <> struct SameSizeUInt<4> { using type = uint32_t; };
template <> struct SameSizeUInt<8> { using type = uint64_t; };

template <typename U>
struct WhereArgs {
  DevOperand c, x, y;
  U* out;
  int64_t n;
  bool vec;    // every operand contiguous or scalar, contiguous pointers aligned to their vectors
  bool idx32;
};

template <typename T, int V>
__device__ __forceinline__ void load_raw(const DevOperand& o, T scalar, int64_t g, T (&v)[V]) {
  if (o.access == EwAccess::kScalar) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = scalar;
  } else {
    const Vec<T, V> in = reinterpret_cast<const Vec<T, V>*>(o.data)[g];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = in.v[j];
  }
}

template <typename U>
__global__ void where_kernel(const __grid_constant__ WhereArgs<U> args) {
  constexpr int V = kVec<U>;
  const uint8_t* c = static_cast<const uint8_t*>(args.c.data);
  const U* x = static_cast<const U*>(args.x.data);
  const U* y = static_cast<const U*>(args.y.data);
  const int64_t n = args.n;
  int64_t start = 0;
  if (args.vec) {
    const uint8_t sc = args.c.access == EwAccess::kScalar ? c[0] : uint8_t(0);
    const U sx = args.x.access == EwAccess::kScalar ? x[0] : U(0);
    const U sy = args.y.access == EwAccess::kScalar ? y[0] : U(0);
    const int64_t groups = n / V;
    KILN_GRID_STRIDE_LOOP(g, groups) {
      uint8_t cv[V];
      U xv[V], yv[V];
      load_raw<uint8_t, V>(args.c, sc, g, cv);
      load_raw<U, V>(args.x, sx, g, xv);
      load_raw<U, V>(args.y, sy, g, yv);
      Vec<U, V> r;
#pragma unroll
      for (int j = 0; j < V; ++j) r.v[j] = cv[j] ? xv[j] : yv[j];
      reinterpret_cast<Vec<U, V>*>(args.out)[g] = r;
    }
    start = groups * V;
  }
  for (int64_t i = start + thread_index(); i < n; i += thread_count()) {
    const bool ci = c[operand_index(args.c, i, args.idx32)] != 0;
    args.out[i] = ci ? x[operand_index(args.x, i, args.idx32)] : y[operand_index(args.y, i, args.idx32)];
  }
}

template <typename U>
void where_typed(const EwOperand& c, const EwOperand& x, const EwOperand& y, void* out, int64_t n,
                 cudaStream_t stream) {
  constexpr int V = kVec<U>;
  WhereArgs<U> args{dev_operand(c), dev_operand(x), dev_operand(y), static_cast<U*>(out), n, false,
                    n <= 0xffffffffLL};
  auto vec_ok = [](const EwOperand& o, size_t bytes) {
    return o.access == EwAccess::kScalar || (o.access == EwAccess::kContiguous && aligned(o.data, bytes));
  };
  args.vec = n >= V && vec_ok(c, V) && vec_ok(x, 16) && vec_ok(y, 16) && aligned(out, 16);
  where_kernel<U><<<grid_for(args.vec ? n / V : n), kThreads, 0, stream>>>(args);
}

}  // namespace

void launch_unary(EwUnaryOp op, DType dtype, const void* x, void* y, int64_t n, const EwUnaryParams& params,
                  cudaStream_t stream) {
  if (n <= 0) return;
  auto fail = [&] { throw_bad_dtype("unary elementwise op", dtype); };
  KILN_CUDA_DISPATCH_ALL(dtype, fail, unary_typed<T>(op, x, y, n, params, stream))
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_binary(EwBinaryOp op, DType dtype, const EwOperand& a, const EwOperand& b, void* out, int64_t n,
                   cudaStream_t stream) {
  if (n <= 0) return;
  auto fail = [&] { throw_bad_dtype("binary elementwise op", dtype); };
  const bool to_bool = ew_is_comparison(op);
  KILN_CUDA_DISPATCH_ALL(dtype, fail, {
    if (to_bool)
      binary_typed<T, uint8_t>(op, a, b, out, n, stream);
    else
      binary_typed<T, T>(op, a, b, out, n, stream);
  })
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_where(DType dtype, const EwOperand& cond, const EwOperand& x, const EwOperand& y, void* out, int64_t n,
                  cudaStream_t stream) {
  if (n <= 0) return;
  auto fail = [&] { throw_bad_dtype("where", dtype); };
  KILN_CUDA_DISPATCH_ALL(dtype, fail, where_typed<typename SameSizeUInt<sizeof(T)>::type>(cond, x, y, out, n, stream))
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
