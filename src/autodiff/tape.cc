#include "kiln/autodiff/tape.h"

#include <algorithm>

#include "kiln/core/dispatch.h"
#include "kiln/core/error.h"
#include "kiln/core/op_def.h"
#include "kiln/ops.h"

namespace kiln {

namespace {
thread_local GradientTape* t_top_tape = nullptr;
}

bool is_differentiable_dtype(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64;
}

GradientTape::GradientTape(bool persistent, bool watch_accessed_variables)
    : persistent_(persistent), watch_variables_(watch_accessed_variables) {
  prev_observer_ = set_op_observer(this);
  prev_tape_ = t_top_tape;
  t_top_tape = this;
}

GradientTape::~GradientTape() {
  set_op_observer(prev_observer_);
  t_top_tape = prev_tape_;
}

void GradientTape::watch(const Tensor& t) {
  if (!t.defined()) throw InvalidArgumentError("GradientTape::watch: the tensor is undefined");
  watched_.insert(t.id());
}

void GradientTape::watch(const Variable& v) { watch(v.peek()); }

void GradientTape::notify_variable_read(const Tensor& value, bool trainable) {
  if (!trainable) return;
  for (GradientTape* t = t_top_tape; t; t = t->prev_tape_)
    if (t->recording_ && t->watch_variables_) t->watched_.insert(value.id());
}

void GradientTape::on_op(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                         const Attrs& attrs) {
  if (prev_observer_) prev_observer_->on_op(op, inputs, outputs, attrs);
  if (!recording_ || op.differentiable == Differentiable::kNo) return;
  bool any = false;
  for (const Tensor& t : inputs)
    if (watched_.count(t.id())) {
      any = true;
      break;
    }
  if (!any) return;
  Node n{&op, std::vector<Tensor>(inputs.begin(), inputs.end()), std::vector<Tensor>(outputs.begin(), outputs.end()),
         attrs};
  for (const Tensor& t : outputs)
    if (is_differentiable_dtype(t.dtype())) watched_.insert(t.id());
  nodes_.push_back(std::move(n));
}

void GradientTape::reset() {
  nodes_.clear();
  watched_.clear();
  used_ = false;
}

GradientTape::Pause::Pause(GradientTape& tape) : tape_(tape), was_(tape.recording_) { tape_.recording_ = false; }
GradientTape::Pause::~Pause() { tape_.recording_ = was_; }

std::vector<Tensor> GradientTape::gradient(const Tensor& target, const std::vector<Tensor>& sources,
                                           const Tensor& output_gradient, UnconnectedGradients unconnected) {
  if (used_ && !persistent_)
    throw FailedPreconditionError(
        "GradientTape::gradient called twice on a non-persistent tape; construct it with persistent = true");
  if (!target.defined()) throw InvalidArgumentError("GradientTape::gradient: the target is undefined");
  if (!is_differentiable_dtype(target.dtype()))
    throw InvalidArgumentError("GradientTape::gradient: the target must be floating point, got " + target.desc());
  if (output_gradient.defined() && output_gradient.shape() != target.shape())
    throw InvalidArgumentError("GradientTape::gradient: output_gradient is " + output_gradient.desc() +
                               " but the target is " + target.desc());
  used_ = true;
  // This tape does not record its own backward pass; enclosing tapes still do (via
  // on_op forwarding), which is what gives gradients of gradients.
  Pause pause(*this);

  // Forward pass over the record: which tensors depend on a source.
  std::unordered_set<uint64_t> reach;
  // Only watched sources get gradients (tf.GradientTape semantics): an unwatched
  // tensor is a constant even when it feeds a recorded op.
  for (const Tensor& s : sources)
    if (s.defined() && is_differentiable_dtype(s.dtype()) && watched_.count(s.id())) reach.insert(s.id());
  std::vector<uint8_t> live(nodes_.size(), 0);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    for (const Tensor& t : n.inputs)
      if (reach.count(t.id())) {
        live[i] = 1;
        break;
      }
    if (live[i])
      for (const Tensor& t : n.outputs)
        if (is_differentiable_dtype(t.dtype())) reach.insert(t.id());
  }

  std::unordered_map<uint64_t, Tensor> grads;
  grads[target.id()] = output_gradient.defined() ? output_gradient.to(target.dtype()) : ops::ones_like(target);
  auto accumulate = [&](const Tensor& input, Tensor g) {
    auto it = grads.find(input.id());
    if (it == grads.end())
      grads.emplace(input.id(), std::move(g));
    else
      it->second = ops::add(it->second, g);
  };

  std::vector<Tensor> cots;
  std::vector<uint8_t> needs;
  for (size_t i = nodes_.size(); i-- > 0;) {
    if (!live[i]) continue;
    Node& n = nodes_[i];
    cots.assign(n.outputs.size(), Tensor());
    bool any = false;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      auto it = grads.find(n.outputs[k].id());
      if (it != grads.end()) {
        cots[k] = it->second;
        any = true;
      }
    }
    if (!any) continue;
    if (!n.op->vjp)
      throw UnimplementedError("GradientTape: op '" + n.op->name +
                               "' has no gradient (vjp) but lies between the target and a source");
    for (size_t k = 0; k < n.outputs.size(); ++k)
      if (!cots[k].defined()) cots[k] = ops::zeros_like(n.outputs[k]);
    needs.assign(n.inputs.size(), 0);
    for (size_t j = 0; j < n.inputs.size(); ++j)
      needs[j] = is_differentiable_dtype(n.inputs[j].dtype()) && reach.count(n.inputs[j].id());
    VjpContext ctx{n.inputs, n.outputs, cots, n.attrs, needs};
    std::vector<Tensor> in_grads = n.op->vjp(ctx);
    if (in_grads.size() != n.inputs.size())
      throw InternalError("vjp of '" + n.op->name + "' returned " + std::to_string(in_grads.size()) +
                          " gradients for " + std::to_string(n.inputs.size()) + " inputs");
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      if (!needs[j] || !in_grads[j].defined()) continue;
      const Tensor& x = n.inputs[j];
      Tensor& g = in_grads[j];
      if (g.shape() != x.shape())
        throw InternalError("vjp of '" + n.op->name + "' gave input " + std::to_string(j) + " a gradient " +
                            g.desc() + " for " + x.desc());
      if (g.dtype() != x.dtype()) g = ops::cast(g, x.dtype());
      accumulate(x, std::move(g));
    }
    if (!persistent_) n = Node{n.op, {}, {}, {}};
  }

  std::vector<Tensor> result;
  result.reserve(sources.size());
  for (const Tensor& s : sources) {
    Tensor g;
    if (s.defined() && is_differentiable_dtype(s.dtype())) {
      auto it = grads.find(s.id());
      if (it != grads.end())
        g = it->second;
      else if (unconnected == UnconnectedGradients::kZero)
        g = ops::zeros_like(s);
    }
    result.push_back(std::move(g));
  }
  if (!persistent_) nodes_.clear();
  return result;
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target, const std::vector<Variable>& sources,
                                           const Tensor& output_gradient, UnconnectedGradients unconnected) {
  std::vector<Tensor> ts;
  ts.reserve(sources.size());
  for (const Variable& v : sources) ts.push_back(v.peek());
  return gradient(target, ts, output_gradient, unconnected);
}

}  // namespace kiln
