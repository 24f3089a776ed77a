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
// Collectives across the replicas of one process add in host memory (CPU devices), or
// for GPU replicas (cuda:0,cuda:1,...) go through NCCL (the CUDA plugin's device group,
// kiln/core/device_group.h: one communicator per GPU, each driven by its replica's
// thread; every replica gets the same sum, in NCCL's order of additions). Across workers
// the GPU replicas of the whole job form one NCCL communicator (its unique id sent from
// the chief through the workers' collectives), so their gradients never pass the host;
// every worker needs as many replicas, of one device type (InvalidArgumentError).
//
// MultiWorkerMirroredStrategy: N processes (workers, kiln/distribute/cluster.h), each
// with its local replicas; replica r of worker w is replica w x local + r of the job.
// Every worker passes the same global batch (same data, same shuffle seed) and takes its
// replicas' shards of it, or, fitting a Dataset, reads its own part of each global batch
// (data::Dataset::shard_for_worker: by files or by elements); gradients are reduced in
// the process first, then summed across the workers (Collectives: Gloo, or MPI under
// mpirun), so every replica of every worker applies the same update. Variables start from
// the chief's (worker 0's) values, broadcast when they are mirrored. Over Gloo a worker
// that dies or hangs makes the others fail with UnavailableError within the timeout
// instead of waiting forever; under mpirun, mpirun stops the job when a worker dies.
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

namespace kiln {
class WorkPool;  // (src/core/work_pool.h)
}  // namespace kiln

namespace kiln::distribute {

enum class ReduceOp { kSum, kMean };

// The collectives among the workers of a MultiWorkerMirroredStrategy.
enum class Collectives {
  kAuto,  // MPI under mpirun where the MPI plugin loads, else Gloo
  kGloo,  // Gloo over TCP: every launcher; failures end in an error within the timeout
  kMpi,   // MPI (mpirun only): shared memory between the workers of one host; mpirun stops
          // the job when a worker dies, a watchdog (MPI_Abort) when a collective outlives
          // the timeout
};

// How the replicas all-reduce the gradients of a training step
// (tf.distribute.experimental.CommunicationOptions; PyTorch DDP's buckets).
struct CommunicationOptions {
  // The gradients are packed into buckets of at least this many bytes (the last one may
  // be smaller), in the order the backward pass makes them (the last layer's first);
  // each bucket is one all-reduce. <= 0: one bucket, all gradients in one all-reduce.
  int64_t bytes_per_pack = int64_t{1} << 20;
  // kOn: each bucket's all-reduce starts (on a communication thread of the replica's) as
  // soon as the backward pass has made its gradients, while the pass goes on; kOff: the
  // buckets are reduced one after the other once the pass has ended; kAuto: on where the
  // all-reduce waits for a network (Gloo between workers), off where it is the work of
  // the cores that compute (replicas of one process summing in memory, MPI's shared
  // memory and its polling): there a thread beside the replicas takes their cores
  // (docs/benchmarks.md, distributed training). GPU replicas reduce after the pass. The
  // results are the same bits either way.
  enum class Overlap { kAuto, kOn, kOff };
  Overlap overlap = Overlap::kAuto;
};

class LocalCollective;
class WorkerGroup;
struct ClusterSpec;

// An all-reduce whose tensors are given one by one, as they are computed
// (ReplicaContext::start_all_reduce): every replica gives the same number of tensors,
// tensor i of the same shape and dtype on each (f32 or f64), in any order; they are
// packed into buckets by position (CommunicationOptions::bytes_per_pack: a bucket
// closes once its tensors reach that size, so the buckets are the same on every replica
// whatever the order they were given in) and the buckets are reduced in position order:
// the sums are those of one all-reduce of all the tensors, bit for bit.
class PendingAllReduce {
 public:
  PendingAllReduce(PendingAllReduce&&) noexcept;
  PendingAllReduce& operator=(PendingAllReduce&&) noexcept;
  // When wait() was not reached and buckets are in flight on the communication thread
  // (the replica threw): aborts the replicas' collectives (the others end with
  // CancelledError, as when a replica throws) and waits for those buckets.
  ~PendingAllReduce();
  // Tensor `index` (< count); each is given once (InvalidArgumentError otherwise). Its
  // data must stay as it is until wait() returns.
  void give(size_t index, const Tensor& t);
  // Returns the reductions, by index, once every bucket is done; InvalidArgumentError when
  // a tensor was not given; a collective's error (CancelledError when another replica failed).
  std::vector<Tensor> wait();
  // The buckets so far (every tensor given: all of them).
  size_t num_buckets() const;

 private:
  friend class ReplicaContext;
  struct State;
  explicit PendingAllReduce(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// What a replica's function sees inside Strategy::run.
class ReplicaContext {
 public:
  // The replica's index in the job (worker rank x local replicas + local index), as
  // tf.distribute's replica_id_in_sync_group, and among all replicas of the job.
  int replica_id() const { return first_ + local_; }
  int num_replicas() const { return num_replicas_; }
  // Its index among this process's replicas (indexes per-replica arrays of run()'s caller).
  int local_replica_id() const { return local_; }
  const Device& device() const { return device_; }
  // Every replica calls it with the same number of tensors, of the same shapes and
  // float dtypes (f32, f64), in the same order; each tensor is replaced by the
  // reduction over the replicas (a new tensor on the same device): sum of
  // weight_r * t_r (kSum), or that divided by the number of replicas (kMean). Mismatched
  // calls are an InvalidArgumentError in every replica. Across workers the sum takes
  // every replica of the job.
  void all_reduce(std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::kSum, double weight = 1.0);
  // The same reduction of `count` tensors given one by one (PendingAllReduce), in buckets
  // that start while the caller computes the rest (the strategy's CommunicationOptions).
  // Until wait() returns, the replica runs no other collective (they would interleave
  // with the buckets) unless `may_overlap` is false: the buckets then wait for wait()
  // (a computation with collectives of its own: synchronized BatchNormalization's).
  PendingAllReduce start_all_reduce(size_t count, ReduceOp op = ReduceOp::kSum, double weight = 1.0,
                                    bool may_overlap = true);
  // Returns when every replica of this process has called it.
  void barrier();

 private:
  friend class Strategy;
  ReplicaContext(int local, int first, int n, Device device, LocalCollective* collective,
                 const CommunicationOptions& comm, std::unique_ptr<WorkPool>* comm_thread)
      : local_(local), first_(first), num_replicas_(n), device_(device), collective_(collective), comm_(comm),
        comm_thread_(comm_thread) {}
  int local_, first_, num_replicas_;
  Device device_;
  LocalCollective* collective_;
  CommunicationOptions comm_;
  std::unique_ptr<WorkPool>* comm_thread_;  // the replica's (made at its first overlapped all-reduce)
};

class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;
  virtual std::string name() const = 0;

  // Replicas in the whole job (every worker's).
  int num_replicas_in_sync() const { return num_local_replicas() * num_workers(); }
  // This process's replicas, and local replica r's device.
  int num_local_replicas() const { return static_cast<int>(devices_.size()); }
  const std::vector<Device>& devices() const { return devices_; }
  // Workers (processes) of the job and this one's rank (0: the chief); 1 and 0 in one process.
  int num_workers() const;
  int worker_rank() const;
  bool is_chief() const { return worker_rank() == 0; }
  // Throws InvalidArgumentError on every worker unless every worker passes the same
  // `value` (a configuration: model, batch, dtypes), naming `what` and the first worker
  // that differs from the chief.
  void check_same_on_workers(const std::string& what, const std::string& value) const;
  // Returns when every worker has called it (no-op in one process): Model::fit calls it
  // before the first epoch, so the workers' startup (loading data) does not count in it.
  void sync_workers() const;

  // How gradients are all-reduced (see CommunicationOptions); set between runs.
  const CommunicationOptions& communication_options() const { return comm_; }
  void set_communication_options(const CommunicationOptions& options) { comm_ = options; }

  // Runs fn on every replica at once (see the top of this file) and returns when all
  // have finished; rethrows the first error of a replica. ops::cross_replica_sum inside
  // fn sums over every replica of the job (ReplicaContext::all_reduce).
  void run(const std::function<void(ReplicaContext&)>& fn);
  // The reduction of per-replica values (one per local replica, same shape, any
  // device; across workers too): on the host, in replica order. kMean divides by
  // num_replicas_in_sync().
  Tensor reduce(ReduceOp op, const std::vector<Tensor>& per_replica) const;
  // Gives every variable one copy per local replica device, each equal to copy 0
  // (Variable::mirror); with several workers, copy 0 first becomes the chief's value.
  void mirror(const std::vector<Variable>& vars) const;
  // Splits the rows (dim 0) of every tensor of a batch into one shard per replica and
  // returns this process's: shards[r][i] is tensor i's rows for local replica r, on its
  // device (rows 0 x ... when it gets none). A kJob batch is the global batch, every
  // worker's the same, split among every replica of the job (see the top of this file);
  // a kWorker batch is this worker's own part of it (an auto-sharded Dataset's), split
  // among its local replicas. The tensors must agree on their row count
  // (InvalidArgumentError).
  enum class BatchOf { kJob, kWorker };
  std::vector<std::vector<Tensor>> split_batch(const std::vector<Tensor>& batch, BatchOf of = BatchOf::kJob) const;
  // The row count of each local replica's shard of such a batch of `rows`.
  std::vector<int64_t> shard_rows(int64_t rows, BatchOf of = BatchOf::kJob) const;
  // The sums of every worker's `values` (as many on every worker; `values` in one
  // process); every worker calls it.
  std::vector<int64_t> sum_over_workers(std::vector<int64_t> values) const;
  // Every worker's `local` rows concatenated in worker order, on the host (the job's
  // predictions for a global batch, for metrics). Every worker calls it; one with no rows
  // passes an undefined tensor. `local` itself in one process.
  Tensor all_gather_rows(const Tensor& local) const;

 protected:
  Strategy(std::vector<Device> devices, std::unique_ptr<WorkerGroup> workers);
  const WorkerGroup* workers() const { return workers_.get(); }

 private:
  class Threads;
  std::vector<Device> devices_;
  std::unique_ptr<WorkerGroup> workers_;  // null in one process
  std::unique_ptr<LocalCollective> collective_;
  std::unique_ptr<Threads> threads_;
  CommunicationOptions comm_;
  std::vector<std::unique_ptr<WorkPool>> comm_threads_;  // per local replica, made when first needed
};
using StrategyPtr = std::shared_ptr<Strategy>;

class MirroredStrategy final : public Strategy {
 public:
  // `devices`: distinct devices of one type (CPU logical devices, or GPUs) that exist
  // (NotFoundError otherwise), at least one; empty: cpu:0 alone. InvalidArgumentError for
  // a repeated device or a mix of types; UnimplementedError when GPUs have no collectives
  // (a build without NCCL).
  static std::shared_ptr<MirroredStrategy> create(std::vector<Device> devices = {});
  // From a comma-separated list ("cpu:0,cpu:1").
  static std::shared_ptr<MirroredStrategy> create(const std::string& devices);
  std::string name() const override { return "mirrored"; }

 private:
  using Strategy::Strategy;
};

class MultiWorkerMirroredStrategy final : public Strategy {
 public:
  // Connects this worker to the others of `cluster` (all workers call it; it returns
  // when every one has joined, or throws DeadlineExceededError / UnavailableError after
  // `timeout`); `devices`: this worker's replicas, as MirroredStrategy's; `collectives`:
  // see Collectives (kMpi where mpirun did not launch the job, or the plugin does not
  // load, is a FailedPreconditionError saying why).
  static std::shared_ptr<MultiWorkerMirroredStrategy> create(const ClusterSpec& cluster,
                                                             std::vector<Device> devices = {},
                                                             double timeout_seconds = 60,
                                                             Collectives collectives = Collectives::kAuto);
  std::string name() const override { return "multi_worker_mirrored"; }
  // "gloo" or "mpi": the collectives the workers use.
  std::string collectives() const;

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
