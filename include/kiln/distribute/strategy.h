#pragma once
// Distribution strategies (tf.distribute): data-parallel training on several devices.
//
//   auto strategy = distribute::MirroredStrategy::create({parse_device("cpu:0"), parse_device("cpu:1")});
//   distribute::StrategyScope scope(strategy);   // or CompileOptions::strategy
//   model->compile({...});                       // the model trains under the strategy
//   model->fit(x, y, {.batch_size = 128});       // global batch 128: 64 rows per replica
//
// MirroredStrategy: one process, N devices, one replica each. A model compiled under it
// has its variables mirrored (kiln/autodiff/variable.h: one copy per device, kept
// equal). Each training step splits the global batch into N shards of rows (sizes
// differ by at most one, the first shards larger; a replica may get none when the batch
// has fewer rows than replicas), every replica runs forward and backward on its shard at
// the same time on a thread of its own, the gradients are all-reduced, weighted by shard
// size (so the result is the gradient of the whole batch's mean loss), and every
// replica applies the same optimizer update to its copies. Results are deterministic:
// reductions add the replicas' contributions in replica order, whatever thread finishes
// first; against one device they differ by float summation order only.
//
// Replica threads: run() executes on N threads that live as long as the strategy. Each
// is in ReplicaScope(r) (so mirrored variables resolve to copy r) and caps its
// parallel regions at max(1, num_threads() / N) threads (ThreadLimitScope): N replicas
// share the intra-op pool's cores rather than each taking all of them. On a CPU, give
// a strategy as many logical CPU devices as there are cores for the most speed
// (KILN_CPU_LOGICAL_DEVICES or config::set_logical_device_configuration; docs/devices.md).
//
// Collectives across the replicas of one process add in host memory (CPU devices). GPU
// replicas (NCCL) and several processes (MultiWorkerMirroredStrategy) are not built yet:
// create() refuses devices other than CPUs with UnimplementedError.
//
// Errors: when one replica throws, the collectives the others wait in end with
// CancelledError and run() rethrows the first replica's error once all have stopped;
// the strategy stays usable. Thread-safety: one run() at a time per strategy.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autodiff/variable.h"
#include "kiln/core/tensor.h"

namespace kiln::distribute {

enum class ReduceOp { kSum, kMean };

class LocalCollective;

// What a replica's function sees inside Strategy::run.
class ReplicaContext {
 public:
  int replica_id() const { return replica_; }
  int num_replicas() const { return num_replicas_; }
  const Device& device() const { return device_; }
  // Every replica calls it with the same number of tensors, of the same shapes and
  // float dtypes (f32, f64), in the same order; each tensor is replaced by the
  // reduction over the replicas (a new tensor on the same device): sum of
  // weight_r * t_r (kSum), or that divided by the number of replicas (kMean). Mismatched
  // calls are an InvalidArgumentError in every replica.
  void all_reduce(std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::kSum, double weight = 1.0);
  // Returns when every replica has called it.
  void barrier();

 private:
  friend class Strategy;
  ReplicaContext(int replica, int n, Device device, LocalCollective* collective)
      : replica_(replica), num_replicas_(n), device_(device), collective_(collective) {}
  int replica_, num_replicas_;
  Device device_;
  LocalCollective* collective_;
};

class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;
  virtual std::string name() const = 0;

  int num_replicas_in_sync() const { return static_cast<int>(devices_.size()); }
  // Replica r's device.
  const std::vector<Device>& devices() const { return devices_; }

  // Runs fn on every replica at once (see the top of this file) and returns when all
  // have finished; rethrows the first error of a replica.
  void run(const std::function<void(ReplicaContext&)>& fn);
  // The reduction of per-replica values (one per replica, same shape, any device): on
  // the host, in replica order. kMean divides by the number of replicas.
  Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica) const;
  // Gives every variable one copy per replica device, each equal to copy 0 (Variable::mirror).
  void mirror(const std::vector<Variable>& vars) const;
  // Splits the rows (dim 0) of every tensor of a batch into one shard per replica (see
  // the top of this file); the tensors must agree on their row count
  // (InvalidArgumentError). shards[r][i] is tensor i's rows for replica r, on replica r's
  // device (rows 0 x ... when the replica gets none).
  std::vector<std::vector<Tensor>> split_batch(const std::vector<Tensor>& batch) const;
  // The row count of each replica's shard of a batch of `rows`.
  std::vector<int64_t> shard_rows(int64_t rows) const;

 protected:
  explicit Strategy(std::vector<Device> devices);

 private:
  class Threads;
  std::vector<Device> devices_;
  std::unique_ptr<LocalCollective> collective_;
  std::unique_ptr<Threads> threads_;
};
using StrategyPtr = std::shared_ptr<Strategy>;

class MirroredStrategy final : public Strategy {
 public:
  // `devices`: distinct CPU logical devices that exist (NotFoundError otherwise), at
  // least one; empty: cpu:0 alone. InvalidArgumentError for a repeated device.
  static std::shared_ptr<MirroredStrategy> create(std::vector<Device> devices = {});
  // From a comma-separated list ("cpu:0,cpu:1").
  static std::shared_ptr<MirroredStrategy> create(const std::string& devices);
  std::string name() const override { return "mirrored"; }

 private:
  using Strategy::Strategy;
};

// The strategy that Model::compile (and code asking for one) picks up on this thread
// while the scope lives (tf.distribute.Strategy.scope()); scopes nest.
class StrategyScope {
 public:
  explicit StrategyScope(StrategyPtr strategy);
  ~StrategyScope();
  StrategyScope(const StrategyScope&) = delete;
  StrategyScope& operator=(const StrategyScope&) = delete;
  // The innermost scope's strategy on this thread, or null.
  static StrategyPtr current();

 private:
  StrategyPtr previous_;
};

}  // namespace kiln::distribute
