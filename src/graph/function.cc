#include "kiln/graph/function.h"

#include "kiln/core/error.h"
#include "kiln/core/tensor_spec.h"
#include "meta_key.h"

namespace kiln {

ConcreteFunction::ConcreteFunction(graph::Graph traced, const FunctionOptions& opts) : traced_(std::move(traced)) {
  graph::Graph g = traced_;
  graph::PassOptions po = opts.passes;
  po.name = opts.name;
  graph::optimize(g, po);
  executor_ = std::make_unique<graph::Executor>(std::move(g));
}

struct Function::State {
  TracedFn fn;
  FunctionOptions opts;
  std::mutex mu;
  std::map<std::string, std::unique_ptr<ConcreteFunction>> concrete;
  int traces = 0;
  // The last call's argument metas and the concrete function that ran it: a train
  // step's calls all match it, and find it with no key built (never erased: concrete
  // functions live as long as the state).
  std::vector<TensorMeta> last_metas;
  ConcreteFunction* last = nullptr;
};

namespace {
// The concrete-function cache's key: each argument's dtype and shape.
std::string signature_key(const std::vector<Tensor>& args) {
  std::string k;
  for (const Tensor& t : args) graph::detail::append_key(k, t.dtype(), t.shape());
  return k;
}

void check_signature(const FunctionOptions& o, const std::vector<Tensor>& args) {
  const auto& sig = *o.input_signature;
  auto fail = [&](size_t i, const std::string& why) {
    throw InvalidArgumentError(o.name + ": argument " + std::to_string(i) + " " + why);
  };
  if (args.size() != sig.size())
    throw InvalidArgumentError(o.name + ": the input signature has " + std::to_string(sig.size()) +
                               " tensors, got " + std::to_string(args.size()) + " arguments");
  for (size_t i = 0; i < args.size(); ++i) {
    const TensorSpec& s = sig[i];
    auto mismatch = [&] {
      std::string want = std::string(dtype_name(s.dtype)) + "[";
      for (size_t d = 0; d < s.shape.size(); ++d) want += (d ? ", " : "") + std::to_string(s.shape[d]);
      fail(i, "is " + args[i].desc() + ", the signature wants " + want + "]");
    };
    if (!args[i].defined()) fail(i, "is undefined");
    if (args[i].dtype() != s.dtype || args[i].rank() != static_cast<int>(s.shape.size())) mismatch();
    for (int d = 0; d < args[i].rank(); ++d)
      if (s.shape[static_cast<size_t>(d)] >= 0 && s.shape[static_cast<size_t>(d)] != args[i].dim(d)) mismatch();
  }
}

// A call that did not run a plan gives its results to `ready` at the end.
void give_all(const std::vector<Tensor>& results, const graph::Executor::OutputReady& ready) {
  if (ready)
    for (size_t k = 0; k < results.size(); ++k) ready(k, results[k]);
}
}  // namespace

Function::Function(TracedFn fn, FunctionOptions opts) : state_(std::make_shared<State>()) {
  if (!fn) throw InvalidArgumentError("kiln::function: the callable is empty");
  if (opts.passes.level < 0) throw InvalidArgumentError("kiln::function: passes.level must be >= 0");
  state_->fn = std::move(fn);
  state_->opts = std::move(opts);
}

Function function(TracedFn fn, FunctionOptions opts) { return Function(std::move(fn), std::move(opts)); }

const TracedFn& Function::callable() const { return state_->fn; }
const FunctionOptions& Function::options() const { return state_->opts; }

int Function::num_traces() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->traces;
}

ConcreteFunction& Function::concrete(const std::vector<Tensor>& args) {
  State& s = *state_;
  if (s.opts.input_signature) check_signature(s.opts, args);
  for (size_t i = 0; i < args.size(); ++i)
    if (!args[i].defined()) throw InvalidArgumentError(s.opts.name + ": argument " + std::to_string(i) + " is undefined");
  const std::string key = s.opts.input_signature ? "signature" : signature_key(args);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.concrete.find(key);
  if (it != s.concrete.end()) return *it->second;
  graph::Graph g = graph::trace(s.fn, args);
  ++s.traces;
  return *s.concrete.emplace(key, std::make_unique<ConcreteFunction>(std::move(g), s.opts)).first->second;
}

std::vector<Tensor> Function::operator()(const std::vector<Tensor>& args, const graph::Executor::OutputReady& ready) {
  State& s = *state_;
  if (s.opts.input_signature) check_signature(s.opts, args);
  ConcreteFunction* last = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.last && graph::detail::same_metas(s.last_metas, args)) last = s.last;
  }
  if (last) return (*last)(args, ready);
  const std::string exact = signature_key(args);
  {
    std::unique_lock<std::mutex> lock(s.mu);
    const std::string key = s.opts.input_signature ? "signature" : exact;
    // A shape traced on its own (see below) first, then the pinned trace.
    auto it = s.concrete.find(exact);
    if (it == s.concrete.end()) it = s.concrete.find(key);
    if (it == s.concrete.end()) {
      // First call for this signature: the traced run is the call.
      for (size_t i = 0; i < args.size(); ++i)
        if (!args[i].defined()) throw InvalidArgumentError(s.opts.name + ": argument " + std::to_string(i) + " is undefined");
      std::vector<Tensor> results;
      graph::Graph g = graph::trace(s.fn, args, &results);
      ++s.traces;
      s.concrete.emplace(key, std::make_unique<ConcreteFunction>(std::move(g), s.opts));
      lock.unlock();
      give_all(results, ready);
      return results;
    }
    ConcreteFunction* f = it->second.get();
    if (!s.opts.input_signature || it->first == exact) {
      s.last_metas = graph::detail::metas_of(args);
      s.last = f;
      lock.unlock();
      return (*f)(args, ready);
    }
    lock.unlock();
    std::vector<Tensor> results;
    bool ran = false;
    try {
      results = (*f)(args);  // (`ready` once it succeeded: a retrace would give them again)
      ran = true;
    } catch (const InvalidArgumentError&) {
      // The pinned trace fixed a dimension the signature leaves open: trace this shape.
    }
    if (ran) {
      give_all(results, ready);
      return results;
    }
  }
  std::unique_lock<std::mutex> lock(s.mu);
  std::vector<Tensor> results;
  graph::Graph g = graph::trace(s.fn, args, &results);
  ++s.traces;
  s.concrete.emplace(exact, std::make_unique<ConcreteFunction>(std::move(g), s.opts));
  lock.unlock();
  give_all(results, ready);
  return results;
}

}  // namespace kiln
