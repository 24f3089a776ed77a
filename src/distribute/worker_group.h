#pragma once
// The processes (workers) of a multi-worker job and the collectives among them, on host
// memory: GlooWorkerGroup (gloo_worker_group.h: TCP, with timeouts) or, under mpirun,
// MPI (the libkiln_mpi plugin, src/distribute_mpi/: OpenMPI's shared-memory and TCP
// transports, 2-7x faster on one host; docs/perf-decisions/031). connect() chooses.
// Every worker calls the same collectives in the same order. Thread-safety: one call at a
// time per group.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/strategy.h"

namespace kiln::distribute {

class WorkerGroup {
 public:
  // Connects this worker to the others of `cluster` (returns when every one has joined;
  // DeadlineExceededError / UnavailableError after `timeout`). kAuto: MPI when mpirun
  // launched the job and the MPI plugin loads, else Gloo; kMpi where that is not so is a
  // FailedPreconditionError saying why.
  static std::unique_ptr<WorkerGroup> connect(const ClusterSpec& cluster, std::chrono::milliseconds timeout,
                                              Collectives backend = Collectives::kAuto);
  virtual ~WorkerGroup();
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;  // "gloo", "mpi"
  // In place: every worker's tensors (host, f32 or f64, the same shapes everywhere)
  // become their sum over the workers.
  virtual void all_reduce_sum(std::vector<Tensor>& tensors) = 0;
  // In place: every worker's tensors become worker `root`'s.
  virtual void broadcast(std::vector<Tensor>& tensors, int root) = 0;
  // The bytes of `value` from every worker, in rank order (configuration checks).
  virtual std::vector<std::string> all_gather(const std::string& value) = 0;
  virtual void barrier() = 0;

 protected:
  explicit WorkerGroup(const ClusterSpec& cluster);  // InvalidArgumentError: a rank outside [0, size)
  // The elements of `tensors` of dtype `dt`, and their bytes copied to / from one flat
  // buffer in order (one collective a step, not one a tensor).
  static int64_t elements_of(const std::vector<Tensor>& tensors, DType dt);
  static void pack(const std::vector<Tensor>& tensors, DType dt, char* flat);
  static void unpack(const char* flat, DType dt, std::vector<Tensor>& tensors);
  // The first byte of the tensors of dtype `dt` where they lie back to back in memory,
  // in order (one buffer a collective can work on in place), else null.
  static char* contiguous(std::vector<Tensor>& tensors, DType dt);
  int rank_, size_;
};

}  // namespace kiln::distribute
