#pragma once
// NCCL collectives over CUDA tensors (libkiln_cuda; link kiln::kiln_cuda to use it).
//
// A Communicator is one rank of a group of GPUs. In one process, for_devices() makes a
// group over several logical CUDA devices (ncclCommInitAll); across processes each
// rank makes its own from a UniqueId that rank 0 creates and sends to the others by
// any means (ncclCommInitRank). Collectives are enqueued on the device's stream (the
// one every kiln kernel uses), so they are ordered with the kernels before and after
// them and return without waiting.
//
// In one process driving several GPUs, a collective must be called on every rank's
// communicator before any of them can finish: use the vector overloads below, which
// wrap the per-rank calls in one NCCL group.
//
// Errors: no CUDA device, a tensor on the wrong device or of an unsupported dtype is
// an InvalidArgumentError / FailedPreconditionError; NCCL failures are InternalError
// with NCCL's message. Thread-safety: one communicator must not be used from two
// threads at once.
#include <array>
#include <memory>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::cuda {

enum class ReduceOp { kSum, kProd, kMax, kMin, kAvg };

struct UniqueId {
  std::array<char, 128> bytes{};
  static UniqueId create();  // ncclGetUniqueId (rank 0)
};

class Communicator {
 public:
  // One rank of a multi-process group of `nranks`, on logical CUDA device `device`.
  Communicator(const UniqueId& id, int nranks, int rank, int device);
  // One communicator per listed logical CUDA device, forming one group (rank i = devices[i]).
  static std::vector<Communicator> for_devices(const std::vector<int>& devices);
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  int rank() const;
  int size() const;
  Device device() const;

  // In place: every rank's `t` becomes the reduction over the ranks.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::kSum);
  // In place: every rank's `t` becomes root's.
  void broadcast(Tensor& t, int root);

 private:
  Communicator() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The same collective on every communicator of an in-process group, tensors[i] on
// comms[i]'s device (one NCCL group call).
void all_reduce(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::kSum);
void broadcast(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, int root);

}  // namespace kiln::cuda
