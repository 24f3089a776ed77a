#pragma once
// Fused optimizer updates (the Keras 3 update rules, one pass over memory per
// variable). Each op reads the parameter, its gradient and the optimizer's slots and
// returns new tensors (the caller assigns them to its Variables); inputs are not
// modified unless `in_place` (below). Not differentiable.
//
// `in_place` (optional): write the results over param and the slots, as TensorFlow's
// ApplyAdam updates its variables and PyTorch's optimizers their parameters; the
// results are then those very tensors. For a caller that owns them and gives up their
// old values (an optimizer whose variables nothing else holds). Ignored while an op
// observer (a gradient tape, a trace) watches the thread: what it records must not
// alias. The kernels allow it (OpDef::overwritable).
//
// Every update first applies decoupled weight decay (Keras's _apply_weight_decay, as
// in AdamW): param *= 1 - lr * weight_decay; weight_decay = 0 disables it.
//
// Dtypes: param, grad and every slot must have one floating dtype and one shape
// (InvalidArgumentError otherwise); f16/bf16 compute in f32 and round the results.
// Coefficients are computed in f64 and rounded to the compute type.
//
// `hyper` (optional): an f64 tensor [2] = (lr, step) that replaces the `lr` and `step`
// arguments, read when the kernel runs. A traced training step feeds it per run, so
// the learning rate (schedules, callbacks) and Adam's bias correction follow the
// optimizer instead of being fixed in the trace.
#include <cstdint>

#include "kiln/core/tensor.h"

namespace kiln::ops {

// SGD (keras.optimizers.SGD). With momentum != 0 (mu):
//   m' = mu * m - lr * g
//   p' = p + m'                      (nesterov: p + mu * m' - lr * g)
// else p' = p - lr * g, and momentum_buf is ignored (may be undefined) and the
// result's momentum is undefined.
struct SgdUpdate {
  Tensor param;
  Tensor momentum;
};
SgdUpdate sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr,
                     double momentum = 0, bool nesterov = false, double weight_decay = 0, const Tensor& hyper = {},
                     bool in_place = false);

// Adam (keras.optimizers.Adam / AdamW), step t >= 1 (1-based):
//   alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
//   m' = m + (g - m) * (1 - beta_1)
//   v' = v + (g^2 - v) * (1 - beta_2)
//   p' = p - alpha * m' / (sqrt(v') + epsilon)
// Errors: step < 1 (InvalidArgumentError).
struct AdamUpdate {
  Tensor param;
  Tensor m;
  Tensor v;
};
AdamUpdate adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr,
                       double beta_1, double beta_2, double epsilon, int64_t step, double weight_decay = 0,
                       const Tensor& hyper = {}, bool in_place = false);

// RMSprop (keras.optimizers.RMSprop):
//   v'  = rho * v + (1 - rho) * g^2
//   centered: mg' = rho * mg + (1 - rho) * g; d = v' - mg'^2 + epsilon; else d = v' + epsilon
//   inc = lr * g / sqrt(d)
//   momentum > 0: mom' = momentum * mom + inc; p' = p - mom'     else p' = p - inc
// momentum_buf is used only when momentum > 0 and average_grad only when centered
// (otherwise they may be undefined, and so are the corresponding results).
struct RmspropUpdate {
  Tensor param;
  Tensor velocity;
  Tensor momentum;
  Tensor average_grad;
};
RmspropUpdate rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                             const Tensor& momentum_buf, const Tensor& average_grad, double lr, double rho,
                             double momentum, double epsilon, bool centered, double weight_decay = 0,
                             const Tensor& hyper = {}, bool in_place = false);

}  // namespace kiln::ops
