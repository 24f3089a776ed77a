// nn backward ops without a forward counterpart: max_pool2d_backward,
// avg_pool2d_backward (kernels in backends/cpu/pool_backward_kernels.cc, vjps in
// grad/nn_pool_grad.cc).
#include <algorithm>

#include "kiln/core/op_def.h"
#include "kiln/ops/nn_grad.h"
#include "nn_util.h"

namespace kiln::ops {
namespace {
using detail::call1;
using namespace nn_detail;

void require_dy(const char* op, const TensorMeta& dy, const Pool2dGeometry& g, const Shape& x, DType xt) {
  if (dy.dtype != xt)
    throw InvalidArgumentError(std::string(op) + ": dy must have the input's dtype (" + detail::dtype_str(xt) +
                               "), got " + detail::dtype_str(dy.dtype));
  if (dy.shape != g.output_shape())
    throw InvalidArgumentError(std::string(op) + ": dy must have the pooling output shape " + g.output_shape().str() +
                               " for input " + x.str() + ", got " + dy.shape.str());
}

std::vector<TensorMeta> infer_max_pool2d_backward(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "max_pool2d_backward";
  detail::require_floating(op, in[0]);
  const Pool2dGeometry g = pool2d_geometry(op, in[0].shape, a);
  require_dy(op, in[1], g, in[0].shape, in[0].dtype);
  if (!a.get_bool("bias_grad", false)) return {in[0]};
  return {in[0], {Shape{g.c}, in[0].dtype}};
}

std::vector<TensorMeta> infer_avg_pool2d_backward(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "avg_pool2d_backward";
  detail::require_floating(op, in[0]);
  const std::vector<int64_t>& s = a.get_ints("input_shape");
  if (s.size() != 4 || std::any_of(s.begin(), s.end(), [](int64_t d) { return d < 0; }))
    throw InvalidArgumentError(std::string(op) + ": input_shape must be 4 dims >= 0, got " + ints_str(s));
  Shape x(s);
  require_dy(op, in[0], pool2d_geometry(op, x, a), x, in[0].dtype);
  return {{x, in[0].dtype}};
}

std::vector<AttrSpec> with_input_shape() {
  std::vector<AttrSpec> r = pool_attr_specs();
  r.push_back({"input_shape", AttrType::kInts, "shape of avg_pool2d's input"});
  return r;
}

// Attr relu (graphs only, set by the pool_backward_relu_fusion pass): dx is also zero
// where x <= 0, i.e. relu_grad(max_pool2d_backward(x, dy), x) in one pass, for the
// usual relu -> max_pool2d where x is the ReLU's output.
// Attr bias_grad (graphs only, set by the pool_backward_bias_fusion pass): a second output
// db [C], the sum of dx over all but the channel axis: the gradient of the bias of the
// convolution whose output was pooled, computed while dx is written.
std::vector<AttrSpec> max_pool_backward_attrs() {
  std::vector<AttrSpec> r = pool_attr_specs();
  r.push_back({"relu", AttrType::kBool, "also zero dx where x <= 0 (x a ReLU output), default false"});
  r.push_back({"bias_grad", AttrType::kBool, "second output: dx summed per channel, default false"});
  return r;
}

KILN_REGISTER_OP(detail::make_def("max_pool2d_backward",
                                  "gradient of max_pool2d w.r.t. its input (x, dy); ties go to the first maximum", 2,
                                  infer_max_pool2d_backward, max_pool_backward_attrs(), Differentiable::kNo));
// max_pool2d_backward_mask(mask, dy): the gradient of a 2x2, stride-2, unpadded NHWC
// max pool from fused_conv2d's pool mask (attr pool_mask; u8, the pool's output shape)
// instead of the pool's input: dx [N, 2 PH, 2 PW, C] holds dy at each window's winning
// cell, zeros elsewhere and in windows marked 4. Attr bias_grad as max_pool2d_backward.
// Made by conv_pool_fusion for a train step, which then never writes the convolution's
// output.
std::vector<TensorMeta> infer_max_pool2d_backward_mask(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "max_pool2d_backward_mask";
  if (in[0].dtype != DType::kU8 || in[0].shape.rank() != 4)
    throw InvalidArgumentError(std::string(op) + ": the mask must be u8 [N, H, W, C], got " +
                               detail::dtype_str(in[0].dtype) + in[0].shape.str());
  if (in[1].dtype != DType::kF32 || in[1].shape != in[0].shape)
    throw InvalidArgumentError(std::string(op) + ": dy must be f32 of the mask's shape " + in[0].shape.str() +
                               ", got " + detail::dtype_str(in[1].dtype) + in[1].shape.str());
  const Shape& m = in[0].shape;
  std::vector<TensorMeta> out{{Shape{m[0], 2 * m[1], 2 * m[2], m[3]}, DType::kF32}};
  if (a.get_bool("bias_grad", false)) out.push_back({Shape{m[3]}, DType::kF32});
  return out;
}

KILN_REGISTER_OP([] {
  OpDef d = detail::make_def("max_pool2d_backward_mask",
                             "gradient of a 2x2/2 NHWC max pool from fused_conv2d's pool mask (mask, dy)", 2,
                             infer_max_pool2d_backward_mask,
                             {{"bias_grad", AttrType::kBool, "second output: dx summed per channel, default false"}},
                             Differentiable::kNo);
  d.dispatch_input = 1;
  return d;
}());
KILN_REGISTER_OP(detail::make_def("avg_pool2d_backward", "gradient of avg_pool2d w.r.t. its input (the adjoint)", 1,
                                  infer_avg_pool2d_backward, with_input_shape()));

}  // namespace

Tensor max_pool2d_backward(const Tensor& x, const Tensor& dy, const std::vector<int64_t>& ksize,
                           const std::vector<int64_t>& strides, const Padding& padding,
                           const std::string& data_format) {
  const char* op = "max_pool2d_backward";
  require_defined(op, "input", x);
  require_defined(op, "dy", dy);
  Tensor xx = as_floating(x);
  return call1(KILN_OP("max_pool2d_backward"), {xx, cast(dy, xx.dtype())},
               pool_attrs(ksize, strides, padding, data_format));
}

Tensor avg_pool2d_backward(const Tensor& dy, const Shape& input_shape, const std::vector<int64_t>& ksize,
                           const std::vector<int64_t>& strides, const Padding& padding,
                           const std::string& data_format) {
  require_defined("avg_pool2d_backward", "dy", dy);
  Attrs a = pool_attrs(ksize, strides, padding, data_format);
  a.set("input_shape", input_shape.vec());
  return call1(KILN_OP("avg_pool2d_backward"), {as_floating(dy)}, a);
}

}  // namespace kiln::ops
