// nn ops: batch, layer and RMS normalisation.
#include <cmath>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/ops/nn.h"
#include "nn_util.h"

namespace kiln::ops {
namespace {
using detail::call1;
using namespace nn_detail;

void check_eps(const char* op, const Attrs& a) {
  double eps = a.get_float("eps");
  if (!(eps >= 0) || !std::isfinite(eps))
    throw InvalidArgumentError(std::string(op) + ": eps must be finite and >= 0, got " + std::to_string(eps));
}

// The channel count along the `axis` attribute (validated).
int64_t channels(const char* op, const TensorMeta& x, const Attrs& a) {
  detail::require_floating(op, x);
  if (x.shape.rank() < 1) throw InvalidArgumentError(std::string(op) + ": input must have rank >= 1, got a scalar");
  int axis = normalize_axis(a.get_int("axis"), x.shape.rank(), (std::string(op) + " axis").c_str());
  check_eps(op, a);
  return x.shape[axis];
}

std::vector<TensorMeta> infer_bn_inference(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "batch_norm_inference";
  Shape c{channels(op, in[0], a)};
  const char* names[] = {"mean", "var", "gamma", "beta"};
  for (int i = 0; i < 4; ++i) check_param(op, names[i], in[i + 1], in[0].dtype, c);
  return {in[0]};
}

std::vector<TensorMeta> infer_bn_training(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "batch_norm_training";
  Shape c{channels(op, in[0], a)};
  check_param(op, "gamma", in[1], in[0].dtype, c);
  check_param(op, "beta", in[2], in[0].dtype, c);
  return {in[0], {c, in[0].dtype}, {c, in[0].dtype}};
}

Shape trailing(const Shape& s, int begin) { return Shape(std::span<const int64_t>(s.begin() + begin, s.end())); }

std::vector<TensorMeta> infer_layer_norm(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "layer_norm";
  detail::require_floating(op, in[0]);
  if (in[0].shape.rank() < 1) throw InvalidArgumentError("layer_norm: input must have rank >= 1, got a scalar");
  int begin = normalize_axis(a.get_int("begin_axis"), in[0].shape.rank(), "layer_norm begin_axis");
  check_eps(op, a);
  Shape norm = trailing(in[0].shape, begin);
  check_param(op, "gamma", in[1], in[0].dtype, norm);
  check_param(op, "beta", in[2], in[0].dtype, norm);
  return {in[0]};
}

std::vector<TensorMeta> infer_rms_norm(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "rms_norm";
  detail::require_floating(op, in[0]);
  if (in[0].shape.rank() < 1) throw InvalidArgumentError("rms_norm: input must have rank >= 1, got a scalar");
  check_eps(op, a);
  check_param(op, "gamma", in[1], in[0].dtype, Shape{in[0].shape.dim(-1)});
  return {in[0]};
}

KILN_REGISTER_OP(detail::make_def("batch_norm_inference", "(x - mean) / sqrt(var + eps) * gamma + beta per channel", 5,
                     infer_bn_inference,
                     {{"eps", AttrType::kFloat, "added to the variance"},
                      {"axis", AttrType::kInt, "channel axis"}}));
KILN_REGISTER_OP(detail::make_def("batch_norm_training", "batch normalisation with batch statistics; outputs y, mean, biased var",
                     3, infer_bn_training,
                     {{"eps", AttrType::kFloat, "added to the variance"},
                      {"axis", AttrType::kInt, "channel axis"}}));
KILN_REGISTER_OP(detail::make_def("layer_norm", "normalisation over the trailing dims from begin_axis", 3, infer_layer_norm,
                     {{"eps", AttrType::kFloat, "added to the variance"},
                      {"begin_axis", AttrType::kInt, "first normalised axis"}}));
KILN_REGISTER_OP(detail::make_def("rms_norm", "x / sqrt(mean(x^2) + eps) * gamma over the last axis", 2, infer_rms_norm,
                     {{"eps", AttrType::kFloat, "added to the mean square"}}));

// [C] for the channel axis of x (or [] when the axis is bad: inference reports it).
Shape channel_shape(const Tensor& x, int64_t axis) {
  if (x.rank() < 1 || axis < -x.rank() || axis >= x.rank()) return Shape{1};
  return Shape{x.dim(static_cast<int>(axis))};
}

}  // namespace

Tensor batch_norm_inference(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& gamma,
                            const Tensor& beta, double eps, int64_t axis) {
  const char* op = "batch_norm_inference";
  require_defined(op, "input", x);
  require_defined(op, "mean", mean);
  require_defined(op, "var", var);
  Tensor xx = as_floating(x);
  DType t = xx.dtype();
  Shape c = channel_shape(xx, axis);
  return call1(KILN_OP("batch_norm_inference"),
               {xx, param_for(mean, t), param_for(var, t), param_or(gamma, t, c, 1), param_or(beta, t, c, 0)},
               {{"eps", eps}, {"axis", axis}});
}

BatchNormTrainingResult batch_norm_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                                            int64_t axis) {
  require_defined("batch_norm_training", "input", x);
  Tensor xx = as_floating(x);
  DType t = xx.dtype();
  Shape c = channel_shape(xx, axis);
  std::vector<Tensor> in{xx, param_or(gamma, t, c, 1), param_or(beta, t, c, 0)};
  std::vector<Tensor> out = call_op(KILN_OP("batch_norm_training"), in, {{"eps", eps}, {"axis", axis}});
  return {out[0], out[1], out[2]};
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, int64_t begin_axis) {
  require_defined("layer_norm", "input", x);
  Tensor xx = as_floating(x);
  DType t = xx.dtype();
  Shape norm{1};
  if (xx.rank() >= 1 && begin_axis >= -xx.rank() && begin_axis < xx.rank())
    norm = trailing(xx.shape(), normalize_axis(begin_axis, xx.rank()));
  return call1(KILN_OP("layer_norm"), {xx, param_or(gamma, t, norm, 1), param_or(beta, t, norm, 0)},
               {{"eps", eps}, {"begin_axis", begin_axis}});
}

Tensor rms_norm(const Tensor& x, const Tensor& gamma, double eps) {
  require_defined("rms_norm", "input", x);
  Tensor xx = as_floating(x);
  Shape d{xx.rank() >= 1 ? xx.dim(-1) : 1};
  return call1(KILN_OP("rms_norm"), {xx, param_or(gamma, xx.dtype(), d, 1)}, {{"eps", eps}});
}

}  // namespace kiln::ops
