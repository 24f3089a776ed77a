#pragma once
// Runs a Graph (graph.h) with the same kernels as eager mode.
//
// A plan is made once per distinct set of input shapes and dtypes: every op node's
// outputs are re-inferred (so a graph traced at one batch size runs at another when
// its attrs do not pin the batch), kernels are looked up, and a static memory plan
// gives every intermediate an offset in one arena: liveness analysis frees a buffer
// after its last reader, and later buffers reuse the space (best fit). On the CPU an
// op whose output may overwrite an input (OpDef::overwritable: unary and binary
// arithmetic, relu_grad, fused_elementwise) writes its result in place over such an
// input of the same shape and dtype that nothing reads after it. `reshape` outputs are
// views of their input. Graph outputs and assigned values get buffers of their own
// (they outlive the run), except an assigned value that an op may write over the very
// variable it replaces (an optimizer update: param' over param, m' over m) when every
// other read of that variable runs before it and the graph neither returns it nor
// assigns it elsewhere: a run whose variable buffer is exclusive
// (Variable::value_is_exclusive: nobody kept its value) updates it in place, as
// TensorFlow's ApplyAdam does; otherwise that run writes a new buffer, so a kept value
// never changes. A run then allocates nothing per op: the arena is reused from run to
// run, and a train step's variables keep their addresses. Random ops draw fresh numbers for every run
// (OpDef::redraw, on a per-run copy of their attrs); random nodes that had the same
// op and attrs in the trace (a dropout and the dropout of its gradient) share one draw.
//
// Devices: a run executes on the device of the graph's variables, else on that of its
// first input not on the CPU, else on cpu:0; the plan (kernels, arena, copies of the
// constants) is per device. Inputs on another device type are copied to that device
// (logical CPU devices all hold host memory: their tensors are read where they are);
// variables on several devices are an InvalidArgumentError. On CUDA every kernel is enqueued on the
// device's stream and a run returns without waiting for them (reading an output on
// the host waits).
//
// Thread-safety: run() may be called from several threads at once; concurrent runs of
// one plan each take an arena of their own (kept in a pool: the arenas in memory are
// as many as the most runs that were ever concurrent). At most kMaxPlans plans are
// cached (oldest evicted first). Graphs with variable assignments should not be run
// concurrently (the assignments race, as they would in eager code).
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kiln/core/tensor_spec.h"
#include "kiln/graph/graph.h"

namespace kiln::graph {

struct MemoryPlanStats {
  int64_t arena_bytes = 0;   // the planned arena
  int64_t naive_bytes = 0;   // the sum of every intermediate buffer (no reuse)
  int64_t num_buffers = 0;   // intermediates placed in the arena
  int64_t pinned_bytes = 0;  // outputs and assigned values (own allocations)
  int64_t in_place = 0;      // intermediates written over an input's buffer
  int64_t updated_in_place = 0;  // assigned values written over their variable's buffer
                                 // (when it is exclusive; not in pinned_bytes)
};

class Executor {
 public:
  explicit Executor(Graph graph);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Called by run() with each output (its index in graph().outputs, and the tensor run()
  // returns for it) as soon as the node that makes it has run, while the rest of the
  // graph still runs: once per output, on the calling thread, in the schedule's order.
  // The tensor is final (an output has a buffer of its own) and must not be written.
  // (A strategy starts all-reducing the first gradients while the backward pass goes
  // on.) On CUDA the tensor's kernels are enqueued, not finished: read it in the stream's order.
  using OutputReady = std::function<void(size_t index, const Tensor& value)>;

  // Runs the graph on `inputs` (graph.num_inputs tensors) and applies its
  // assignments; returns the outputs. Throws InvalidArgumentError when the inputs do
  // not fit the graph (count, dtype, or shapes its ops reject), and what `ready` throws.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const OutputReady& ready = nullptr);
  // The memory plan for inputs of these shapes and dtypes (planned if new).
  MemoryPlanStats memory_stats(const std::vector<TensorMeta>& inputs);
  // The outputs' shapes and dtypes for inputs of these (planned if new); throws as run().
  std::vector<TensorMeta> output_metas(const std::vector<TensorMeta>& inputs);
  const Graph& graph() const { return graph_; }
  static constexpr size_t kMaxPlans = 64;

 private:
  struct Plan;
  std::shared_ptr<Plan> plan_for(const std::vector<TensorMeta>& inputs, Device device = Device::cpu());
  // plan_for for a run: the last run's plan when the inputs have its shapes and dtypes
  // (compared in place: no key string or meta list per run).
  std::shared_ptr<Plan> plan_for_run(const std::vector<Tensor>& inputs, Device device);
  // plan_for's phases, in order: output shapes and kernels; the schedule and buffer
  // liveness (with the pinned outputs and in-place variable updates); arena offsets.
  struct Liveness;
  void plan_shapes(Plan& p, const std::vector<TensorMeta>& inputs, const Plan* previous) const;
  Liveness plan_liveness(Plan& p) const;
  void plan_offsets(Plan& p, const Liveness& l) const;
  // Marks the assigned values a run may write over their variables' buffers.
  void plan_variable_updates(Plan& p, const std::vector<size_t>& stage_of) const;
  // Where a run with these inputs executes (see above).
  Device run_device(const std::vector<Tensor>& inputs) const;
  Graph graph_;
  std::vector<int> redraw_from_;  // per node: the random node whose per-run draw it uses (-1: none)
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Plan>> plans_;
  std::vector<std::string> plan_order_;  // insertion order, for eviction
  std::vector<TensorMeta> last_metas_;   // the last run's inputs, device and plan (under mu_)
  Device last_device_;
  std::shared_ptr<Plan> last_plan_;
};

}  // namespace kiln::graph
