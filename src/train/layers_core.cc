// Core layers: Dense, Activation, Flatten, Reshape, and activations by name.
#include <functional>
#include <map>

#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "layer_util.h"

namespace kiln::train {

namespace {
using ActivationFn = std::function<Tensor(const Tensor&)>;

const std::map<std::string, ActivationFn>& activation_table() {
  static const std::map<std::string, ActivationFn> table = {
      {"linear", [](const Tensor& x) { return x; }},
      {"relu", [](const Tensor& x) { return ops::relu(x); }},
      {"relu6", [](const Tensor& x) { return ops::relu6(x); }},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }},
      {"softmax", [](const Tensor& x) { return ops::softmax(x, -1); }},
      {"log_softmax", [](const Tensor& x) { return ops::log_softmax(x, -1); }},
      // Keras 3 defaults: exact (erf) gelu, leaky_relu negative_slope 0.2, elu alpha 1.
      {"gelu", [](const Tensor& x) { return ops::gelu(x, /*approximate=*/false); }},
      {"silu", [](const Tensor& x) { return ops::silu(x); }},
      {"swish", [](const Tensor& x) { return ops::silu(x); }},
      {"elu", [](const Tensor& x) { return ops::elu(x, 1.0); }},
      {"leaky_relu", [](const Tensor& x) { return ops::leaky_relu(x, 0.2); }},
      {"softplus", [](const Tensor& x) { return ops::softplus(x); }},
  };
  return table;
}

const ActivationFn& find_activation(const std::string& name) {
  const auto& table = activation_table();
  auto it = table.find(name.empty() ? std::string("linear") : name);
  if (it == table.end()) {
    std::string known;
    for (const auto& [k, v] : table) known += (known.empty() ? "" : ", ") + k;
    throw InvalidArgumentError("unknown activation '" + name + "'; known: " + known + " (\"\" is linear)");
  }
  return it->second;
}
}  // namespace

namespace detail {
void check_activation(const std::string& name) { (void)find_activation(name); }
}  // namespace detail

namespace layers {

Tensor activation(const std::string& name, const Tensor& x) { return find_activation(name)(x); }

namespace {

using detail::layer_error;

// ---- Dense -------------------------------------------------------------------------

class DenseLayer final : public UnaryLayer {
 public:
  DenseLayer(int64_t units, DenseOptions opts, std::string name)
      : UnaryLayer(std::move(name)), units_(units), opts_(std::move(opts)) {
    KILN_CHECK_ARG(units > 0, "Dense: units must be positive, got ", units);
    detail::check_activation(opts_.activation);
  }
  std::string type() const override { return "Dense"; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    const Shape& s = shapes[0];
    if (s.rank() < 2) layer_error(*this, "expects an input of rank >= 2 ([batch, ..., features]), got shape ", s.str());
    in_ = s[s.rank() - 1];
    kernel_ = add_weight("kernel", {in_, units_}, opts_.kernel_initializer, true, opts_.kernel_regularizer);
    if (opts_.use_bias) bias_ = add_weight("bias", {units_}, opts_.bias_initializer, true, opts_.bias_regularizer);
  }

  Tensor forward(const Tensor& x, bool) override {
    const int r = x.rank();
    if (r < 2 || x.dim(r - 1) != in_)
      layer_error(*this, "was built for inputs [..., ", in_, "] (rank >= 2), got ", x.desc());
    Tensor y;
    if (r == 2) {
      y = ops::matmul(x, kernel_.value());
    } else {
      // Acts on the last axis: one 2-D matmul over the flattened leading dims.
      std::vector<int64_t> out = x.shape().vec();
      out.back() = units_;
      y = ops::reshape(ops::matmul(ops::reshape(x, {-1, in_}), kernel_.value()), out);
    }
    if (bias_.defined()) y = ops::add(y, bias_.value());
    return activation(opts_.activation, y);
  }

 private:
  int64_t units_;
  DenseOptions opts_;
  int64_t in_ = 0;
  Variable kernel_, bias_;
};

// ---- Activation ---------------------------------------------------------------------

class ActivationLayer final : public UnaryLayer {
 public:
  ActivationLayer(std::string act, std::string name) : UnaryLayer(std::move(name)), act_(std::move(act)) {
    detail::check_activation(act_);
  }
  std::string type() const override { return "Activation"; }

 protected:
  Tensor forward(const Tensor& x, bool) override { return activation(act_, x); }

 private:
  std::string act_;
};

// ---- Flatten ------------------------------------------------------------------------

class FlattenLayer final : public UnaryLayer {
 public:
  using UnaryLayer::UnaryLayer;
  std::string type() const override { return "Flatten"; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    if (shapes[0].rank() < 1) layer_error(*this, "expects an input with a batch dimension, got a scalar");
    rank_ = shapes[0].rank();
  }
  Tensor forward(const Tensor& x, bool) override {
    if (x.rank() != rank_) layer_error(*this, "was built for inputs of rank ", rank_, ", got ", x.desc());
    int64_t features = 1;
    for (int i = 1; i < x.rank(); ++i) features *= x.dim(i);
    // -1 for the batch: a traced graph (kiln::function, exported packages) then runs at
    // any batch size. Zero-size samples cannot infer it.
    return ops::reshape(x, {features > 0 ? -1 : x.dim(0), features});
  }

 private:
  int rank_ = 0;
};

// ---- Reshape ------------------------------------------------------------------------

class ReshapeLayer final : public UnaryLayer {
 public:
  ReshapeLayer(std::vector<int64_t> target, std::string name)
      : UnaryLayer(std::move(name)), target_(std::move(target)) {
    KILN_CHECK_ARG(static_cast<int>(target_.size()) < Shape::kMaxRank, "Reshape: target shape has too many dims (",
                   target_.size(), ")");
    int unknown = 0;
    for (int64_t d : target_) {
      KILN_CHECK_ARG(d >= -1, "Reshape: target shape entries must be >= 0 or -1, got ", d);
      unknown += d == -1;
    }
    KILN_CHECK_ARG(unknown <= 1, "Reshape: at most one target dimension may be -1");
  }
  std::string type() const override { return "Reshape"; }

 protected:
  Tensor forward(const Tensor& x, bool) override {
    if (x.rank() < 1) layer_error(*this, "expects an input with a batch dimension, got a scalar");
    const int64_t batch = x.dim(0);
    int64_t per_sample = 1, known = 1;
    for (int i = 1; i < x.rank(); ++i) per_sample *= x.dim(i);
    std::vector<int64_t> out{per_sample > 0 ? -1 : batch};  // -1: batch-agnostic traces (as Flatten)
    int unknown_at = -1;
    for (size_t i = 0; i < target_.size(); ++i) {
      if (target_[i] == -1) {
        unknown_at = static_cast<int>(out.size());
      } else {
        known *= target_[i];
      }
      out.push_back(target_[i]);
    }
    if (unknown_at >= 0) {
      if (known == 0 || per_sample % known != 0)
        layer_error(*this, "cannot reshape samples of ", per_sample, " elements (input ", x.desc(), ") to ",
                    detail::dims_str(target_));
      out[static_cast<size_t>(unknown_at)] = per_sample / known;
    } else if (known != per_sample) {
      layer_error(*this, "cannot reshape samples of ", per_sample, " elements (input ", x.desc(), ") to ",
                  detail::dims_str(target_), " (", known, " elements)");
    }
    return ops::reshape(x, out);
  }

 private:
  std::vector<int64_t> target_;
};

}  // namespace

LayerPtr Dense(int64_t units, DenseOptions opts, std::string name) {
  return std::make_shared<DenseLayer>(units, std::move(opts), std::move(name));
}
LayerPtr Dense(int64_t units, const std::string& activation, std::string name) {
  DenseOptions opts;
  opts.activation = activation;
  return Dense(units, std::move(opts), std::move(name));
}
LayerPtr Activation(std::string activation, std::string name) {
  return std::make_shared<ActivationLayer>(std::move(activation), std::move(name));
}
LayerPtr Flatten(std::string name) { return std::make_shared<FlattenLayer>(std::move(name)); }
LayerPtr Reshape(std::vector<int64_t> target_shape, std::string name) {
  return std::make_shared<ReshapeLayer>(std::move(target_shape), std::move(name));
}

}  // namespace layers
}  // namespace kiln::train
