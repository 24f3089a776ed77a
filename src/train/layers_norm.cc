// Normalisation and regularisation layers: BatchNormalization,
// LayerNormalization, Dropout.
#include <cmath>

#include "kiln/core/random.h"
#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "layer_util.h"

namespace kiln::train::layers {

namespace {

using detail::layer_error;

// ---- BatchNormalization -------------------------------------------------------------

class BatchNormLayer final : public UnaryLayer {
 public:
  BatchNormLayer(BatchNormOptions opts, std::string name) : UnaryLayer(std::move(name)), opts_(opts) {
    computes_in_variable_dtype_ = true;  // batch statistics in f32 under mixed precision
    KILN_CHECK_ARG(opts.momentum >= 0 && opts.momentum <= 1, "BatchNormalization: momentum must be in [0, 1], got ",
                   opts.momentum);
    KILN_CHECK_ARG(opts.epsilon >= 0, "BatchNormalization: epsilon must be >= 0, got ", opts.epsilon);
  }
  std::string type() const override { return "BatchNormalization"; }
  bool syncs_replicas() const override { return opts_.synchronized; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    const Shape& s = shapes[0];
    if (s.rank() < 2) layer_error(*this, "expects an input of rank >= 2 ([batch, ..., channels]), got shape ", s.str());
    axis_ = detail::normalize_axis(*this, opts_.axis, s.rank());
    if (axis_ == 0) layer_error(*this, "cannot normalise along the batch axis (axis ", opts_.axis, ")");
    rank_ = s.rank();
    channels_ = s[axis_];
    const Shape c{channels_};
    if (opts_.scale) gamma_ = add_weight("gamma", c, initializers::ones());
    if (opts_.center) beta_ = add_weight("beta", c, initializers::zeros());
    moving_mean_ = add_weight("moving_mean", c, initializers::zeros(),
                              /*trainable=*/false);
    moving_var_ = add_weight("moving_variance", c, initializers::ones(),
                             /*trainable=*/false);
  }

  Tensor forward(const Tensor& x, bool training) override {
    if (x.rank() != rank_ || x.dim(axis_) != channels_)
      layer_error(*this, "was built for inputs of rank ", rank_, " with ", channels_, " channels on axis ", axis_,
                  ", got ", x.desc());
    const Tensor gamma = gamma_.defined() ? gamma_.value() : Tensor();
    const Tensor beta = beta_.defined() ? beta_.value() : Tensor();
    // A frozen BatchNormalization runs in inference mode (Keras >= 2.1
    // behaviour), so fine-tuning does not disturb the statistics it was trained with.
    if (!training || !trainable())
      return ops::batch_norm_inference(x, moving_mean_.value(), moving_var_.value(), gamma, beta, opts_.epsilon, axis_);
    ops::BatchNormTrainingResult r =
        opts_.synchronized ? synchronized_training(x, gamma, beta) : ops::batch_norm_training(x, gamma, beta, opts_.epsilon, axis_);
    // The moving-average update is a side effect, not part of the loss: cut from the
    // tape (an op, so a traced step computes it from each batch).
    update(moving_mean_, ops::stop_gradient(r.mean));
    update(moving_var_, ops::stop_gradient(r.var));
    return r.y;
  }

 private:
  // The global batch's statistics: the sum and row count over every replica give the
  // mean, then the squared deviations from it summed over every replica the (biased)
  // variance; y from them by batch_norm_inference, whose gradient reaches x through both.
  ops::BatchNormTrainingResult synchronized_training(const Tensor& x, const Tensor& gamma, const Tensor& beta) const {
    std::vector<int64_t> others, stat_shape(static_cast<size_t>(rank_), 1);
    for (int d = 0; d < rank_; ++d)
      if (d != axis_) others.push_back(d);
    stat_shape[static_cast<size_t>(axis_)] = channels_;
    const Tensor count =
        ops::reshape(ops::scalar(static_cast<double>(x.numel() / channels_), x.dtype()), {1});
    const Tensor sums = ops::cross_replica_sum(ops::concat({ops::sum(x, others), count}, 0));  // [C + 1]
    const Tensor n = ops::slice(sums, {channels_}, {1});
    const Tensor mean = ops::div(ops::slice(sums, {0}, {channels_}), n);
    const Tensor dev = ops::sub(x, ops::reshape(mean, stat_shape));
    const Tensor var = ops::div(ops::cross_replica_sum(ops::sum(ops::square(dev), others)), n);
    return {ops::batch_norm_inference(x, mean, var, gamma, beta, opts_.epsilon, axis_), mean, var};
  }

  void update(const Variable& moving, const Tensor& batch) const {
    const Tensor& old = moving.peek();
    const double m = opts_.momentum;
    moving.assign(ops::cast(ops::add(old * m, ops::cast(batch, old.dtype()) * (1 - m)), old.dtype()));
  }

  BatchNormOptions opts_;
  int axis_ = -1, rank_ = 0;
  int64_t channels_ = 0;
  Variable gamma_, beta_, moving_mean_, moving_var_;
};

// ---- LayerNormalization -------------------------------------------------------------

class LayerNormLayer final : public UnaryLayer {
 public:
  LayerNormLayer(double eps, int64_t axis, std::string name) : UnaryLayer(std::move(name)), eps_(eps), axis_(axis) {
    KILN_CHECK_ARG(eps >= 0, "LayerNormalization: epsilon must be >= 0, got ", eps);
    computes_in_variable_dtype_ = true;  // statistics in f32 under mixed precision
  }
  std::string type() const override { return "LayerNormalization"; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    const Shape& s = shapes[0];
    if (s.rank() < 2) layer_error(*this, "expects an input of rank >= 2 ([batch, ..., features]), got shape ", s.str());
    begin_ = detail::normalize_axis(*this, axis_, s.rank());
    if (begin_ == 0) layer_error(*this, "cannot normalise over the batch axis (axis ", axis_, ")");
    rank_ = s.rank();
    Shape params;
    for (int i = begin_; i < s.rank(); ++i) params.push_back(s[i]);
    params_ = params;
    gamma_ = add_weight("gamma", params, initializers::ones());
    beta_ = add_weight("beta", params, initializers::zeros());
  }

  Tensor forward(const Tensor& x, bool) override {
    bool ok = x.rank() == rank_;
    for (int i = begin_; ok && i < rank_; ++i) ok = x.dim(i) == params_[i - begin_];
    if (!ok)
      layer_error(*this, "was built for inputs of rank ", rank_, " ending in ", params_.str(), ", got ", x.desc());
    return ops::layer_norm(x, gamma_.value(), beta_.value(), eps_, begin_);
  }

 private:
  double eps_;
  int64_t axis_;
  int begin_ = -1, rank_ = 0;
  Shape params_;
  Variable gamma_, beta_;
};

// ---- Dropout ------------------------------------------------------------------------

uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class DropoutLayer final : public UnaryLayer {
 public:
  DropoutLayer(double rate, std::optional<uint64_t> seed, std::string name)
      : UnaryLayer(std::move(name)), rate_(rate), seed_(seed) {
    KILN_CHECK_ARG(rate >= 0 && rate < 1, "Dropout: rate must be in [0, 1), got ", rate);
  }
  std::string type() const override { return "Dropout"; }

 protected:
  Tensor forward(const Tensor& x, bool training) override {
    if (!training || rate_ == 0) return x;
    return ops::dropout(x, rate_, next_seed(), true);
  }

 private:
  // A fresh mask per call: from the layer's seed and a call counter, or else
  // drawn from the default generator (so kiln::set_seed makes the sequence reproducible).
  uint64_t next_seed() {
    if (seed_) return mix64(*seed_ ^ mix64(++calls_));
    return kiln::draw_seed();
  }

  double rate_;
  std::optional<uint64_t> seed_;
  uint64_t calls_ = 0;
};

}  // namespace

LayerPtr BatchNormalization(BatchNormOptions opts, std::string name) {
  return std::make_shared<BatchNormLayer>(opts, std::move(name));
}
LayerPtr LayerNormalization(double epsilon, int64_t axis, std::string name) {
  return std::make_shared<LayerNormLayer>(epsilon, axis, std::move(name));
}
LayerPtr Dropout(double rate, std::optional<uint64_t> seed, std::string name) {
  return std::make_shared<DropoutLayer>(rate, seed, std::move(name));
}

}  // namespace kiln::train::layers
