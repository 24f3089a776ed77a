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
thread_local int t_replica = 0;
}  // namespace

ReplicaScope::ReplicaScope(int replica) : previous_(t_replica) {
  if (replica < 0) throw InvalidArgumentError("ReplicaScope: replica " + std::to_string(replica) + " < 0");
  t_replica = replica;
}
ReplicaScope::~ReplicaScope() { t_replica = previous_; }
int ReplicaScope::current() { return t_replica; }

Tensor& Variable::State::current() {
  // A thread of replica r >= 1 uses copy r; an unmirrored variable has one copy for all.
  if (t_replica == 0 || replicas.empty()) return value;
  if (static_cast<size_t>(t_replica) > replicas.size())
    throw FailedPreconditionError("Variable '" + name + "' has " + std::to_string(replicas.size() + 1) +
                                  " mirrored copies; replica " + std::to_string(t_replica) + " has none");
  return replicas[static_cast<size_t>(t_replica) - 1];
}

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
  const Tensor& cur = state_->current();
  GradientTape::notify_variable_read(cur, state_->trainable);
  if (t_var_observer) t_var_observer->on_read(*this, cur);
  const DType stored = cur.dtype();
  if (t_autocast && *t_autocast != stored && is_floating(stored) && is_floating(*t_autocast))
    return ops::cast(cur, *t_autocast);
  return cur;
}

const Tensor& Variable::peek() const {
  require(state_.get());
  const Tensor& cur = state_->current();
  if (t_var_observer) t_var_observer->on_read(*this, cur);
  return cur;
}

namespace {
void check_assign(const std::string& name, const Tensor& have, const Tensor& v) {
  if (!v.defined()) throw InvalidArgumentError("Variable '" + name + "': assigned an undefined tensor");
  if (v.shape() != have.shape() || v.dtype() != have.dtype())
    throw InvalidArgumentError("Variable '" + name + "' is " + have.desc() + ", assigned " + v.desc());
}
}  // namespace

void Variable::assign(const Tensor& v) const {
  require(state_.get());
  Tensor& cur = state_->current();
  check_assign(state_->name, cur, v);
  if (t_var_observer) t_var_observer->on_assign(*this, v);
  cur = v;
}

bool Variable::value_is_exclusive() const {
  require(state_.get());
  const std::shared_ptr<Storage>& s = state_->current().storage();
  return s.use_count() == 1 && s->owns_memory();
}

void Variable::mirror(const std::vector<Device>& devices) const {
  require(state_.get());
  if (devices.empty()) {
    state_->replicas.clear();
    return;
  }
  if (state_->value.device() != devices[0]) state_->value = state_->value.to(devices[0]);
  state_->replicas.clear();
  for (size_t r = 1; r < devices.size(); ++r) {
    Tensor copy = state_->value.to(devices[r]);
    if (copy.storage() == state_->value.storage()) copy = copy.clone();  // the same device twice: still a copy
    state_->replicas.push_back(std::move(copy));
  }
}

int Variable::num_replicas() const {
  require(state_.get());
  return static_cast<int>(state_->replicas.size()) + 1;
}

const Tensor& Variable::replica_value(int r) const {
  require(state_.get());
  if (r < 0 || r >= num_replicas())
    throw OutOfRangeError("Variable '" + state_->name + "': no copy " + std::to_string(r) + " of " +
                          std::to_string(num_replicas()));
  return r == 0 ? state_->value : state_->replicas[static_cast<size_t>(r) - 1];
}

void Variable::assign_replica(int r, const Tensor& v) const {
  const Tensor& have = replica_value(r);
  check_assign(state_->name, have, v);
  (r == 0 ? state_->value : state_->replicas[static_cast<size_t>(r) - 1]) = v;
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
