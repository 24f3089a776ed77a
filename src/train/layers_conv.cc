// Convolution and pooling layers (NHWC).
#include <algorithm>
#include <cctype>

#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "layer_util.h"

namespace kiln::train::layers {

namespace {

using detail::layer_error;

std::string padding_arg(const std::string& what, std::string p) {
  std::transform(p.begin(), p.end(), p.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  KILN_CHECK_ARG(p == "valid" || p == "same", what, ": padding must be \"valid\" or \"same\", got \"", p, "\"");
  return p;
}

// Rank-4 NHWC input with the channel count the layer was built for.
void check_nhwc(const Layer& layer, const Tensor& x, int64_t channels) {
  if (x.rank() != 4 || x.dim(3) != channels)
    layer_error(layer, "was built for NHWC inputs [batch, height, width, ", channels, "], got ", x.desc());
}

void check_nhwc_build(const Layer& layer, const Shape& s) {
  if (s.rank() != 4) layer_error(layer, "expects NHWC inputs [batch, height, width, channels], got shape ", s.str());
}

// ---- Conv2D -------------------------------------------------------------------------

class Conv2DLayer final : public UnaryLayer {
 public:
  Conv2DLayer(int64_t filters, std::vector<int64_t> kernel_size, Conv2DOptions opts, std::string name)
      : UnaryLayer(std::move(name)), filters_(filters), opts_(std::move(opts)) {
    KILN_CHECK_ARG(filters > 0, "Conv2D: filters must be positive, got ", filters);
    kernel_size_ = detail::pair_arg("Conv2D: kernel_size", kernel_size);
    conv_.strides = detail::pair_arg("Conv2D: strides", opts_.strides);
    conv_.dilations = detail::pair_arg("Conv2D: dilation_rate", opts_.dilation_rate);
    conv_.padding = padding_arg("Conv2D", opts_.padding);
    KILN_CHECK_ARG(opts_.groups >= 1 && filters % opts_.groups == 0, "Conv2D: groups (", opts_.groups,
                   ") must be >= 1 and divide filters (", filters, ")");
    conv_.groups = opts_.groups;
    conv_.data_format = "NHWC";
    detail::check_activation(opts_.activation);
  }
  std::string type() const override { return "Conv2D"; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    check_nhwc_build(*this, shapes[0]);
    channels_ = shapes[0][3];
    if (channels_ % opts_.groups != 0)
      layer_error(*this, "input channels (", channels_, ") must divide by groups (", opts_.groups, ")");
    kernel_ = add_weight("kernel", {kernel_size_[0], kernel_size_[1], channels_ / opts_.groups, filters_},
                         opts_.kernel_initializer, true, opts_.kernel_regularizer);
    if (opts_.use_bias) bias_ = add_weight("bias", {filters_}, opts_.bias_initializer);
  }

  Tensor forward(const Tensor& x, bool) override {
    check_nhwc(*this, x, channels_);
    // conv2d adds the bias in the same kernel (oneDNN post-op).
    Tensor y = ops::conv2d(x, kernel_.value(), conv_, bias_.defined() ? bias_.value() : Tensor());
    return activation(opts_.activation, y);
  }

 private:
  int64_t filters_;
  Conv2DOptions opts_;
  std::vector<int64_t> kernel_size_;
  ops::Conv2dOptions conv_;
  int64_t channels_ = 0;
  Variable kernel_, bias_;
};

// ---- pooling ------------------------------------------------------------------------

class Pool2DLayer final : public UnaryLayer {
 public:
  Pool2DLayer(bool max, std::vector<int64_t> pool, std::vector<int64_t> strides, std::string padding, std::string name)
      : UnaryLayer(std::move(name)), max_(max) {
    const std::string what = max ? "MaxPool2D" : "AveragePool2D";
    pool_ = detail::pair_arg(what + ": pool_size", pool);
    strides_ = strides.empty() ? pool_ : detail::pair_arg(what + ": strides", strides);
    padding_ = padding_arg(what, std::move(padding));
  }
  std::string type() const override { return max_ ? "MaxPooling2D" : "AveragePooling2D"; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    check_nhwc_build(*this, shapes[0]);
    channels_ = shapes[0][3];
  }
  Tensor forward(const Tensor& x, bool) override {
    check_nhwc(*this, x, channels_);
    return max_ ? ops::max_pool2d(x, pool_, strides_, padding_, "NHWC")
                : ops::avg_pool2d(x, pool_, strides_, padding_, "NHWC");
  }

 private:
  bool max_;
  std::vector<int64_t> pool_, strides_;
  std::string padding_;
  int64_t channels_ = 0;
};

class GlobalPool2DLayer final : public UnaryLayer {
 public:
  GlobalPool2DLayer(bool max, std::string name) : UnaryLayer(std::move(name)), max_(max) {}
  std::string type() const override { return max_ ? "GlobalMaxPooling2D" : "GlobalAveragePooling2D"; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    check_nhwc_build(*this, shapes[0]);
    channels_ = shapes[0][3];
  }
  Tensor forward(const Tensor& x, bool) override {
    check_nhwc(*this, x, channels_);
    return max_ ? ops::global_max_pool2d(x, "NHWC") : ops::global_avg_pool2d(x, "NHWC");
  }

 private:
  bool max_;
  int64_t channels_ = 0;
};

}  // namespace

LayerPtr Conv2D(int64_t filters, std::vector<int64_t> kernel_size, Conv2DOptions opts, std::string name) {
  return std::make_shared<Conv2DLayer>(filters, std::move(kernel_size), std::move(opts), std::move(name));
}
LayerPtr MaxPool2D(std::vector<int64_t> pool_size, std::vector<int64_t> strides, std::string padding,
                   std::string name) {
  return std::make_shared<Pool2DLayer>(true, std::move(pool_size), std::move(strides), std::move(padding),
                                       std::move(name));
}
LayerPtr AveragePool2D(std::vector<int64_t> pool_size, std::vector<int64_t> strides, std::string padding,
                       std::string name) {
  return std::make_shared<Pool2DLayer>(false, std::move(pool_size), std::move(strides), std::move(padding),
                                       std::move(name));
}
LayerPtr GlobalAveragePool2D(std::string name) { return std::make_shared<GlobalPool2DLayer>(false, std::move(name)); }
LayerPtr GlobalMaxPool2D(std::string name) { return std::make_shared<GlobalPool2DLayer>(true, std::move(name)); }

}  // namespace kiln::train::layers
