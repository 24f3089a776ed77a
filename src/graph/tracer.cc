// Tracing by recording: the callable runs eagerly once while an op observer and a
// variable observer turn what it does into a Graph.
#include <unordered_map>

#include "kiln/core/dispatch.h"
#include "kiln/core/error.h"
#include "kiln/core/op_def.h"
#include "kiln/graph/function.h"

namespace kiln::graph {
namespace {

class Tracer final : public OpObserver, public VariableObserver {
 public:
  Tracer() : prev_op_(set_op_observer(this)), prev_var_(set_variable_observer(this)) {}
  ~Tracer() override {
    set_op_observer(prev_op_);
    set_variable_observer(prev_var_);
  }

  void add_input(const Tensor& t, int index) {
    Node n;
    n.kind = NodeKind::kInput;
    n.input_index = index;
    n.outputs = {{t.shape(), t.dtype()}};
    values_[t.id()] = {g_.add(std::move(n)), 0};
    ++g_.num_inputs;
  }

  ValueRef lookup(const Tensor& t) {
    if (auto it = values_.find(t.id()); it != values_.end()) return it->second;
    Node n;
    n.kind = NodeKind::kConstant;
    n.constant = t;
    n.outputs = {{t.shape(), t.dtype()}};
    ValueRef v{g_.add(std::move(n)), 0};
    values_[t.id()] = v;
    return v;
  }

  void on_op(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
             const Attrs& attrs) override {
    if (prev_op_) prev_op_->on_op(op, inputs, outputs, attrs);
    Node n;
    n.kind = NodeKind::kOp;
    n.op = &op;
    n.attrs = attrs;
    for (const Tensor& t : inputs) n.inputs.push_back(lookup(t));
    for (const Tensor& t : outputs) n.outputs.push_back({t.shape(), t.dtype()});
    const int id = g_.add(std::move(n));
    for (size_t k = 0; k < outputs.size(); ++k) values_[outputs[k].id()] = {id, static_cast<int>(k)};
  }

  void on_read(const Variable& var, const Tensor& value) override {
    if (prev_var_) prev_var_->on_read(var, value);
    if (values_.count(value.id())) return;  // read before (or assigned in this trace)
    Node n;
    n.kind = NodeKind::kVariable;
    n.variable = var;
    n.outputs = {{value.shape(), value.dtype()}};
    values_[value.id()] = {g_.add(std::move(n)), 0};
  }

  void on_assign(const Variable& var, const Tensor& value) override {
    if (prev_var_) prev_var_->on_assign(var, value);
    const ValueRef v = lookup(value);
    if (auto it = assigned_.find(var.uid()); it != assigned_.end()) {
      g_.assignments[it->second].value = v;  // the last assignment wins
    } else {
      assigned_[var.uid()] = g_.assignments.size();
      g_.assignments.push_back({var, v});
    }
  }

  Graph finish(const std::vector<Tensor>& results) {
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].defined())
        throw InvalidArgumentError("kiln::function: result " + std::to_string(i) + " is undefined");
      g_.outputs.push_back(lookup(results[i]));
    }
    g_.check();
    return std::move(g_);
  }

 private:
  OpObserver* prev_op_;
  VariableObserver* prev_var_;
  Graph g_;
  std::unordered_map<uint64_t, ValueRef> values_;
  std::unordered_map<uintptr_t, size_t> assigned_;
};

}  // namespace

Graph trace(const TracedFn& fn, const std::vector<Tensor>& args, std::vector<Tensor>* results) {
  std::vector<Tensor> out;
  Graph g;
  {
    Tracer tracer;
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].defined()) throw InvalidArgumentError("kiln::function: argument " + std::to_string(i) + " is undefined");
      tracer.add_input(args[i], static_cast<int>(i));
    }
    out = fn(args);
    g = tracer.finish(out);
  }
  if (results) *results = std::move(out);
  return g;
}

}  // namespace kiln::graph
