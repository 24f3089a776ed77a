#pragma once
// The processes of a multi-worker job connected by Gloo (Debian's libgloo, the library
// PyTorch's CPU collectives use): full-mesh TCP pairs made at construction through the
// rendezvous store (TcpStore on the coordinator, or Gloo's FileStore for mpirun on one
// host). Collectives run on host memory; each has the group's timeout, after which it
// fails with UnavailableError naming the operation and the cause (a worker that died or
// hangs), never a hang: the message names the lost worker's rank where Gloo's error names
// its address. Constructing one sets SIGPIPE to ignored (unless the program has its own
// handler), so a write to a dead peer is an error, not the end of the process.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "distribute/worker_group.h"
#include "kiln/distribute/cluster.h"

namespace gloo {
class Algorithm;
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace kiln::distribute {

// The hot collectives (the per-step all-reduce and all-gather) use Gloo's algorithm
// classes over persistent buffers, made once per size: halving-doubling for the
// all-reduce (2 workers on this VM, 1.7 MB: 1.1 ms, ring 2.1 ms; 16 floats: 76 us against
// 334 us, with outliers of 31 ms, for gloo::allreduce's per-call buffers;
// docs/perf-decisions/031).
class GlooWorkerGroup final : public WorkerGroup {
 public:
  GlooWorkerGroup(const ClusterSpec& cluster, std::chrono::milliseconds timeout);
  ~GlooWorkerGroup() override;
  std::string backend() const override { return "gloo"; }
  void all_reduce_sum(std::vector<Tensor>& tensors) override;
  void broadcast(std::vector<Tensor>& tensors, int root) override;
  std::vector<std::string> all_gather(const std::string& value) override;
  void barrier() override;

 private:
  template <class F>
  void guarded(const char* what, F&& op);
  // Every peer's transport addresses toward this worker as Gloo's errors print them
  // ("[host]:port": the pair's listening address and its connection's own end), by rank;
  // the rank a Gloo error `message` is about, or -1 when it cannot tell.
  void learn_peer_addresses();
  int peer_named_in(const std::string& message) const;
  // A Gloo algorithm over persistent buffers, made the first time its key is used (every
  // worker makes the same ones in the same order: they call the same collectives).
  struct Cached;
  Cached& cached(const std::string& key, const std::function<void(Cached&)>& make);
  std::chrono::milliseconds timeout_;
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<gloo::Context> context_;
  std::map<std::string, std::unique_ptr<Cached>> cache_;
  std::vector<std::vector<std::string>> peer_addresses_;
  uint32_t tag_ = 0;
};

}  // namespace kiln::distribute
