#pragma once
// Collectives among the replica threads of one process (a strategy's LocalCollective):
// a reusable barrier that can be aborted, and an all-reduce over host memory (CPU
// replicas) or through the devices' own collectives (GPU replicas: NCCL,
// kiln/core/device_group.h). Every replica calls the same sequence of operations; one
// that fails calls abort(), which wakes the others with CancelledError instead of leaving
// them waiting forever.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/core/device_group.h"
#include "kiln/core/tensor.h"

namespace kiln::distribute {

class WorkerGroup;

class LocalCollective {
 public:
  // `workers`: the other processes of a multi-worker job (null: none); all_reduce then
  // sums across them too (local replica 0 runs the cross-worker collective). `devices`:
  // the replicas' devices' collectives (GPU replicas), null for CPU replicas; for GPU
  // replicas of a multi-worker job it spans every worker's (and `workers` is not used).
  LocalCollective(int replicas, WorkerGroup* workers, std::unique_ptr<DeviceGroup> devices = nullptr);
  ~LocalCollective();

  int replicas() const { return n_; }
  // Whether the cross-worker part waits on a network without taking a core (Gloo's TCP).
  bool waits_on_network() const;
  // Returns when all replicas have called it (CancelledError once aborted).
  void barrier();
  // Replica r's part of an all-reduce: `tensors` become sum over replicas of
  // weight_q * tensors_q, added in replica order. Each replica adds a slice of every
  // tensor and writes it to every replica's result (on that replica's device), so no
  // replica copies the whole result afterwards.
  // GPU replicas: each scales its tensors by its weight and the devices' collective sums
  // them (NCCL: every replica gets the same result; the order of the additions is NCCL's).
  // `patient`: a communication thread's call (PendingAllReduce), beside the replicas'
  // compute: its barriers spin briefly before they sleep, not for a millisecond.
  void all_reduce(int r, std::vector<Tensor>& tensors, double weight, bool patient = false);
  // Every current and later wait throws CancelledError(reason) until reset().
  void abort(const std::string& reason);
  // Ready for the next run (after every replica has returned).
  void reset();

 private:
  // The barrier; `last` runs under the lock by the last thread to arrive, before the
  // others wake (and may abort with an error message).
  template <class F>
  void arrive(F&& last, int spins = kSpins);
  void barrier(int spins);
  static constexpr int kSpins = 20000, kPatientSpins = 200;  // pauses before sleeping
  void throw_if_aborted() const;

  const int n_;
  WorkerGroup* workers_;
  std::unique_ptr<DeviceGroup> devices_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  // Advanced by the last arrival (under mu_); waiters spin on it briefly before sleeping.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> aborted_{false};
  std::string reason_;
  // The all-reduce in progress: every replica's tensors (handles: their storage lives
  // while any replica may read it, even when the caller's vector is gone after an
  // abort) and weight, and the result.
  std::vector<std::vector<Tensor>> inputs_;
  std::vector<double> weights_;
  std::vector<std::vector<Tensor>> results_;  // per replica, on its tensors' devices
};

}  // namespace kiln::distribute
