// Fused optimizer update ops: sgd_update, adam_update, rmsprop_update (definitions,
// inference, eager entry points). Optional slots (SGD/RMSprop momentum, the centered
// average gradient) are present as inputs and outputs only when the attrs use them,
// so the ops are variadic and inference checks the count.
#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/ops/optim.h"

#include <cmath>

#include "op_util.h"

namespace kiln::ops {
namespace {
using detail::dtype_str;
using kiln::detail::str_cat;

// With attr hyper, the last input is f64 [2] = (lr, step) (see optim.h); checks it and
// returns the others.
std::span<const TensorMeta> strip_hyper(const char* op, std::span<const TensorMeta> in, const Attrs& a) {
  if (!a.get_bool("hyper", false)) return in;
  if (in.empty() || in.back().dtype != DType::kF64 || in.back().shape != Shape({2}))
    throw InvalidArgumentError(str_cat(op, ": with hyper, the last input must be f64[2] (lr, step), got ",
                                       in.empty() ? std::string("none") : dtype_str(in.back().dtype) + in.back().shape.str()));
  return in.first(in.size() - 1);
}

// param, grad and every slot: one floating dtype, one shape.
void check_update_inputs(const char* op, std::span<const TensorMeta> in, size_t expected, const char* const* names) {
  if (in.size() != expected)
    throw InvalidArgumentError(str_cat(op, ": expected ", expected, " inputs for these attributes, got ", in.size()));
  detail::require_floating(op, in[0]);
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].shape != in[0].shape || in[i].dtype != in[0].dtype)
      throw InvalidArgumentError(str_cat(op, ": ", names[i], " is ", dtype_str(in[i].dtype), in[i].shape.str(),
                                         " but param is ", dtype_str(in[0].dtype), in[0].shape.str()));
}

std::vector<TensorMeta> infer_sgd(std::span<const TensorMeta> all, const Attrs& a) {
  const std::span<const TensorMeta> in = strip_hyper("sgd_update", all, a);
  static const char* const names[] = {"param", "grad", "momentum"};
  const bool mom = a.get_float("momentum", 0) != 0;
  check_update_inputs("sgd_update", in, mom ? 3 : 2, names);
  return std::vector<TensorMeta>(in.size() - 1, in[0]);
}

std::vector<TensorMeta> infer_adam(std::span<const TensorMeta> all, const Attrs& a) {
  const std::span<const TensorMeta> in = strip_hyper("adam_update", all, a);
  static const char* const names[] = {"param", "grad", "m", "v"};
  check_update_inputs("adam_update", in, 4, names);
  if (!a.get_bool("hyper", false) && a.get_int("step") < 1)
    throw InvalidArgumentError(str_cat("adam_update: step must be >= 1 (1-based), got ", a.get_int("step")));
  return {in[0], in[0], in[0]};
}

std::vector<TensorMeta> infer_rmsprop(std::span<const TensorMeta> all, const Attrs& a) {
  const std::span<const TensorMeta> in = strip_hyper("rmsprop_update", all, a);
  const bool mom = a.get_float("momentum", 0) > 0, centered = a.get_bool("centered", false);
  const char* names[5] = {"param", "grad", "velocity", nullptr, nullptr};
  size_t n = 3;
  if (mom) names[n++] = "momentum";
  if (centered) names[n++] = "average_grad";
  check_update_inputs("rmsprop_update", in, n, names);
  return std::vector<TensorMeta>(in.size() - 1, in[0]);
}

const AttrSpec kLr{"lr", AttrType::kFloat, "learning rate"};
const AttrSpec kWd{"weight_decay", AttrType::kFloat, "decoupled weight decay: param *= 1 - lr * weight_decay first"};
const AttrSpec kHyper{"hyper", AttrType::kBool,
                      "the last input is f64[2] (lr, step), replacing the lr and step attrs (a traced training step)"};

// Output 0 (param') may overwrite param, output k >= 1 (a slot') its slot: input k + 1.
OpDef updates_in_place(OpDef d) {
  d.overwritable = {{0, 0}, {1, 2}, {2, 3}, {3, 4}};
  return d;
}

KILN_REGISTER_OP(updates_in_place(
    detail::make_def("sgd_update",
                     "SGD step (Keras): (param, grad[, momentum]) -> (param'[, momentum']); the momentum "
                     "slot is present iff momentum != 0",
                     -1, infer_sgd,
                     {kLr,
                      {"momentum", AttrType::kFloat, "momentum coefficient (0: plain SGD)"},
                      {"nesterov", AttrType::kBool, "Nesterov momentum"},
                      kWd,
                      kHyper},
                     Differentiable::kNo)));
KILN_REGISTER_OP(updates_in_place(detail::make_def(
    "adam_update", "Adam step (Keras): (param, grad, m, v[, hyper]) -> (param', m', v')", -1, infer_adam,
    {kLr,
     {"beta_1", AttrType::kFloat, "first-moment decay"},
     {"beta_2", AttrType::kFloat, "second-moment decay"},
     {"epsilon", AttrType::kFloat, "added to sqrt(v)"},
     {"step", AttrType::kInt, "1-based step for the bias correction"},
     kWd,
     kHyper},
    Differentiable::kNo)));
KILN_REGISTER_OP(updates_in_place(
    detail::make_def("rmsprop_update",
                     "RMSprop step (Keras): (param, grad, velocity[, momentum][, average_grad]) -> "
                     "(param', velocity'[, momentum'][, average_grad']); momentum slot iff momentum > 0, "
                     "average_grad iff centered",
                     -1, infer_rmsprop,
                     {kLr,
                      {"rho", AttrType::kFloat, "velocity decay"},
                      {"momentum", AttrType::kFloat, "momentum coefficient (0: none)"},
                      {"epsilon", AttrType::kFloat, "added to the variance estimate"},
                      {"centered", AttrType::kBool, "normalise by the centered variance"},
                      kWd,
                      kHyper},
                     Differentiable::kNo)));

void require(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) throw InvalidArgumentError(str_cat(op, ": ", name, " is undefined"));
}

// Appends the hyperparameter input when given (attrs: hyper = true).
void add_hyper(std::vector<Tensor>& in, Attrs& attrs, const Tensor& hyper) {
  if (!hyper.defined()) return;
  in.push_back(hyper);
  attrs.set("hyper", true);
}

// Runs the update: into the param and slots when in_place (and no observer watches),
// else into new tensors. The outputs are param', then slot k' for each slot: input k + 2
// (updates_in_place), `outputs` of them.
std::vector<Tensor> run_update(const OpDef& op, std::span<const Tensor> in, const Attrs& attrs, size_t outputs,
                               bool in_place) {
  if (!in_place || op_observer() != nullptr) return call_op(op, in, attrs);
  std::vector<Tensor> state{in[0]};
  state.insert(state.end(), in.begin() + 2, in.begin() + static_cast<std::ptrdiff_t>(outputs) + 1);
  call_op_into(op, in, state, attrs);
  return state;
}

}  // namespace

SgdUpdate sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, double lr, double momentum,
                     bool nesterov, double weight_decay, const Tensor& hyper, bool in_place) {
  require("sgd_update", "param", param);
  require("sgd_update", "grad", grad);
  const bool mom = momentum != 0;
  if (mom) require("sgd_update", "momentum buffer (momentum != 0)", momentum_buf);
  std::vector<Tensor> in{param, grad};
  if (mom) in.push_back(momentum_buf);
  Attrs attrs{{"lr", lr}, {"momentum", momentum}, {"nesterov", nesterov}, {"weight_decay", weight_decay}};
  add_hyper(in, attrs, hyper);
  std::vector<Tensor> out = run_update(KILN_OP("sgd_update"), in, attrs, mom ? 2 : 1, in_place);
  return {out[0], mom ? out[1] : Tensor()};
}

AdamUpdate adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr,
                       double beta_1, double beta_2, double epsilon, int64_t step, double weight_decay,
                       const Tensor& hyper, bool in_place) {
  require("adam_update", "param", param);
  require("adam_update", "grad", grad);
  require("adam_update", "m", m);
  require("adam_update", "v", v);
  std::vector<Tensor> in{param, grad, m, v};
  Attrs attrs{{"lr", lr},         {"beta_1", beta_1}, {"beta_2", beta_2},
              {"epsilon", epsilon}, {"step", step},     {"weight_decay", weight_decay}};
  add_hyper(in, attrs, hyper);
  std::vector<Tensor> out = run_update(KILN_OP("adam_update"), in, attrs, 3, in_place);
  return {out[0], out[1], out[2]};
}

RmspropUpdate rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                             const Tensor& momentum_buf, const Tensor& average_grad, double lr, double rho,
                             double momentum, double epsilon, bool centered, double weight_decay, const Tensor& hyper,
                             bool in_place) {
  require("rmsprop_update", "param", param);
  require("rmsprop_update", "grad", grad);
  require("rmsprop_update", "velocity", velocity);
  const bool mom = momentum > 0;
  if (mom) require("rmsprop_update", "momentum buffer (momentum > 0)", momentum_buf);
  if (centered) require("rmsprop_update", "average_grad (centered)", average_grad);
  std::vector<Tensor> in{param, grad, velocity};
  if (mom) in.push_back(momentum_buf);
  if (centered) in.push_back(average_grad);
  Attrs attrs{{"lr", lr},           {"rho", rho},           {"momentum", momentum},
              {"epsilon", epsilon}, {"centered", centered}, {"weight_decay", weight_decay}};
  add_hyper(in, attrs, hyper);
  std::vector<Tensor> out = run_update(KILN_OP("rmsprop_update"), in, attrs, size_t{2} + mom + centered, in_place);
  RmspropUpdate r{out[0], out[1], {}, {}};
  size_t k = 2;
  if (mom) r.momentum = out[k++];
  if (centered) r.average_grad = out[k++];
  return r;
}

}  // namespace kiln::ops
