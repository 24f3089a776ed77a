#pragma once
// Elementwise ops. Binary ops broadcast with NumPy rules and promote dtypes with
// kiln::promote_types (a Python-number-like scalar overload takes the tensor's
// dtype). Floating-point math on integer or bool inputs computes in f32.
// f16/bf16 inputs compute in f32 and round the result back.
#include "kiln/core/tensor.h"

namespace kiln::ops {

// A 0-d tensor holding `value` in dtype `dt`.
Tensor scalar(double value, DType dt = DType::kF32);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
// True division: integer inputs give f32.
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// Comparisons give bool.
Tensor equal(const Tensor& a, const Tensor& b);
Tensor not_equal(const Tensor& a, const Tensor& b);
Tensor less(const Tensor& a, const Tensor& b);
Tensor less_equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor greater_equal(const Tensor& a, const Tensor& b);
// Logical ops take any dtype (nonzero is true) and give bool.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& x);

Tensor neg(const Tensor& x);
// A copy of x that gradient tapes treat as a constant (tf.stop_gradient). Unlike
// Tensor::clone(), it is an op: a traced function records it (graph passes remove it).
Tensor stop_gradient(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor square(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// The ReLU's backward (TF's ReluGrad): g where y > 0, else 0, in one pass; y is the
// ReLU's output (or its input: the sign is the same). g and y: one floating dtype and shape.
Tensor relu_grad(const Tensor& g, const Tensor& y);
Tensor relu6(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double alpha = 0.2);
Tensor elu(const Tensor& x, double alpha = 1.0);
// approximate=false: x*Phi(x) with erf; true: the tanh approximation.
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor silu(const Tensor& x);
Tensor softplus(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
// Rounds half to even, as NumPy and TensorFlow do.
Tensor round(const Tensor& x);
// Clamps to [lo, hi]; requires lo <= hi.
Tensor clip(const Tensor& x, double lo, double hi);
// cond ? x : y, all three broadcast together; cond is any dtype (nonzero is true).
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y);
Tensor cast(const Tensor& x, DType dtype);

}  // namespace kiln::ops

namespace kiln {
// Operators on tensors (and with scalars, taking the tensor's dtype).
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
}  // namespace kiln
