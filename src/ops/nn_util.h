#pragma once
// Helpers shared by the nn op definitions (internal).
#include <string>

#include "kiln/core/attrs.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "backends/common/nn_geometry.h"
#include "op_util.h"

namespace kiln::ops::nn_detail {

// The convolution and pooling geometry (backends/common/nn_geometry.h), shared with the kernels.
using namespace kiln::nn_geometry;

inline bool is_16bit_float(DType t) { return t == DType::kF16 || t == DType::kBF16; }

// Whether a parameter of dtype `p` may go with an input of dtype `x`: the same
// dtype, or f32 parameters for a 16-bit input.
inline bool param_dtype_ok(DType p, DType x) { return p == x || (p == DType::kF32 && is_16bit_float(x)); }

// Validates a parameter tensor's dtype and shape (inference).
inline void check_param(const char* op, const char* name, const TensorMeta& p, DType x, const Shape& expected) {
  if (!param_dtype_ok(p.dtype, x))
    throw InvalidArgumentError(std::string(op) + ": " + name + " must have the input's dtype (" +
                               detail::dtype_str(x) + ")" + (is_16bit_float(x) ? " or f32" : "") + ", got " +
                               detail::dtype_str(p.dtype));
  if (p.shape != expected)
    throw InvalidArgumentError(std::string(op) + ": " + name + " must have shape " + expected.str() + ", got " +
                               p.shape.str());
}

inline void require_defined(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) throw InvalidArgumentError(std::string(op) + ": " + name + " is undefined");
}

// Integer and bool inputs compute in f32.
inline Tensor as_floating(const Tensor& x) { return is_floating(x.dtype()) ? x : cast(x, DType::kF32); }

// A parameter in the dtype the kernel takes for input dtype `x` (see param_dtype_ok).
inline Tensor param_for(const Tensor& p, DType x) { return param_dtype_ok(p.dtype(), x) ? p : cast(p, x); }

// An optional per-element parameter: `p` converted for `x`, or a tensor of `fill`.
inline Tensor param_or(const Tensor& p, DType x, const Shape& shape, double fill) {
  if (p.defined()) return param_for(p, x);
  Tensor t = Tensor::zeros(shape, DType::kF64);
  if (fill != 0) {
    double* d = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = fill;
  }
  return t.to(x);
}

// The attribute schema shared by the 2-d pooling ops (forward and backward), and the
// attrs of one pooling call.
const std::vector<AttrSpec>& pool_attr_specs();
Attrs pool_attrs(const std::vector<int64_t>& ksize, const std::vector<int64_t>& strides, const Padding& padding,
                 const std::string& data_format);

}  // namespace kiln::ops::nn_detail
