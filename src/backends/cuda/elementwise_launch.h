#pragma once
// Launchers of elementwise_kernels.cu and fused_elementwise_kernels.cu (internal), and
// (for nvcc only) the device expressions of the elementwise ops, shared by both .cu
// files so that a fused instruction computes exactly what the op's own kernel does.
//
// Every expression is the CPU kernel's (src/backends/cpu/elementwise_kernels.cc),
// evaluated in the compute type: float for f16/bf16, the storage type otherwise.
#include <cuda_runtime.h>

#include <cstdint>

#include "broadcast.h"
#include "kiln/core/dtype.h"

namespace kiln::cuda {

// ---- unary -------------------------------------------------------------------------

enum class EwUnaryOp : uint8_t {
  // every numeric dtype
  kNeg, kAbs, kSign, kSquare, kRelu, kClip, kLogicalNot,
  // floating dtypes only
  kExp, kLog, kLog1p, kSqrt, kRsqrt, kReciprocal, kSin, kCos, kTanh, kSigmoid, kRelu6, kLeakyRelu, kElu,
  kGelu, kGeluTanh, kSilu, kSoftplus, kErf, kFloor, kCeil, kRound,
};

// Attribute values of a unary op: leaky_relu/elu alpha in f0; clip's bounds in
// (f0, f1) for floating dtypes and (i0, i1) for integer ones (already converted to the
// dtype's range on the host).
struct EwUnaryParams {
  double f0 = 0, f1 = 0;
  int64_t i0 = 0, i1 = 0;
};

// y[i] = op(x[i]), n elements of `dtype` (bool: logical_not only, stored as bytes).
void launch_unary(EwUnaryOp op, DType dtype, const void* x, void* y, int64_t n, const EwUnaryParams& params,
                  cudaStream_t stream);

// ---- binary / where ----------------------------------------------------------------

enum class EwBinaryOp : uint8_t {
  kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum,
  kEqual, kNotEqual, kLess, kLessEqual, kGreater, kGreaterEqual,  // -> bool
  kLogicalAnd, kLogicalOr,                                        // bool -> bool
  kReluGrad,                                                      // (g, y) -> y > 0 ? g : 0
};
inline bool ew_is_comparison(EwBinaryOp op) { return op >= EwBinaryOp::kEqual && op <= EwBinaryOp::kLogicalOr; }

// How an operand is read at the output's flat index i.
enum class EwAccess : int32_t {
  kContiguous = 0,  // element i (the output's shape)
  kScalar = 1,      // element 0 (one element)
  kBroadcast = 2,   // element map.offset(i)
};
struct EwOperand {
  const void* data = nullptr;
  EwAccess access = EwAccess::kContiguous;
  BroadcastMap map{};  // kBroadcast only
};

// out[i] = op(a, b) over the n elements of the output; a and b of `dtype`, the output
// of `dtype` or bool (comparisons and logical ops).
void launch_binary(EwBinaryOp op, DType dtype, const EwOperand& a, const EwOperand& b, void* out, int64_t n,
                   cudaStream_t stream);

// out[i] = cond ? x : y; cond bool, x, y and out of `dtype` (copied bitwise).
void launch_where(DType dtype, const EwOperand& cond, const EwOperand& x, const EwOperand& y, void* out, int64_t n,
                  cudaStream_t stream);

// ---- fused_elementwise -------------------------------------------------------------

// A program of f32 unary/binary instructions evaluated per element in registers.
// Operand references: kFusedInput | k reads input k (its element i, element 0 when
// bit k of scalar_mask is set, element i % period[k] when period[k] > 0: an input
// broadcast along leading dims); a value below kFusedInput reads scratch slot `ref`.
// Instruction k writes slot `dst`, except the last, which writes the output.
constexpr int kFusedMaxInputs = 64;
constexpr int kFusedMaxInstrs = 64;
constexpr int kFusedMaxSlots = 32;  // most scratch slots a program may use
constexpr uint8_t kFusedInput = 0x80;
struct FusedInstr {
  uint8_t op;      // EwUnaryOp or EwBinaryOp
  uint8_t binary;  // 1: op is an EwBinaryOp reading a and b
  uint8_t a, b;    // operand references
  uint8_t dst;     // scratch slot of the result
};
struct FusedProgram {
  const float* in[kFusedMaxInputs];
  uint64_t scalar_mask = 0;
  int64_t period[kFusedMaxInputs] = {};  // 0: an input of the output's size
  int n_in = 0;
  int n_instr = 0;
  int n_slots = 0;  // slots used (<= kFusedMaxSlots)
  FusedInstr ins[kFusedMaxInstrs];
};
void launch_fused_elementwise(const FusedProgram& program, float* out, int64_t n, cudaStream_t stream);

}  // namespace kiln::cuda

// ---- device expressions (nvcc only) --------------------------------------------------
#if defined(__CUDACC__)
#include <type_traits>

namespace kiln::cuda::ew {

// Math in the compute type, float or double.
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double m_expm1(double x) { return expm1(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double m_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_sin(float x) { return sinf(x); }
__device__ __forceinline__ double m_sin(double x) { return sin(x); }
__device__ __forceinline__ float m_cos(float x) { return cosf(x); }
__device__ __forceinline__ double m_cos(double x) { return cos(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double m_erfc(double x) { return erfc(x); }
__device__ __forceinline__ float m_fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_fabs(double x) { return fabs(x); }
__device__ __forceinline__ float m_floor(float x) { return floorf(x); }
__device__ __forceinline__ double m_floor(double x) { return floor(x); }
__device__ __forceinline__ float m_ceil(float x) { return ceilf(x); }
__device__ __forceinline__ double m_ceil(double x) { return ceil(x); }
__device__ __forceinline__ float m_rint(float x) { return rintf(x); }  // half to even, as nearbyint
__device__ __forceinline__ double m_rint(double x) { return rint(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

template <typename C>
__device__ __forceinline__ C abs_value(C x) {
  if constexpr (std::is_unsigned_v<C>) return x;
  else return x < C(0) ? static_cast<C>(-x) : x;
}
template <typename C>
__device__ __forceinline__ C sign_value(C x) {
  if constexpr (std::is_unsigned_v<C>) return static_cast<C>(C(0) < x);
  else return x != x ? x : static_cast<C>((C(0) < x) - (x < C(0)));
}
// Integer power by squaring (the CPU's int_pow): negative exponents give 1 / base**e
// truncated (only +-1 survive).
template <typename C>
__device__ __forceinline__ C int_pow(C base, C e) {
  if constexpr (std::is_signed_v<C>) {
    if (e < 0) return base == 1 ? C(1) : (base == C(-1) ? ((e & 1) ? C(-1) : C(1)) : C(0));
  }
  C r = 1;
  while (e) {
    if (e & 1) r = static_cast<C>(r * base);
    base = static_cast<C>(base * base);
    e >>= 1;
  }
  return r;
}

// v[j] = op(v[j]) for a group of V values; p0, p1: the op's attributes (EwUnaryParams)
// in the compute type. The switch is per group and uniform across the warp.
template <typename C, int V>
__device__ __forceinline__ void unary_group(EwUnaryOp op, C (&v)[V], C p0, C p1) {
#define KILN_EW_UNARY(CODE, EXPR)         \
  case EwUnaryOp::CODE: {                 \
    _Pragma("unroll") for (int j = 0; j < V; ++j) { \
      const C x = v[j];                   \
      v[j] = static_cast<C>(EXPR);        \
    }                                     \
    return;                               \
  }
  switch (op) {
    KILN_EW_UNARY(kNeg, -x)
    KILN_EW_UNARY(kAbs, abs_value(x))
    KILN_EW_UNARY(kSign, sign_value(x))
    KILN_EW_UNARY(kSquare, x * x)
    KILN_EW_UNARY(kRelu, x > C(0) ? x : C(0))
    KILN_EW_UNARY(kClip, x < p0 ? p0 : (x > p1 ? p1 : x))
    KILN_EW_UNARY(kLogicalNot, x == C(0) ? C(1) : C(0))
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      KILN_EW_UNARY(kExp, m_exp(x))
      KILN_EW_UNARY(kLog, m_log(x))
      KILN_EW_UNARY(kLog1p, m_log1p(x))
      KILN_EW_UNARY(kSqrt, m_sqrt(x))
      KILN_EW_UNARY(kRsqrt, C(1) / m_sqrt(x))
      KILN_EW_UNARY(kReciprocal, C(1) / x)
      KILN_EW_UNARY(kSin, m_sin(x))
      KILN_EW_UNARY(kCos, m_cos(x))
      KILN_EW_UNARY(kTanh, m_tanh(x))
      KILN_EW_UNARY(kSigmoid, C(1) / (C(1) + m_exp(-x)))
      KILN_EW_UNARY(kRelu6, x < C(0) ? C(0) : (x > C(6) ? C(6) : x))
      KILN_EW_UNARY(kLeakyRelu, x > C(0) ? x : p0 * x)
      KILN_EW_UNARY(kElu, x > C(0) ? x : p0 * m_expm1(x))
      // x * Phi(x) = 0.5 x erfc(-x / sqrt(2)); the tanh form with sqrt(2 / pi).
      KILN_EW_UNARY(kGelu, C(0.5) * x * m_erfc(-x * C(0.7071067811865476)))
      KILN_EW_UNARY(kGeluTanh,
                    C(0.5) * x * (C(1) + m_tanh(C(0.7978845608028654) * (x + C(0.044715) * x * x * x))))
      KILN_EW_UNARY(kSilu, x / (C(1) + m_exp(-x)))
      KILN_EW_UNARY(kSoftplus, (x > C(0) ? x : C(0)) + m_log1p(m_exp(-m_fabs(x))))
      KILN_EW_UNARY(kErf, m_erf(x))
      KILN_EW_UNARY(kFloor, m_floor(x))
      KILN_EW_UNARY(kCeil, m_ceil(x))
      KILN_EW_UNARY(kRound, m_rint(x))
      default:
        break;
    }
  }
#undef KILN_EW_UNARY
}

// r[j] = op(a[j], b[j]); comparisons and logical ops give C(1) / C(0). r may alias a.
template <typename C, int V>
__device__ __forceinline__ void binary_group(EwBinaryOp op, const C (&a)[V], const C (&b)[V], C (&r)[V]) {
#define KILN_EW_BINARY(CODE, EXPR)        \
  case EwBinaryOp::CODE: {                \
    _Pragma("unroll") for (int j = 0; j < V; ++j) { \
      const C x = a[j], y = b[j];         \
      r[j] = static_cast<C>(EXPR);        \
    }                                     \
    return;                               \
  }
  switch (op) {
    KILN_EW_BINARY(kAdd, x + y)
    KILN_EW_BINARY(kSub, x - y)
    KILN_EW_BINARY(kMul, x * y)
    KILN_EW_BINARY(kMaximum, (x > y || x != x) ? x : y)
    KILN_EW_BINARY(kMinimum, (x < y || x != x) ? x : y)
    KILN_EW_BINARY(kEqual, x == y ? C(1) : C(0))
    KILN_EW_BINARY(kNotEqual, x != y ? C(1) : C(0))
    KILN_EW_BINARY(kLess, x < y ? C(1) : C(0))
    KILN_EW_BINARY(kLessEqual, x <= y ? C(1) : C(0))
    KILN_EW_BINARY(kGreater, x > y ? C(1) : C(0))
    KILN_EW_BINARY(kGreaterEqual, x >= y ? C(1) : C(0))
    KILN_EW_BINARY(kLogicalAnd, (x != C(0) && y != C(0)) ? C(1) : C(0))
    KILN_EW_BINARY(kLogicalOr, (x != C(0) || y != C(0)) ? C(1) : C(0))
    KILN_EW_BINARY(kReluGrad, y > C(0) ? x : C(0))
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      KILN_EW_BINARY(kDiv, x / y)
      KILN_EW_BINARY(kPow, m_pow(x, y))
      default:
        break;
    }
  } else {
    switch (op) {
      KILN_EW_BINARY(kPow, int_pow<C>(x, y))
      default:
        break;
    }
  }
#undef KILN_EW_BINARY
}

}  // namespace kiln::cuda::ew
#endif  // __CUDACC__
