// nn ops: conv2d (+ its data and filter gradients) and 2-d pooling.
#include "kiln/core/op_def.h"
#include "kiln/ops/nn.h"
#include "nn_util.h"

namespace kiln::ops {

namespace nn_detail {

const std::vector<AttrSpec>& pool_attr_specs() {
  static const std::vector<AttrSpec> specs = {
      {"ksize", AttrType::kInts, "[kh, kw]"},
      {"strides", AttrType::kInts, "[sh, sw]"},
      {"padding", AttrType::kString, "\"valid\", \"same\" or \"explicit\""},
      {"explicit_paddings", AttrType::kInts, "[top, bottom, left, right] with padding \"explicit\""},
      {"data_format", AttrType::kString, "\"NHWC\" or \"NCHW\""},
  };
  return specs;
}

void set_padding(Attrs& a, const Padding& p) {
  a.set("padding", p.mode);
  if (!p.pads.empty()) a.set("explicit_paddings", p.pads);
}

Attrs pool_attrs(const std::vector<int64_t>& ksize, const std::vector<int64_t>& strides, const Padding& padding,
                 const std::string& data_format) {
  Attrs a{{"ksize", ksize}, {"strides", strides}, {"data_format", data_format}};
  set_padding(a, padding);
  return a;
}

}  // namespace nn_detail

namespace {
using detail::call1;
using namespace nn_detail;

const std::vector<AttrSpec> kConvAttrs = {
    {"strides", AttrType::kInts, "[sh, sw], default [1, 1]"},
    {"padding", AttrType::kString, "\"valid\", \"same\" or \"explicit\""},
    {"explicit_paddings", AttrType::kInts, "[top, bottom, left, right] with padding \"explicit\""},
    {"dilations", AttrType::kInts, "[dh, dw], default [1, 1]"},
    {"groups", AttrType::kInt, "channel groups, default 1"},
    {"data_format", AttrType::kString, "\"NHWC\" (filter HWIO) or \"NCHW\" (filter OIHW)"},
};

void require_conv_dtypes(const char* op, const TensorMeta& a, const TensorMeta& b) {
  detail::require_floating(op, a);
  if (a.dtype != b.dtype)
    throw InvalidArgumentError(std::string(op) + ": operands must have one dtype, got " + detail::dtype_str(a.dtype) +
                               " and " + detail::dtype_str(b.dtype));
}

std::vector<TensorMeta> infer_conv2d(std::span<const TensorMeta> in, const Attrs& a) {
  if (in.size() != 2 && in.size() != 3)
    throw InvalidArgumentError("conv2d: takes 2 or 3 inputs (x, filter[, bias]), got " + std::to_string(in.size()));
  require_conv_dtypes("conv2d", in[0], in[1]);
  Conv2dGeometry g = conv2d_geometry("conv2d", in[0].shape, in[1].shape, a);
  if (in.size() == 3) check_param("conv2d", "bias", in[2], in[0].dtype, Shape{g.o});
  return {{g.output_shape(), in[0].dtype}};
}

Shape shape_attr(const char* op, const Attrs& a, const char* name) {
  const std::vector<int64_t>& v = a.get_ints(name);
  if (v.size() != 4 || std::any_of(v.begin(), v.end(), [](int64_t d) { return d < 0; }))
    throw InvalidArgumentError(std::string(op) + ": " + name + " must be 4 dims >= 0, got " + ints_str(v));
  return Shape(v);
}

void require_dy(const char* op, const TensorMeta& dy, const Conv2dGeometry& g) {
  if (dy.shape != g.output_shape())
    throw InvalidArgumentError(std::string(op) + ": dy must have conv2d's output shape " + g.output_shape().str() +
                               " for input " + g.input_shape().str() + " and filter " + g.filter_shape().str() +
                               ", got " + dy.shape.str());
}

std::vector<TensorMeta> infer_conv2d_backward_data(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "conv2d_backward_data";
  require_conv_dtypes(op, in[0], in[1]);
  Conv2dGeometry g = conv2d_geometry(op, shape_attr(op, a, "input_shape"), in[1].shape, a);
  require_dy(op, in[0], g);
  return {{g.input_shape(), in[0].dtype}};
}

std::vector<TensorMeta> infer_conv2d_backward_filter(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "conv2d_backward_filter";
  require_conv_dtypes(op, in[0], in[1]);
  Conv2dGeometry g = conv2d_geometry(op, in[0].shape, shape_attr(op, a, "filter_shape"), a);
  require_dy(op, in[1], g);
  return {{g.filter_shape(), in[0].dtype}};
}

std::vector<TensorMeta> infer_pool2d(const char* op, std::span<const TensorMeta> in, const Attrs& a) {
  detail::require_floating(op, in[0]);
  return {{pool2d_geometry(op, in[0].shape, a).output_shape(), in[0].dtype}};
}
// max_pool2d also takes u8 (quantised activations between int8 layers: max commutes
// with quantisation, so pooling u8 equals quantising the f32 pool). The eager
// ops::max_pool2d still widens integer inputs to f32.
std::vector<TensorMeta> infer_max_pool2d(std::span<const TensorMeta> in, const Attrs& a) {
  if (in[0].dtype == DType::kU8) return {{pool2d_geometry("max_pool2d", in[0].shape, a).output_shape(), DType::kU8}};
  return infer_pool2d("max_pool2d", in, a);
}
std::vector<TensorMeta> infer_avg_pool2d(std::span<const TensorMeta> in, const Attrs& a) {
  return infer_pool2d("avg_pool2d", in, a);
}

std::vector<TensorMeta> infer_global_pool2d(const char* op, std::span<const TensorMeta> in, const Attrs& a) {
  detail::require_floating(op, in[0]);
  bool nchw = parse_data_format(op, a);
  const Shape& x = in[0].shape;
  if (x.rank() != 4)
    throw InvalidArgumentError(std::string(op) + ": input must have rank 4 (" + (nchw ? "NCHW" : "NHWC") +
                               "), got shape " + x.str());
  int64_t c = nchw ? x[1] : x[3];
  Shape out = a.get_bool("keepdims", false) ? (nchw ? Shape{x[0], c, 1, 1} : Shape{x[0], 1, 1, c}) : Shape{x[0], c};
  return {{out, in[0].dtype}};
}
std::vector<TensorMeta> infer_global_avg_pool2d(std::span<const TensorMeta> in, const Attrs& a) {
  return infer_global_pool2d("global_avg_pool2d", in, a);
}
std::vector<TensorMeta> infer_global_max_pool2d(std::span<const TensorMeta> in, const Attrs& a) {
  return infer_global_pool2d("global_max_pool2d", in, a);
}

std::vector<AttrSpec> with(std::vector<AttrSpec> base, std::initializer_list<AttrSpec> more) {
  base.insert(base.end(), more);
  return base;
}

KILN_REGISTER_OP(detail::make_def("conv2d", "2-d convolution (cross-correlation), optional bias; NHWC/HWIO or NCHW/OIHW", -1,
                     infer_conv2d, kConvAttrs));
// Graph-only (src/graph/passes/matmul_bias_activation_fusion.cc: activation(conv2d(..));
// conv_pool_fusion.cc: a 2x2 max pool after it, attr max_pool = 2, and with attr
// conv_output a second output, the activation's output before pooling, for a training
// graph whose pool gradient reads it).
std::vector<TensorMeta> infer_fused_conv2d(std::span<const TensorMeta> in, const Attrs& attrs) {
  const std::string act = attrs.get_string("activation", "");
  if (act != "" && act != "relu")
    throw InvalidArgumentError("fused_conv2d: unknown activation '" + act + "' (expected none or relu)");
  std::vector<TensorMeta> out = infer_conv2d(in, attrs);
  const int64_t pool = attrs.get_int("max_pool", 0);
  if (pool == 0) return out;
  if (pool != 2) throw InvalidArgumentError(kiln::detail::str_cat("fused_conv2d: max_pool must be 0 or 2, got ", pool));
  if (attrs.get_string("data_format", "NHWC") != "NHWC")
    throw InvalidArgumentError("fused_conv2d: max_pool needs data_format NHWC");
  const Shape y = out[0].shape;
  if (y[1] < 2 || y[2] < 2)
    throw InvalidArgumentError(kiln::detail::str_cat("fused_conv2d: max_pool 2 needs a convolution output of at least 2x2, got ",
                                       y.str()));
  out[0].shape = Shape{y[0], y[1] / 2, y[2] / 2, y[3]};
  const bool conv_output = attrs.get_bool("conv_output", false), mask = attrs.get_bool("pool_mask", false);
  if (conv_output && mask) throw InvalidArgumentError("fused_conv2d: conv_output and pool_mask exclude each other");
  if ((conv_output || mask) && (y[1] % 2 != 0 || y[2] % 2 != 0))  // (the pool would leave a row or column unread)
    throw InvalidArgumentError(std::string("fused_conv2d: ") + (mask ? "pool_mask" : "conv_output") +
                               " needs an even convolution output, got " + y.str());
  if (conv_output) out.push_back({y, out[0].dtype});
  if (mask) {
    if (out[0].dtype != DType::kF32)
      throw InvalidArgumentError("fused_conv2d: pool_mask is for f32, got " + detail::dtype_str(out[0].dtype));
    out.push_back({out[0].shape, DType::kU8});
  }
  return out;
}
KILN_REGISTER_OP([] {
  std::vector<AttrSpec> attrs = kConvAttrs;
  attrs.push_back({"activation", AttrType::kString, "\"\" or \"relu\""});
  attrs.push_back({"max_pool", AttrType::kInt,
                   "0, or 2: a 2x2 max pool with stride 2 and no padding on the activation's output (NHWC)"});
  attrs.push_back({"conv_output", AttrType::kBool,
                   "with max_pool 2: a second output, the activation's output before pooling, default false"});
  attrs.push_back({"pool_mask", AttrType::kBool,
                   "with max_pool 2 (f32): a second output, u8 of the pooled shape: the window's winning cell 0-3, "
                   "or 4 where the gradient stops (relu: the maximum is not > 0); default false"});
  return detail::make_def("fused_conv2d", "max_pool?(activation(conv2d(x, w, bias?))), made by graph fusion", -1,
                          infer_fused_conv2d, attrs, Differentiable::kNo);
}());
// fused_conv2d_backward_filter(x, y, dp) = conv2d_backward_filter(x, dy) with
// dy = max_pool2d_backward(y, dp) (2x2 window, stride 2, no padding, NHWC), zero where
// y <= 0 with attr relu (y the ReLU'd convolution output the pool read); attr bias_grad
// adds a second output, dy summed per channel. Made by pool_backward_filter_fusion for a
// convolution whose input needs no gradient (a network's first layer): dy is then read
// by the filter gradient only and need not be written whole. Attr pool_mask: input 1 is
// fused_conv2d's pool mask instead of y (conv_pool_fusion; relu is then in the mask).
std::vector<TensorMeta> infer_fused_conv2d_backward_filter(std::span<const TensorMeta> in, const Attrs& a) {
  const char* op = "fused_conv2d_backward_filter";
  if (!a.get_bool("pool_mask", false)) require_conv_dtypes(op, in[0], in[1]);
  require_conv_dtypes(op, in[0], in[2]);
  if (a.get_string("data_format", "NHWC") != "NHWC")
    throw InvalidArgumentError(std::string(op) + ": needs data_format NHWC");
  const Conv2dGeometry g = conv2d_geometry(op, in[0].shape, shape_attr(op, a, "filter_shape"), a);
  const Shape conv = g.output_shape();
  if (conv[1] < 2 || conv[2] < 2)
    throw InvalidArgumentError(std::string(op) + ": a 2x2 max pool needs a convolution output of at least 2x2, got " +
                               conv.str());
  const Shape pooled{conv[0], conv[1] / 2, conv[2] / 2, conv[3]};
  if (a.get_bool("pool_mask", false)) {
    if (in[1].dtype != DType::kU8 || in[1].shape != pooled || conv[1] % 2 != 0 || conv[2] % 2 != 0 ||
        a.get_bool("relu", false))
      throw InvalidArgumentError(std::string(op) + ": with pool_mask, input 1 is the pool's u8 mask " + pooled.str() +
                                 " of an even convolution output (relu folded in), got " +
                                 detail::dtype_str(in[1].dtype) + in[1].shape.str() + " for " + conv.str());
  } else if (in[1].shape != conv) {
    throw InvalidArgumentError(std::string(op) + ": y must have conv2d's output shape " + conv.str() + ", got " +
                               in[1].shape.str());
  }
  if (in[2].shape != pooled)
    throw InvalidArgumentError(std::string(op) + ": dp must have the pool's output shape " + pooled.str() + ", got " +
                               in[2].shape.str());
  std::vector<TensorMeta> out = {{g.filter_shape(), in[0].dtype}};
  if (a.get_bool("bias_grad", false)) out.push_back({Shape{g.o}, in[0].dtype});
  return out;
}
KILN_REGISTER_OP(detail::make_def(
    "fused_conv2d_backward_filter",
    "conv2d_backward_filter(x, relu_grad?(max_pool2d_backward(y, dp), y)) for a 2x2/2 pool, and the bias gradient; "
    "made by graph fusion",
    3, infer_fused_conv2d_backward_filter,
    with(kConvAttrs, {{"filter_shape", AttrType::kInts, "shape of conv2d's filter"},
                      {"relu", AttrType::kBool, "dy is also zero where y <= 0 (y a ReLU output), default false"},
                      {"bias_grad", AttrType::kBool, "second output: dy summed per channel, default false"},
                      {"pool_mask", AttrType::kBool,
                       "input 1 is fused_conv2d's pool mask (u8, pooled shape) instead of y, default false"}}),
    Differentiable::kNo));
KILN_REGISTER_OP(detail::make_def("conv2d_backward_data", "gradient of conv2d w.r.t. its input (transposed convolution)", 2,
                     infer_conv2d_backward_data,
                     with(kConvAttrs, {{"input_shape", AttrType::kInts, "shape of conv2d's input"}})));
KILN_REGISTER_OP(detail::make_def("conv2d_backward_filter", "gradient of conv2d w.r.t. its filter", 2, infer_conv2d_backward_filter,
                     with(kConvAttrs, {{"filter_shape", AttrType::kInts, "shape of conv2d's filter"}})));
KILN_REGISTER_OP(detail::make_def("max_pool2d", "2-d max pooling", 1, infer_max_pool2d, pool_attr_specs()));
KILN_REGISTER_OP(detail::make_def("avg_pool2d", "2-d average pooling (padding excluded from the count)", 1, infer_avg_pool2d,
                     pool_attr_specs()));
KILN_REGISTER_OP(detail::make_def("global_avg_pool2d", "mean over H and W", 1, infer_global_avg_pool2d,
                     {{"data_format", AttrType::kString, "\"NHWC\" or \"NCHW\""},
                      {"keepdims", AttrType::kBool, "keep H and W as size-1 dims"}}));
KILN_REGISTER_OP(detail::make_def("global_max_pool2d", "max over H and W", 1, infer_global_max_pool2d,
                     {{"data_format", AttrType::kString, "\"NHWC\" or \"NCHW\""},
                      {"keepdims", AttrType::kBool, "keep H and W as size-1 dims"}}));

Attrs conv_attrs(const Conv2dOptions& o) {
  Attrs a{{"strides", o.strides},
          {"dilations", o.dilations},
          {"groups", o.groups},
          {"data_format", o.data_format}};
  set_padding(a, o.padding);
  return a;
}

// Promotes two conv operands to one floating dtype.
std::pair<Tensor, Tensor> promote_pair(const char* op, const char* na, const Tensor& a, const char* nb,
                                       const Tensor& b) {
  require_defined(op, na, a);
  require_defined(op, nb, b);
  DType t = promote_types(a.dtype(), b.dtype());
  if (!is_floating(t)) t = DType::kF32;
  return {cast(a, t), cast(b, t)};
}

Tensor pool(const OpDef& op, const char* name, const Tensor& x, const std::vector<int64_t>& ksize,
            const std::vector<int64_t>& strides, const Padding& padding, const std::string& data_format) {
  require_defined(name, "input", x);
  return call1(op, {as_floating(x)}, pool_attrs(ksize, strides, padding, data_format));
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& opts, const Tensor& bias) {
  auto [xx, ww] = promote_pair("conv2d", "input", x, "filter", w);
  if (bias.defined()) return call1(KILN_OP("conv2d"), {xx, ww, param_for(bias, xx.dtype())}, conv_attrs(opts));
  return call1(KILN_OP("conv2d"), {xx, ww}, conv_attrs(opts));
}

Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& input_shape, const Conv2dOptions& opts) {
  auto [d, ww] = promote_pair("conv2d_backward_data", "dy", dy, "filter", w);
  Attrs a = conv_attrs(opts);
  a.set("input_shape", input_shape.vec());
  return call1(KILN_OP("conv2d_backward_data"), {d, ww}, a);
}

Tensor conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& filter_shape,
                              const Conv2dOptions& opts) {
  auto [xx, d] = promote_pair("conv2d_backward_filter", "input", x, "dy", dy);
  Attrs a = conv_attrs(opts);
  a.set("filter_shape", filter_shape.vec());
  return call1(KILN_OP("conv2d_backward_filter"), {xx, d}, a);
}

Tensor max_pool2d(const Tensor& x, const std::vector<int64_t>& ksize, const std::vector<int64_t>& strides,
                  const Padding& padding, const std::string& data_format) {
  return pool(KILN_OP("max_pool2d"), "max_pool2d", x, ksize, strides, padding, data_format);
}

Tensor avg_pool2d(const Tensor& x, const std::vector<int64_t>& ksize, const std::vector<int64_t>& strides,
                  const Padding& padding, const std::string& data_format) {
  return pool(KILN_OP("avg_pool2d"), "avg_pool2d", x, ksize, strides, padding, data_format);
}

Tensor global_avg_pool2d(const Tensor& x, const std::string& data_format, bool keepdims) {
  require_defined("global_avg_pool2d", "input", x);
  return call1(KILN_OP("global_avg_pool2d"), {as_floating(x)}, {{"data_format", data_format}, {"keepdims", keepdims}});
}

Tensor global_max_pool2d(const Tensor& x, const std::string& data_format, bool keepdims) {
  require_defined("global_max_pool2d", "input", x);
  return call1(KILN_OP("global_max_pool2d"), {as_floating(x)}, {{"data_format", data_format}, {"keepdims", keepdims}});
}

}  // namespace kiln::ops
