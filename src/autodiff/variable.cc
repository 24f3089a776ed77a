#include "kiln/autodiff/variable.h"

#include "kiln/autodiff/tape.h"
#include "kiln/ops/elementwise.h"

namespace kiln {

Variable::Variable(Tensor initial, std::string name, bool trainable) : state_(std::make_shared<State>()) {
  if (!initial.defined()) throw InvalidArgumentError("Variable '" + name + "': initial value is undefined");
  state_->value = std::move(initial);
  state_->name = std::move(name);
  state_->trainable = trainable;
}

static void require(const void* state) {
  if (!state) throw FailedPreconditionError("use of an undefined Variable");
}

namespace {
thread_local std::optional<DType> t_autocast;
thread_local VariableObserver* t_var_observer = nullptr;
}  // namespace

VariableObserver* set_variable_observer(VariableObserver* observer) {
  VariableObserver* prev = t_var_observer;
  t_var_observer = observer;
  return prev;
}

AutocastScope::AutocastScope(std::optional<DType> dtype) : previous_(t_autocast) { t_autocast = dtype; }
AutocastScope::~AutocastScope() { t_autocast = previous_; }
std::optional<DType> AutocastScope::current() { return t_autocast; }

Tensor Variable::value() const {
  require(state_.get());
  GradientTape::notify_variable_read(state_->value, state_->trainable);
  if (t_var_observer) t_var_observer->on_read(*this, state_->value);
  const DType stored = state_->value.dtype();
  if (t_autocast && *t_autocast != stored && is_floating(stored) && is_floating(*t_autocast))
    return ops::cast(state_->value, *t_autocast);
  return state_->value;
}

const Tensor& Variable::peek() const {
  require(state_.get());
  if (t_var_observer) t_var_observer->on_read(*this, state_->value);
  return state_->value;
}

void Variable::assign(const Tensor& v) const {
  require(state_.get());
  if (!v.defined()) throw InvalidArgumentError("Variable '" + state_->name + "': assigned an undefined tensor");
  if (v.shape() != state_->value.shape() || v.dtype() != state_->value.dtype())
    throw InvalidArgumentError("Variable '" + state_->name + "' is " + state_->value.desc() + ", assigned " + v.desc());
  if (t_var_observer) t_var_observer->on_assign(*this, v);
  state_->value = v;
}

bool Variable::value_is_exclusive() const {
  require(state_.get());
  const std::shared_ptr<Storage>& s = state_->value.storage();
  return s.use_count() == 1 && s->owns_memory();
}

const std::string& Variable::name() const {
  require(state_.get());
  return state_->name;
}

bool Variable::trainable() const {
  require(state_.get());
  return state_->trainable;
}

void Variable::set_trainable(bool t) const {
  require(state_.get());
  state_->trainable = t;
}

}  // namespace kiln
