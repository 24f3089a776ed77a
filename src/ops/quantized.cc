// Quantised (int8) inference ops for post-training quantisation: per-tensor
// activation quantisation (u8 with a zero point) and per-output-channel symmetric
// weights (i8 with an f32 scale per channel). `kiln convert --precision int8`
// rewrites f32 graphs into these; the eager functions are in kiln/ops/nn.h.
//
// None is differentiable (inference only): quantisation happens after training.
#include <cmath>
#include <limits>

#include "nn_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops {

namespace {
using detail::call1;
using detail::dtype_str;
using namespace nn_detail;

// Longest reduction (K, or KH*KW*Cin/groups) whose int32 accumulator cannot
// overflow: |u8 * i8| <= 255 * 128 per term.
constexpr int64_t kMaxReduction = std::numeric_limits<int32_t>::max() / (255 * 128);

void require_dtype(const char* op, const char* name, const TensorMeta& m, DType want) {
  if (m.dtype != want)
    throw InvalidArgumentError(std::string(op) + ": " + name + " must be " + dtype_str(want) + ", got " +
                               dtype_str(m.dtype));
}

void require_shape(const char* op, const char* name, const TensorMeta& m, const Shape& want) {
  if (m.shape != want)
    throw InvalidArgumentError(std::string(op) + ": " + name + " must have shape " + want.str() + ", got " +
                               m.shape.str());
}

// A per-tensor scale (> 0, finite, and > 0 in f32 too) and a u8 zero point in [0, 255].
void check_qparams(const char* op, const Attrs& a, const char* scale_name, const char* zp_name) {
  if (!a.has(scale_name)) throw InvalidArgumentError(std::string(op) + ": missing attribute '" + scale_name + "'");
  const double s = a.get_float(scale_name);
  if (!(s > 0) || !std::isfinite(s) || !(static_cast<float>(s) > 0) || !std::isfinite(static_cast<float>(s)))
    throw InvalidArgumentError(std::string(op) + ": " + scale_name + " must be a finite number > 0 (in f32), got " +
                               std::to_string(s));
  const int64_t zp = a.get_int(zp_name, 0);
  if (zp < 0 || zp > 255)
    throw InvalidArgumentError(std::string(op) + ": " + zp_name + " must be in [0, 255] (u8), got " +
                               std::to_string(zp));
}

void check_activation(const char* op, const Attrs& a) {
  const std::string act = a.get_string("activation", "none");
  if (act != "" && act != "none" && act != "relu")
    throw InvalidArgumentError(std::string(op) + ": unknown activation '" + act + "' (expected none or relu)");
}

void check_reduction(const char* op, int64_t k) {
  if (k > kMaxReduction)
    throw InvalidArgumentError(std::string(op) + ": reduction length " + std::to_string(k) + " exceeds " +
                               std::to_string(kMaxReduction) + " (int32 accumulators could overflow)");
}

// quantize_per_tensor(x f32) -> u8, attrs scale, zero_point:
//   q = clamp(round_half_even(x / scale) + zero_point, 0, 255); NaN -> 0.
std::vector<TensorMeta> infer_quantize(std::span<const TensorMeta> in, const Attrs& a) {
  require_dtype("quantize_per_tensor", "x", in[0], DType::kF32);
  check_qparams("quantize_per_tensor", a, "scale", "zero_point");
  return {{in[0].shape, DType::kU8}};
}

// dequantize_per_tensor(q u8) -> f32, attrs scale, zero_point: x = (q - zero_point) * scale.
std::vector<TensorMeta> infer_dequantize(std::span<const TensorMeta> in, const Attrs& a) {
  require_dtype("dequantize_per_tensor", "q", in[0], DType::kU8);
  check_qparams("dequantize_per_tensor", a, "scale", "zero_point");
  return {{in[0].shape, DType::kF32}};
}

const std::vector<AttrSpec> kQuantAttrs = {
    {"scale", AttrType::kFloat, "quantisation step (> 0)"},
    {"zero_point", AttrType::kInt, "u8 value of real 0, in [0, 255] (default 0)"},
};

// The quantised-activation attrs shared by qlinear_matmul and qlinear_conv2d.
const std::vector<AttrSpec> kQlinearAttrs = {
    {"x_scale", AttrType::kFloat, "activation quantisation step (> 0)"},
    {"x_zero_point", AttrType::kInt, "activation zero point in [0, 255] (default 0)"},
    {"activation", AttrType::kString, "\"none\" (or \"\") or \"relu\""},
    {"y_scale", AttrType::kFloat, "optional: requantise the output to u8 with this step (> 0)"},
    {"y_zero_point", AttrType::kInt, "the requantised output's zero point in [0, 255] (default 0)"},
};

// x is f32 (quantised by the op with x_scale / x_zero_point) or u8 (already quantised
// with them: a requantised output of an earlier qlinear op, say).
void require_activation(const char* op, const TensorMeta& x) {
  if (x.dtype != DType::kF32 && x.dtype != DType::kU8)
    throw InvalidArgumentError(std::string(op) + ": x must be f32 or u8 (quantised), got " + dtype_str(x.dtype));
}

// f32, or u8 when y_scale is set: y_q = clamp(round_half_even(y / y_scale) + y_zero_point, 0, 255).
DType output_dtype(const char* op, const Attrs& a) {
  if (!a.has("y_scale")) return DType::kF32;
  check_qparams(op, a, "y_scale", "y_zero_point");
  return DType::kU8;
}

// Checks w_scale [n] and the optional bias [n] (inputs 2 and 3).
void check_channel_params(const char* op, std::span<const TensorMeta> in, int64_t n) {
  require_dtype(op, "w_scale", in[2], DType::kF32);
  require_shape(op, "w_scale", in[2], Shape{n});
  if (in.size() == 4) {
    require_dtype(op, "bias", in[3], DType::kF32);
    require_shape(op, "bias", in[3], Shape{n});
  }
}

void check_arity(const char* op, std::span<const TensorMeta> in) {
  if (in.size() != 3 && in.size() != 4)
    throw InvalidArgumentError(std::string(op) + ": takes 3 or 4 inputs (x, w_q, w_scale[, bias]), got " +
                               std::to_string(in.size()));
}

// qlinear_matmul(x f32|u8 [M, K], w_q i8 [K, N], w_scale f32 [N], bias f32 [N]?) -> f32 [M, N]
//   attrs x_scale (> 0), x_zero_point ([0, 255], default 0), activation (none|relu).
//   xq = clamp(round_half_even(x / x_scale) + x_zero_point, 0, 255)  (x f32; x u8 is xq)
//   y[m, n] = act(x_scale * w_scale[n] * sum_k (xq[m, k] - x_zero_point) * w_q[k, n] + bias[n])
// i.e. exactly matmul(dequantize(xq), w_q * w_scale) + bias up to f32 rounding (the sum
// is exact in int32). No transposes: the weight is stored [K, N]. With y_scale (and
// y_zero_point) the output is u8: quantize_per_tensor(y, y_scale, y_zero_point), so
// that int8 layers pass u8 activations along (kiln convert chains them).
std::vector<TensorMeta> infer_qlinear_matmul(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "qlinear_matmul";
  check_arity(op, in);
  require_activation(op, in[0]);
  require_dtype(op, "w_q", in[1], DType::kI8);
  const Shape &x = in[0].shape, &w = in[1].shape;
  if (x.rank() != 2 || w.rank() != 2)
    throw InvalidArgumentError(std::string(op) + ": needs x [M, K] and w_q [K, N] of rank 2, got " + x.str() +
                               " and " + w.str());
  if (x[1] != w[0])
    throw InvalidArgumentError(std::string(op) + ": shapes do not chain: x " + x.str() + ", w_q " + w.str());
  check_channel_params(op, in, w[1]);
  check_qparams(op, a, "x_scale", "x_zero_point");
  check_activation(op, a);
  check_reduction(op, x[1]);
  return {{Shape{x[0], w[1]}, output_dtype(op, a)}};
}

// qlinear_conv2d(x f32|u8 NHWC, w_q i8 HWIO [KH, KW, C/groups, O], w_scale f32 [O],
//                bias f32 [O]?) -> f32 (u8 with y_scale, as qlinear_matmul) NHWC [N, OH, OW, O]
//   attrs: conv2d's (strides, padding, explicit_paddings, dilations, groups;
//   data_format NHWC only: NCHW is UnimplementedError) plus x_scale, x_zero_point and
//   activation as qlinear_matmul. Per output channel o:
//   y = act(x_scale * w_scale[o] * sum (xq - x_zero_point) * w_q + bias[o])
//   where padded positions are real zeros (xq == x_zero_point: they add nothing),
//   i.e. conv2d(dequantize(xq), w_q * w_scale) + bias up to f32 rounding.
std::vector<TensorMeta> infer_qlinear_conv2d(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "qlinear_conv2d";
  check_arity(op, in);
  if (parse_data_format(op, a))
    throw UnimplementedError(std::string(op) + ": data_format NCHW is not supported (NHWC only)");
  require_activation(op, in[0]);
  require_dtype(op, "w_q", in[1], DType::kI8);
  const Conv2dGeometry g = conv2d_geometry(op, in[0].shape, in[1].shape, a);
  check_channel_params(op, in, g.o);
  check_qparams(op, a, "x_scale", "x_zero_point");
  check_activation(op, a);
  check_reduction(op, g.win.kh * g.win.kw * g.cin_per_group());
  return {{g.output_shape(), output_dtype(op, a)}};
}

KILN_REGISTER_OP(detail::make_def("quantize_per_tensor",
                                  "f32 -> u8: clamp(round_half_even(x / scale) + zero_point, 0, 255)", 1,
                                  infer_quantize, kQuantAttrs, Differentiable::kNo));
KILN_REGISTER_OP(detail::make_def("dequantize_per_tensor", "u8 -> f32: (q - zero_point) * scale", 1, infer_dequantize,
                                  kQuantAttrs, Differentiable::kNo));
KILN_REGISTER_OP(detail::make_def("qlinear_matmul",
                                  "act(x_scale * w_scale * (quantize(x) - x_zero_point) @ w_q + bias): u8 x i8 "
                                  "matmul with per-channel weight scales (int8 inference)",
                                  -1, infer_qlinear_matmul, kQlinearAttrs, Differentiable::kNo));
KILN_REGISTER_OP([] {
  // conv2d's attrs (nn_conv.cc) and the quantisation attrs.
  std::vector<AttrSpec> attrs = {
      {"strides", AttrType::kInts, "[sh, sw], default [1, 1]"},
      {"padding", AttrType::kString, "\"valid\", \"same\" or \"explicit\""},
      {"explicit_paddings", AttrType::kInts, "[top, bottom, left, right] with padding \"explicit\""},
      {"dilations", AttrType::kInts, "[dh, dw], default [1, 1]"},
      {"groups", AttrType::kInt, "channel groups, default 1"},
      {"data_format", AttrType::kString, "\"NHWC\" only (filter HWIO)"},
  };
  attrs.insert(attrs.end(), kQlinearAttrs.begin(), kQlinearAttrs.end());
  return detail::make_def("qlinear_conv2d",
                          "act(conv2d(quantize(x), w_q) scaled per channel + bias): u8 x i8 NHWC convolution "
                          "(int8 inference)",
                          -1, infer_qlinear_conv2d, attrs, Differentiable::kNo);
}());

Attrs qparams(double scale, int64_t zero_point) { return {{"scale", scale}, {"zero_point", zero_point}}; }

Attrs qlinear_attrs(double x_scale, int64_t x_zero_point, const std::string& activation) {
  return {{"x_scale", x_scale}, {"x_zero_point", x_zero_point}, {"activation", activation}};
}

}  // namespace

Tensor quantize_per_tensor(const Tensor& x, double scale, int64_t zero_point) {
  require_defined("quantize_per_tensor", "x", x);
  return call1(KILN_OP("quantize_per_tensor"), {x}, qparams(scale, zero_point));
}

Tensor dequantize_per_tensor(const Tensor& q, double scale, int64_t zero_point) {
  require_defined("dequantize_per_tensor", "q", q);
  return call1(KILN_OP("dequantize_per_tensor"), {q}, qparams(scale, zero_point));
}

Tensor qlinear_matmul(const Tensor& x, double x_scale, int64_t x_zero_point, const Tensor& w_q,
                      const Tensor& w_scale, const Tensor& bias, const std::string& activation) {
  const char* op = "qlinear_matmul";
  require_defined(op, "x", x);
  require_defined(op, "w_q", w_q);
  require_defined(op, "w_scale", w_scale);
  Attrs a = qlinear_attrs(x_scale, x_zero_point, activation);
  if (bias.defined()) return call1(KILN_OP("qlinear_matmul"), {x, w_q, w_scale, bias}, a);
  return call1(KILN_OP("qlinear_matmul"), {x, w_q, w_scale}, a);
}

Tensor qlinear_conv2d(const Tensor& x, double x_scale, int64_t x_zero_point, const Tensor& w_q,
                      const Tensor& w_scale, const Conv2dOptions& opts, const Tensor& bias,
                      const std::string& activation) {
  const char* op = "qlinear_conv2d";
  require_defined(op, "x", x);
  require_defined(op, "w_q", w_q);
  require_defined(op, "w_scale", w_scale);
  Attrs a = qlinear_attrs(x_scale, x_zero_point, activation);
  a.set("strides", opts.strides);
  a.set("dilations", opts.dilations);
  a.set("groups", opts.groups);
  a.set("data_format", opts.data_format);
  a.set("padding", opts.padding.mode);
  if (!opts.padding.pads.empty()) a.set("explicit_paddings", opts.padding.pads);
  if (bias.defined()) return call1(KILN_OP("qlinear_conv2d"), {x, w_q, w_scale, bias}, a);
  return call1(KILN_OP("qlinear_conv2d"), {x, w_q, w_scale}, a);
}

}  // namespace kiln::ops
