#include "kiln/train/optimizers.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "kiln/ops.h"
#include "kiln/ops/optim.h"

namespace kiln::train {
namespace {
using kiln::detail::str_cat;

Variable make_iterations(const std::string& optimizer) {
  return Variable(Tensor::scalar<int64_t>(0), optimizer + "/iterations", /*trainable=*/false);
}

// Sum of squares of g in f64 (reductions accumulate in f64; squaring in the
// gradient's dtype is what Keras does too).
double squared_norm(const Tensor& g) { return ops::sum(ops::square(g)).item<double>(); }

Tensor scaled(const Tensor& g, double s) { return ops::mul(g, ops::scalar(s, g.dtype())); }

}  // namespace

Optimizer::Optimizer(OptimizerOptions opts) : opts_(std::move(opts)) {
  if (auto* s = std::get_if<SchedulePtr>(&opts_.learning_rate); s && !*s)
    throw InvalidArgumentError("Optimizer: the learning-rate schedule is null");
  if (opts_.clipnorm < 0 || opts_.global_clipnorm < 0)
    throw InvalidArgumentError(str_cat("Optimizer: clipnorm and global_clipnorm must be >= 0 (0: off), got ",
                                       opts_.clipnorm, " and ", opts_.global_clipnorm));
  if (opts_.clipnorm > 0 && opts_.global_clipnorm > 0)
    throw InvalidArgumentError("Optimizer: only one of clipnorm and global_clipnorm can be set");
  if (opts_.weight_decay < 0)
    throw InvalidArgumentError(str_cat("Optimizer: weight_decay must be >= 0, got ", opts_.weight_decay));
}

void Optimizer::build(const std::vector<Variable>& vars) {
  // name() is virtual: the iterations variable is made on the first build (derived
  // constructors call build({})), not in this class's constructor.
  if (!iterations_.defined()) iterations_ = make_iterations(name());
  std::vector<std::string> names;
  for (const Variable& v : vars) {
    if (!v.defined()) throw InvalidArgumentError(str_cat(name(), ": build got an undefined variable"));
    if (slots_.count(v.uid())) continue;
    if (names.empty()) names = slot_names();
    std::vector<Variable> s;
    s.reserve(names.size());
    for (const std::string& n : names)
      s.emplace_back(ops::zeros_like(v.peek()), name() + "/" + v.name() + "/" + n, /*trainable=*/false);
    slots_.emplace(v.uid(), std::move(s));
    order_.push_back(v);
  }
}

std::vector<Variable> Optimizer::variables() const {
  std::vector<Variable> out;
  if (iterations_.defined()) out.push_back(iterations_);
  for (const Variable& v : order_) {
    const auto& s = slots_.at(v.uid());
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

int64_t Optimizer::iterations() const { return iterations_.defined() ? iterations_.peek().item<int64_t>() : 0; }

double Optimizer::learning_rate() const {
  if (const auto* s = std::get_if<SchedulePtr>(&opts_.learning_rate)) return (**s)(iterations());
  return std::get<double>(opts_.learning_rate);
}

void Optimizer::set_learning_rate(double lr) { opts_.learning_rate = lr; }

bool Optimizer::can_update_in_place(const Variable& var, const std::vector<Variable>& slots) const {
  if (hyper_.defined() || !var.value_is_exclusive()) return false;
  for (const Variable& s : slots)
    if (!s.value_is_exclusive()) return false;
  return true;
}

void Optimizer::apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  apply(grads, vars, {}, {});
}

void Optimizer::apply_gradients_traced(const std::vector<Tensor>& grads, const std::vector<Variable>& vars,
                                       const Tensor& hyper, const Tensor& step) {
  if (!traceable())
    throw FailedPreconditionError(name() + ": this optimizer decides on the host (clipnorm, loss scaling); its "
                                           "updates cannot be traced");
  if (!hyper.defined() || hyper.dtype() != DType::kF64 || hyper.shape() != Shape({2}) || !step.defined() ||
      step.dtype() != DType::kI64 || step.rank() != 0)
    throw InvalidArgumentError(name() + ".apply_gradients_traced: hyper must be f64[2] (lr, step) and step an i64 scalar");
  apply(grads, vars, hyper, step);
}

std::pair<Tensor, Tensor> Optimizer::step_inputs() const {
  const int64_t step = iterations() + 1;
  Tensor hyper = Tensor::empty(Shape({2}), DType::kF64);
  double* h = static_cast<double*>(hyper.raw_data());
  h[0] = learning_rate();
  h[1] = static_cast<double>(step);
  return {hyper, Tensor::scalar<int64_t>(step)};
}

void Optimizer::apply(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, const Tensor& hyper,
                      const Tensor& step_t) {
  if (grads.size() != vars.size())
    throw InvalidArgumentError(
        str_cat(name(), ".apply_gradients: got ", grads.size(), " gradients for ", vars.size(), " variables"));
  // Validate everything before changing anything.
  std::vector<Tensor> g;
  std::vector<Variable> v;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!vars[i].defined())
      throw InvalidArgumentError(str_cat(name(), ".apply_gradients: variable ", i, " is undefined"));
    if (!grads[i].defined()) continue;
    const Tensor& val = vars[i].peek();
    if (grads[i].shape() != val.shape() || grads[i].dtype() != val.dtype())
      throw InvalidArgumentError(str_cat(name(), ".apply_gradients: the gradient of '", vars[i].name(), "' is ",
                                         dtype_name(grads[i].dtype()), grads[i].shape().str(), " but the variable is ",
                                         dtype_name(val.dtype()), val.shape().str()));
    if (grads[i].device() != val.device())
      throw InvalidArgumentError(str_cat(name(), ".apply_gradients: the gradient of '", vars[i].name(), "' is on ",
                                         grads[i].device().str(), " but the variable is on ", val.device().str()));
    g.push_back(grads[i]);
    v.push_back(vars[i]);
  }
  build(vars);
  if (g.empty()) return;  // as Keras: nothing to apply, the step is not counted

  if (opts_.clipnorm > 0) {
    for (Tensor& t : g) {
      const double n = std::sqrt(squared_norm(t));
      if (n > opts_.clipnorm) t = scaled(t, opts_.clipnorm / n);
    }
  } else if (opts_.global_clipnorm > 0) {
    clip_by_global_norm(g, opts_.global_clipnorm);
  }

  if (hyper.defined()) {  // traced: lr and step are inputs of the update ops
    hyper_ = hyper;
    try {
      for (size_t i = 0; i < g.size(); ++i) update(v[i], g[i], slots_.at(v[i].uid()), 0, 1);
    } catch (...) {
      hyper_ = Tensor();
      throw;
    }
    hyper_ = Tensor();
    iterations_.assign(step_t);
    return;
  }
  const double lr = learning_rate();
  const int64_t step = iterations() + 1;
  for (size_t i = 0; i < g.size(); ++i) update(v[i], g[i], slots_.at(v[i].uid()), lr, step);
  iterations_.assign(Tensor::scalar<int64_t>(step).to(iterations_.peek().device()));  // stays with the model
}

double clip_by_global_norm(std::vector<Tensor>& grads, double clip_norm) {
  if (!(clip_norm > 0))
    throw InvalidArgumentError(str_cat("clip_by_global_norm: clip_norm must be > 0, got ", clip_norm));
  double sq = 0;
  for (const Tensor& t : grads)
    if (t.defined()) sq += squared_norm(t);
  const double norm = std::sqrt(sq);
  if (norm > clip_norm) {
    // An infinite or NaN norm gives NaN gradients (as tf.clip_by_global_norm), so
    // the divergence is visible instead of silently zeroed.
    const double s = std::isfinite(norm) ? clip_norm / norm : std::nan("");
    for (Tensor& t : grads)
      if (t.defined()) t = scaled(t, s);
  }
  return norm;
}

namespace {

class SGDOptimizer final : public Optimizer {
 public:
  SGDOptimizer(OptimizerOptions opts, double momentum, bool nesterov)
      : Optimizer(std::move(opts)), momentum_(momentum), nesterov_(nesterov) {
    if (!(momentum >= 0 && momentum <= 1))
      throw InvalidArgumentError(str_cat("SGD: momentum must be in [0, 1], got ", momentum));
    build({});
  }
  std::string name() const override { return "sgd"; }

 protected:
  std::vector<std::string> slot_names() const override {
    return momentum_ != 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{};
  }
  void update(const Variable& var, const Tensor& grad, std::vector<Variable>& slots, double lr, int64_t) override {
    const bool mom = momentum_ != 0;
    const bool in_place = can_update_in_place(var, slots);  // before peek() copies the values (argument order)
    ops::SgdUpdate r = ops::sgd_update(var.peek(), grad, mom ? slots[0].peek() : Tensor(), lr, momentum_, nesterov_,
                                       opts_.weight_decay, hyper_, in_place);
    var.assign(r.param);
    if (mom) slots[0].assign(r.momentum);
  }

 private:
  double momentum_;
  bool nesterov_;
};

class AdamOptimizer final : public Optimizer {
 public:
  AdamOptimizer(OptimizerOptions opts, double beta_1, double beta_2, double epsilon, std::string name)
      : Optimizer(std::move(opts)), beta_1_(beta_1), beta_2_(beta_2), epsilon_(epsilon), name_(std::move(name)) {
    if (!(beta_1 >= 0 && beta_1 < 1) || !(beta_2 >= 0 && beta_2 < 1))
      throw InvalidArgumentError(
          str_cat(name_, ": beta_1 and beta_2 must be in [0, 1), got ", beta_1, " and ", beta_2));
    build({});
  }
  std::string name() const override { return name_; }

 protected:
  std::vector<std::string> slot_names() const override { return {"m", "v"}; }
  void update(const Variable& var, const Tensor& grad, std::vector<Variable>& slots, double lr, int64_t step) override {
    const bool in_place = can_update_in_place(var, slots);  // before peek() copies the values (argument order)
    ops::AdamUpdate r = ops::adam_update(var.peek(), grad, slots[0].peek(), slots[1].peek(), lr, beta_1_, beta_2_,
                                         epsilon_, step, opts_.weight_decay, hyper_, in_place);
    var.assign(r.param);
    slots[0].assign(r.m);
    slots[1].assign(r.v);
  }

 private:
  double beta_1_, beta_2_, epsilon_;
  std::string name_;
};

class RMSpropOptimizer final : public Optimizer {
 public:
  RMSpropOptimizer(OptimizerOptions opts, double rho, double momentum, double epsilon, bool centered)
      : Optimizer(std::move(opts)), rho_(rho), momentum_(momentum), epsilon_(epsilon), centered_(centered) {
    if (!(momentum >= 0)) throw InvalidArgumentError(str_cat("RMSprop: momentum must be >= 0, got ", momentum));
    build({});
  }
  std::string name() const override { return "rmsprop"; }

 protected:
  std::vector<std::string> slot_names() const override {
    std::vector<std::string> n{"velocity"};
    if (momentum_ > 0) n.push_back("momentum");
    if (centered_) n.push_back("average_gradient");
    return n;
  }
  void update(const Variable& var, const Tensor& grad, std::vector<Variable>& slots, double lr, int64_t) override {
    const bool mom = momentum_ > 0;
    Variable* mom_slot = mom ? &slots[1] : nullptr;
    Variable* avg_slot = centered_ ? &slots[mom ? 2 : 1] : nullptr;
    const bool in_place = can_update_in_place(var, slots);  // before peek() copies the values (argument order)
    ops::RmspropUpdate r =
        ops::rmsprop_update(var.peek(), grad, slots[0].peek(), mom_slot ? mom_slot->peek() : Tensor(),
                            avg_slot ? avg_slot->peek() : Tensor(), lr, rho_, momentum_, epsilon_, centered_,
                            opts_.weight_decay, hyper_, in_place);
    var.assign(r.param);
    slots[0].assign(r.velocity);
    if (mom_slot) mom_slot->assign(r.momentum);
    if (avg_slot) avg_slot->assign(r.average_grad);
  }

 private:
  double rho_, momentum_, epsilon_;
  bool centered_;
};

}  // namespace

namespace optimizers {

OptimizerPtr SGD(OptimizerOptions opts, double momentum, bool nesterov) {
  return std::make_shared<SGDOptimizer>(std::move(opts), momentum, nesterov);
}

OptimizerPtr Adam(OptimizerOptions opts, double beta_1, double beta_2, double epsilon) {
  return std::make_shared<AdamOptimizer>(std::move(opts), beta_1, beta_2, epsilon, "adam");
}

OptimizerPtr AdamW(OptimizerOptions opts, double beta_1, double beta_2, double epsilon) {
  if (opts.weight_decay == 0) opts.weight_decay = 0.004;
  return std::make_shared<AdamOptimizer>(std::move(opts), beta_1, beta_2, epsilon, "adamw");
}

OptimizerPtr RMSprop(OptimizerOptions opts, double rho, double momentum, double epsilon, bool centered) {
  return std::make_shared<RMSpropOptimizer>(std::move(opts), rho, momentum, epsilon, centered);
}

OptimizerPtr get(const std::string& name, double learning_rate) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  OptimizerOptions o;
  o.learning_rate = learning_rate;
  if (n == "sgd") return SGD(o);
  if (n == "adam") return Adam(o);
  if (n == "adamw") return AdamW(o);
  if (n == "rmsprop") return RMSprop(o);
  throw InvalidArgumentError("unknown optimizer '" + name + "'; expected one of: sgd, adam, adamw, rmsprop");
}

}  // namespace optimizers
}  // namespace kiln::train
