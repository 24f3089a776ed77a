#pragma once
// kiln::function: eager to write, compiled to run (tf.function).
//
//   kiln::Function f = kiln::function([&](const std::vector<Tensor>& x) {
//     return std::vector<Tensor>{ops::relu(ops::matmul(x[0], w.value()) + b.value())};
//   });
//   auto y = f({x});   // first call: traces, optimises, plans memory, runs the plan
//   auto z = f({x2});  // same shapes and dtypes: runs the plan only
//
// Tracing runs the callable once on the real arguments while recording every op it
// executes (through the op registry's observer, so gradient tapes inside the callable
// are traced too and gradients reuse the same vjp rules), every Variable read (the
// variable is captured by reference: later calls see its current value) and every
// Variable assignment (replayed in order after the outputs). Tensors that no traced op
// produced and that are not arguments or variables are captured by value as constants,
// and so are host values: a number read with item() during tracing, or an attr computed
// from one, is fixed in the trace (as Python values are in tf.function).
//
// One concrete function per input signature (dtypes and shapes); a call with new ones
// traces again. An explicit `input_signature` (-1: any size) pins the signature: calls
// that do not match it throw InvalidArgumentError, and calls that differ only in -1
// dimensions reuse the trace (its ops re-infer their shapes) unless the trace fixed
// such a dimension (e.g. a reshape to the traced batch size), in which case it is
// traced again for that shape.
//
// Random ops (random_uniform, dropout, ...) draw fresh numbers from the default
// generator on every run of the trace, as stateful random ops do in tf.function
// (kiln::set_seed makes a sequence of runs reproducible); a draw given an explicit
// seed gives the same numbers every run, as it does eagerly. A Dropout layer with its
// own seed draws from the default generator once traced.
//
// Not supported: data-dependent control flow is out of scope (the trace follows the
// branch the first call took; no error is possible because the branch is taken on
// the host).
//
// After tracing, the graph goes through the pass pipeline (passes.h) and the executor
// (executor.h). KILN_DUMP_GRAPH=dir writes the graph before and after every pass as
// text and Graphviz DOT.
//
// Thread-safety: a Function may be called from several threads; tracing is
// serialised.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/tensor_spec.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/passes.h"

namespace kiln {

struct FunctionOptions {
  std::optional<std::vector<TensorSpec>> input_signature;
  // The passes run on each traced graph (level, mixed precision, dumps); the name
  // below replaces passes.name.
  graph::PassOptions passes;
  std::string name = "function";
};

using TracedFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// One traced signature: the traced graph, the optimised one and its executor.
class ConcreteFunction {
 public:
  ConcreteFunction(graph::Graph traced, const FunctionOptions& opts);
  const graph::Graph& traced_graph() const { return traced_; }
  const graph::Graph& graph() const { return executor_->graph(); }
  graph::Executor& executor() { return *executor_; }
  std::vector<Tensor> operator()(const std::vector<Tensor>& args, const graph::Executor::OutputReady& ready = nullptr) {
    return executor_->run(args, ready);
  }

 private:
  graph::Graph traced_;
  std::unique_ptr<graph::Executor> executor_;
};

class Function {
 public:
  explicit Function(TracedFn fn, FunctionOptions opts = {});
  // `ready` (graph::Executor::run): each result as soon as it is computed, once each; a
  // call that traces gives them all after its traced run.
  std::vector<Tensor> operator()(const std::vector<Tensor>& args, const graph::Executor::OutputReady& ready = nullptr);
  // The concrete function for these arguments (tracing it on them if new: the call
  // then also runs the callable once).
  ConcreteFunction& concrete(const std::vector<Tensor>& args);
  int num_traces() const;
  // What the function was made from (the model exporter traces it again).
  const TracedFn& callable() const;
  const FunctionOptions& options() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

Function function(TracedFn fn, FunctionOptions opts = {});

namespace graph {
// Runs fn on args while recording it; returns the graph (outputs = fn's results).
// Throws InvalidArgumentError for undefined
// arguments or results.
Graph trace(const TracedFn& fn, const std::vector<Tensor>& args, std::vector<Tensor>* results = nullptr);
}  // namespace graph

}  // namespace kiln
