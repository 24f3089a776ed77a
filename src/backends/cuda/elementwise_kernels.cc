// Elementwise ops on CUDA: unary math (with attrs), broadcasting binary ops and
// comparisons, logical ops, where, clip, relu_grad, identities (stop_gradient, and
// floor/ceil/round of integers). Semantics: src/backends/cpu/elementwise_kernels.cc.
#include <cmath>
#include <limits>

#include "cuda_error.h"
#include "elementwise_launch.h"
#include "kernel_util.h"
#include "kiln/core/cross_replica.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

// How `t` is read at the output's flat index.
EwOperand operand(const Tensor& t, const Shape& out) {
  EwOperand o;
  o.data = t.raw_data();
  if (t.numel() == 1) {
    o.access = EwAccess::kScalar;
  } else if (t.shape() == out) {
    o.access = EwAccess::kContiguous;
  } else {
    o.map = make_broadcast_map(out, t.shape());
    // Leading 1s only ([1, n] into [n]): the same layout.
    o.access = (o.map.rank == 1 && o.map.strides[0] == 1) ? EwAccess::kContiguous : EwAccess::kBroadcast;
  }
  return o;
}

// ---- unary -------------------------------------------------------------------------

void run_unary(OpContext& ctx, EwUnaryOp op, const EwUnaryParams& p = {}) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  launch_unary(op, ctx.in[0].dtype(), ctx.in[0].raw_data(), out.raw_data(), out.numel(), p, s.stream);
}

template <EwUnaryOp Op>
void k_unary(OpContext& ctx) {
  run_unary(ctx, Op);
}

void k_leaky_relu(OpContext& ctx) {
  EwUnaryParams p;
  p.f0 = ctx.attrs.get_float("alpha");
  run_unary(ctx, EwUnaryOp::kLeakyRelu, p);
}
void k_elu(OpContext& ctx) {
  EwUnaryParams p;
  p.f0 = ctx.attrs.get_float("alpha");
  run_unary(ctx, EwUnaryOp::kElu, p);
}
void k_gelu(OpContext& ctx) {
  run_unary(ctx, ctx.attrs.get_bool("approximate", false) ? EwUnaryOp::kGeluTanh : EwUnaryOp::kGelu);
}

// A bound converted to an integer dtype as the CPU's static_cast does (truncation
// toward zero) for values in range; values beyond the dtype saturate (the CPU's cast
// is undefined there).
int64_t int_bound(double v, DType t) {
  double lo = 0, hi = 0;
  switch (t) {
    case DType::kU8: lo = 0, hi = 255; break;
    case DType::kI8: lo = -128, hi = 127; break;
    case DType::kI32: lo = -2147483648.0, hi = 2147483647.0; break;
    default: {  // i64: the extremes are not both doubles
      if (v >= 9223372036854775807.0) return std::numeric_limits<int64_t>::max();
      if (v <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(v);
    }
  }
  v = std::trunc(v);
  return static_cast<int64_t>(v < lo ? lo : (v > hi ? hi : v));
}

void k_clip(OpContext& ctx) {
  EwUnaryParams p;
  const double lo = ctx.attrs.get_float("min"), hi = ctx.attrs.get_float("max");
  const DType t = ctx.in[0].dtype();
  if (is_floating(t)) {
    p.f0 = lo;
    p.f1 = hi;
  } else {
    p.i0 = int_bound(lo, t);
    p.i1 = int_bound(hi, t);
  }
  run_unary(ctx, EwUnaryOp::kClip, p);
}

// A copy in stream order (stop_gradient; floor, ceil and round of integers).
void k_identity(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.nbytes() == 0 || ctx.in[0].raw_data() == out.raw_data()) return;
  KernelScope s(out);
  KILN_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), ctx.in[0].raw_data(), out.nbytes(), cudaMemcpyDeviceToDevice,
                                  s.stream));
}

// One replica (no collective installed on the thread): the identity; a GPU replica of a
// strategy: the sum through its collective (NCCL, ordered on the stream), copied into
// the output.
void k_cross_replica_sum(OpContext& ctx) {
  const CrossReplicaSumFn* sum = cross_replica_sum_fn();
  if (!sum) return k_identity(ctx);
  const Tensor s = (*sum)(ctx.in[0]);
  Tensor& out = ctx.out[0];
  KILN_CHECK_INTERNAL(s.device() == out.device() && s.nbytes() == out.nbytes(),
                      "cross_replica_sum: the collective returned ", s.desc(), " for ", ctx.in[0].desc());
  if (out.nbytes() == 0) return;
  KernelScope scope(out);
  KILN_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), s.raw_data(), out.nbytes(), cudaMemcpyDeviceToDevice, scope.stream));
}

// ---- binary / where ----------------------------------------------------------------

template <EwBinaryOp Op>
void k_binary(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  const int64_t n = out.numel();
  if (n == 0) return;
  KernelScope s(out);
  launch_binary(Op, ctx.in[0].dtype(), operand(ctx.in[0], out.shape()), operand(ctx.in[1], out.shape()),
                out.raw_data(), n, s.stream);
}

void k_where(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  const int64_t n = out.numel();
  if (n == 0) return;
  KernelScope s(out);
  launch_where(out.dtype(), operand(ctx.in[0], out.shape()), operand(ctx.in[1], out.shape()),
               operand(ctx.in[2], out.shape()), out.raw_data(), n, s.stream);
}

// ---- registration (the CPU backend's dtypes) ---------------------------------------

#define KILN_CUDA_INT_DTYPES {DType::kU8, DType::kI8, DType::kI32, DType::kI64}
#define KILN_CUDA_NUMERIC_DTYPES \
  {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kU8, DType::kI8, DType::kI32, DType::kI64}

KILN_REGISTER_KERNEL("add", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_binary<EwBinaryOp::kAdd>);
KILN_REGISTER_KERNEL("sub", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_binary<EwBinaryOp::kSub>);
KILN_REGISTER_KERNEL("mul", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_binary<EwBinaryOp::kMul>);
KILN_REGISTER_KERNEL("div", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_binary<EwBinaryOp::kDiv>);
KILN_REGISTER_KERNEL("pow", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_binary<EwBinaryOp::kPow>);
KILN_REGISTER_KERNEL("maximum", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kMaximum>);
KILN_REGISTER_KERNEL("minimum", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kMinimum>);
KILN_REGISTER_KERNEL("equal", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kEqual>);
KILN_REGISTER_KERNEL("not_equal", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kNotEqual>);
KILN_REGISTER_KERNEL("less", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kLess>);
KILN_REGISTER_KERNEL("less_equal", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kLessEqual>);
KILN_REGISTER_KERNEL("greater", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kGreater>);
KILN_REGISTER_KERNEL("greater_equal", kCUDA, KILN_CUDA_ALL_DTYPES, k_binary<EwBinaryOp::kGreaterEqual>);
KILN_REGISTER_KERNEL("logical_and", kCUDA, DType::kBool, k_binary<EwBinaryOp::kLogicalAnd>);
KILN_REGISTER_KERNEL("logical_or", kCUDA, DType::kBool, k_binary<EwBinaryOp::kLogicalOr>);
KILN_REGISTER_KERNEL("logical_not", kCUDA, DType::kBool, k_unary<EwUnaryOp::kLogicalNot>);
KILN_REGISTER_KERNEL("relu_grad", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_binary<EwBinaryOp::kReluGrad>);

KILN_REGISTER_KERNEL("neg", kCUDA,
                     (std::initializer_list<DType>{DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8,
                                                   DType::kI32, DType::kI64}),
                     k_unary<EwUnaryOp::kNeg>);
KILN_REGISTER_KERNEL("abs", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_unary<EwUnaryOp::kAbs>);
KILN_REGISTER_KERNEL("sign", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_unary<EwUnaryOp::kSign>);
KILN_REGISTER_KERNEL("square", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_unary<EwUnaryOp::kSquare>);
KILN_REGISTER_KERNEL("relu", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_unary<EwUnaryOp::kRelu>);
KILN_REGISTER_KERNEL("exp", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kExp>);
KILN_REGISTER_KERNEL("log", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kLog>);
KILN_REGISTER_KERNEL("log1p", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kLog1p>);
KILN_REGISTER_KERNEL("sqrt", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kSqrt>);
KILN_REGISTER_KERNEL("rsqrt", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kRsqrt>);
KILN_REGISTER_KERNEL("reciprocal", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kReciprocal>);
KILN_REGISTER_KERNEL("sin", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kSin>);
KILN_REGISTER_KERNEL("cos", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kCos>);
KILN_REGISTER_KERNEL("tanh", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kTanh>);
KILN_REGISTER_KERNEL("sigmoid", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kSigmoid>);
KILN_REGISTER_KERNEL("relu6", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kRelu6>);
KILN_REGISTER_KERNEL("leaky_relu", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_leaky_relu);
KILN_REGISTER_KERNEL("elu", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_elu);
KILN_REGISTER_KERNEL("gelu", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_gelu);
KILN_REGISTER_KERNEL("silu", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kSilu>);
KILN_REGISTER_KERNEL("softplus", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kSoftplus>);
KILN_REGISTER_KERNEL("erf", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kErf>);
KILN_REGISTER_KERNEL("floor", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kFloor>);
KILN_REGISTER_KERNEL("ceil", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kCeil>);
KILN_REGISTER_KERNEL("round", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_unary<EwUnaryOp::kRound>);
KILN_REGISTER_KERNEL("floor", kCUDA, KILN_CUDA_INT_DTYPES, k_identity);
KILN_REGISTER_KERNEL("ceil", kCUDA, KILN_CUDA_INT_DTYPES, k_identity);
KILN_REGISTER_KERNEL("round", kCUDA, KILN_CUDA_INT_DTYPES, k_identity);
KILN_REGISTER_KERNEL("clip", kCUDA, KILN_CUDA_NUMERIC_DTYPES, k_clip);
KILN_REGISTER_KERNEL("where", kCUDA, KILN_CUDA_ALL_DTYPES, k_where);
KILN_REGISTER_KERNEL("stop_gradient", kCUDA, KILN_CUDA_ALL_DTYPES, k_identity);
KILN_REGISTER_KERNEL("cross_replica_sum", kCUDA, DType::kF32, k_cross_replica_sum);
KILN_REGISTER_KERNEL("cross_replica_sum", kCUDA, DType::kF64, k_cross_replica_sum);

}  // namespace
}  // namespace kiln::cuda
