// LossScaleOptimizer: dynamic loss scaling as TensorFlow defines it
// (tf.keras.mixed_precision.LossScaleOptimizer / _DynamicLossScaleState).
#include <cmath>

#include "kiln/core/error.h"
#include "kiln/ops.h"
#include "kiln/train/optimizers.h"

namespace kiln::train {
namespace {
using kiln::detail::str_cat;

// 0 when every element is finite; NaN otherwise (inf * 0 and NaN * 0 are NaN).
bool all_finite(const Tensor& g) {
  return std::isfinite(ops::sum(ops::mul(g, ops::scalar(0.0, g.dtype()))).item<double>());
}
}  // namespace

LossScaleOptimizer::LossScaleOptimizer(OptimizerPtr inner, double initial_scale, int64_t dynamic_growth_steps)
    : Optimizer(OptimizerOptions{}), inner_(std::move(inner)), growth_steps_(dynamic_growth_steps) {
  if (!inner_) throw InvalidArgumentError("LossScaleOptimizer: the inner optimizer is null");
  if (dynamic_cast<LossScaleOptimizer*>(inner_.get()))
    throw InvalidArgumentError("LossScaleOptimizer: the inner optimizer already scales the loss");
  if (!(std::isfinite(initial_scale) && initial_scale > 0))
    throw InvalidArgumentError(str_cat("LossScaleOptimizer: initial_scale must be finite and > 0, got ", initial_scale));
  if (dynamic_growth_steps < 1)
    throw InvalidArgumentError(
        str_cat("LossScaleOptimizer: dynamic_growth_steps must be >= 1, got ", dynamic_growth_steps));
  scale_ = Variable(Tensor::scalar<float>(static_cast<float>(initial_scale)), name() + "/loss_scale", false);
  good_steps_ = Variable(Tensor::scalar<int64_t>(0), name() + "/good_steps", false);
}

double LossScaleOptimizer::loss_scale() const { return scale_.peek().item<double>(); }
int64_t LossScaleOptimizer::good_steps() const { return good_steps_.peek().item<int64_t>(); }

Tensor LossScaleOptimizer::scale_loss(const Tensor& loss) const {
  return ops::mul(loss, ops::scalar(loss_scale(), loss.dtype()));
}

std::vector<Variable> LossScaleOptimizer::variables() const {
  std::vector<Variable> out = inner_->variables();
  out.push_back(scale_);
  out.push_back(good_steps_);
  return out;
}

void LossScaleOptimizer::apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  if (grads.size() != vars.size())
    throw InvalidArgumentError(
        str_cat(name(), ".apply_gradients: got ", grads.size(), " gradients for ", vars.size(), " variables"));
  const double scale = loss_scale();
  std::vector<Tensor> unscaled(grads.size());
  bool finite = true;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    unscaled[i] = ops::mul(grads[i], ops::scalar(1.0 / scale, grads[i].dtype()));
    finite = finite && all_finite(unscaled[i]);
  }
  if (finite) {
    inner_->apply_gradients(unscaled, vars);  // validates shapes and dtypes first
    int64_t good = good_steps() + 1;
    double next = scale;
    if (good >= growth_steps_) {
      // TF: the doubled scale is kept only if finite; the counter restarts either way.
      if (std::isfinite(static_cast<float>(scale * 2))) next = scale * 2;
      good = 0;
    }
    scale_.assign(Tensor::scalar<float>(static_cast<float>(next)));
    good_steps_.assign(Tensor::scalar<int64_t>(good));
    return;
  }
  // Skip the update; the step is still counted (TF increments iterations either way).
  inner_->build(vars);
  const Variable& it = inner_->iterations_variable();
  it.assign(Tensor::scalar<int64_t>(it.peek().item<int64_t>() + 1));
  scale_.assign(Tensor::scalar<float>(static_cast<float>(std::max(scale / 2, 1.0))));
  good_steps_.assign(Tensor::scalar<int64_t>(0));
  ++skipped_;
}

}  // namespace kiln::train
