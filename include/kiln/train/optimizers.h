#pragma once
// Optimizers (keras.optimizers). State lives in Variables ("iterations" and one slot
// per trainable variable, named "<optimizer>/<variable name>/<slot>") so checkpoints
// save and restore it with the model's weights. Updates are fused ops
// (ops/optim.h), one per variable per step.
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/autodiff/variable.h"
#include "kiln/train/schedules.h"

namespace kiln::train {

struct OptimizerOptions {
  std::variant<double, SchedulePtr> learning_rate = 1e-3;
  double clipnorm = 0;         // > 0: clip each gradient to this L2 norm
  double global_clipnorm = 0;  // > 0: scale all gradients so their global norm is at most this
  double weight_decay = 0;     // decoupled (AdamW-style) for every optimizer that supports it
};

class Optimizer {
 public:
  explicit Optimizer(OptimizerOptions opts);
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;

  // One update of every variable from its gradient (undefined gradients are skipped).
  // Throws InvalidArgumentError when a gradient's shape or dtype differs from its
  // variable's, or the lists' lengths differ.
  virtual void apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);
  // The loss the gradients are taken of: `loss` itself, or scaled (LossScaleOptimizer).
  virtual Tensor scale_loss(const Tensor& loss) const { return loss; }

  // For a training step traced by kiln::function (Model::fit's default): as
  // apply_gradients, but the learning rate and the 1-based step come from `hyper` (f64
  // [2]: lr, step) and `iterations` is assigned `step` (i64 scalar), both arguments of
  // the traced function fed on every call (step_inputs()), so the trace fixes nothing
  // that changes from step to step (schedules, LearningRateScheduler, Adam's bias
  // correction). Throws FailedPreconditionError when !traceable().
  void apply_gradients_traced(const std::vector<Tensor>& grads, const std::vector<Variable>& vars,
                              const Tensor& hyper, const Tensor& step);
  // The (hyper, step) tensors for the next step: (learning_rate(), iterations() + 1).
  std::pair<Tensor, Tensor> step_inputs() const;
  // Whether an update can be traced: false where it decides on the host (clipnorm and
  // global_clipnorm read gradient norms; LossScaleOptimizer skips steps on overflow).
  virtual bool traceable() const { return opts_.clipnorm == 0 && opts_.global_clipnorm == 0; }

  // Creates the slots for `vars` (apply_gradients does it on first use); call before
  // restoring a checkpoint so the slots exist.
  virtual void build(const std::vector<Variable>& vars);
  // "iterations" and every slot, in a stable order.
  virtual std::vector<Variable> variables() const;
  virtual int64_t iterations() const;
  // The learning rate the next step will use.
  virtual double learning_rate() const;
  // Replaces the learning rate (LearningRateScheduler uses this); drops a schedule.
  virtual void set_learning_rate(double lr);
  // The slots of `var` in slot_names() order (empty before build, or for a variable
  // this optimizer does not update).
  virtual std::vector<Variable> slots(const Variable& var) const {
    auto it = slots_.find(var.uid());
    return it == slots_.end() ? std::vector<Variable>{} : it->second;
  }
  virtual const Variable& iterations_variable() const { return iterations_; }
  // Optimizer-wide state beyond iterations and slots (none here; LossScaleOptimizer:
  // its loss scale and step counter). Model checkpoints save it as
  // "optimizer/<last component of the variable name>".
  virtual std::vector<Variable> state_variables() const { return {}; }

 protected:
  // Slots per variable (e.g. {"m", "v"}).
  virtual std::vector<std::string> slot_names() const = 0;
  // Updates var (and slots) from grad at learning rate lr; step is 1-based. When
  // hyper_ is defined (a traced step), the update op takes it as its (lr, step) input.
  virtual void update(const Variable& var, const Tensor& grad, std::vector<Variable>& slots, double lr,
                      int64_t step) = 0;
  // Whether an eager update may write over the values of var and its slots (the update
  // ops' in_place): Variable::value_is_exclusive() for each. Otherwise the update makes
  // new tensors and what others hold keeps the old values (TensorFlow's copy-on-write
  // for variables). False in a traced step: the graph executor decides.
  bool can_update_in_place(const Variable& var, const std::vector<Variable>& slots) const;
  OptimizerOptions opts_;
  Tensor hyper_;

 private:
  void apply(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, const Tensor& hyper,
             const Tensor& step);
  Variable iterations_;
  // The variables that have slots, in build order. Holding them keeps their uid()
  // (an address) from being reused by a new variable while the slots exist.
  std::vector<Variable> order_;
  std::unordered_map<uintptr_t, std::vector<Variable>> slots_;
};
using OptimizerPtr = std::shared_ptr<Optimizer>;

// Dynamic loss scaling for mixed precision (tf.keras.mixed_precision.LossScaleOptimizer),
// wrapping another optimizer. The training step multiplies the loss by loss_scale()
// (scale_loss) so small f16 gradients do not flush to zero; apply_gradients divides the
// gradients by the scale, then:
//   - all finite: the inner optimizer applies them; after `dynamic_growth_steps`
//     consecutive finite steps the scale doubles (if the result is finite);
//   - any inf or NaN: the step is skipped (weights and slots unchanged, iterations
//     still counted, as TensorFlow does) and the scale halves, never below 1.
// Learning rate, iterations and slots are the inner optimizer's. Model::compile wraps
// the optimizer in one automatically when the model's policy is mixed_float16.
class LossScaleOptimizer final : public Optimizer {
 public:
  // Throws InvalidArgumentError for a null or loss-scaling inner optimizer, an initial
  // scale that is not finite and > 0, or growth steps < 1.
  explicit LossScaleOptimizer(OptimizerPtr inner, double initial_scale = 32768.0,
                              int64_t dynamic_growth_steps = 2000);
  std::string name() const override { return "loss_scale_optimizer"; }
  void apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) override;
  Tensor scale_loss(const Tensor& loss) const override;
  void build(const std::vector<Variable>& vars) override { inner_->build(vars); }
  std::vector<Variable> variables() const override;
  int64_t iterations() const override { return inner_->iterations(); }
  double learning_rate() const override { return inner_->learning_rate(); }
  void set_learning_rate(double lr) override { inner_->set_learning_rate(lr); }
  std::vector<Variable> slots(const Variable& var) const override { return inner_->slots(var); }
  const Variable& iterations_variable() const override { return inner_->iterations_variable(); }
  std::vector<Variable> state_variables() const override { return {scale_, good_steps_}; }
  bool traceable() const override { return false; }

  double loss_scale() const;
  // Consecutive finite steps since the scale last changed.
  int64_t good_steps() const;
  int64_t dynamic_growth_steps() const { return growth_steps_; }
  // Steps skipped for non-finite gradients by this object (not checkpointed).
  int64_t skipped_steps() const { return skipped_; }
  const OptimizerPtr& inner() const { return inner_; }

 protected:
  std::vector<std::string> slot_names() const override { return {}; }
  void update(const Variable&, const Tensor&, std::vector<Variable>&, double, int64_t) override {}

 private:
  OptimizerPtr inner_;
  int64_t growth_steps_;
  Variable scale_;       // f32 scalar
  Variable good_steps_;  // i64 scalar
  int64_t skipped_ = 0;
};

// Scales grads in place so their global L2 norm is at most clip_norm; returns the
// norm before clipping.
double clip_by_global_norm(std::vector<Tensor>& grads, double clip_norm);

namespace optimizers {
OptimizerPtr SGD(OptimizerOptions opts = {0.01}, double momentum = 0, bool nesterov = false);
OptimizerPtr Adam(OptimizerOptions opts = {}, double beta_1 = 0.9, double beta_2 = 0.999, double epsilon = 1e-7);
// Adam with decoupled weight decay (default 0.004 like Keras when opts.weight_decay is 0).
OptimizerPtr AdamW(OptimizerOptions opts = {}, double beta_1 = 0.9, double beta_2 = 0.999, double epsilon = 1e-7);
OptimizerPtr RMSprop(OptimizerOptions opts = {}, double rho = 0.9, double momentum = 0, double epsilon = 1e-7,
                     bool centered = false);
// By name with default settings and the given learning rate: "sgd", "adam", "adamw", "rmsprop".
OptimizerPtr get(const std::string& name, double learning_rate);
}  // namespace optimizers

}  // namespace kiln::train
