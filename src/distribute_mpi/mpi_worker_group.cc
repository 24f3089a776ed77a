// libkiln_mpi: the collectives of a multi-worker job launched by mpirun, over MPI
// (Debian's OpenMPI: shared memory between the processes of one host, TCP between
// hosts). A plugin that libkiln loads under mpirun (src/distribute/worker_group.cc), so
// that nothing else links MPI. MPI is initialised here unless the program did
// (MPI_THREAD_SERIALIZED: the calls come from the main thread and from a replica thread,
// never at once) and finalised at exit. MPI has no timeouts: when a worker dies, mpirun
// stops the job; a worker that stops or hangs would stall the others forever, so a
// watchdog thread ends the job (MPI_Abort, after saying which collective waited how
// long) when a collective has not returned within the group's timeout.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distribute/worker_group.h"
#include "kiln/core/error.h"

namespace kiln::distribute {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw UnavailableError(std::string("MPI: ") + what + " failed: " + std::string(text, static_cast<size_t>(len)));
}

// Ends the job when a collective outlives the timeout (MPI's calls cannot be cancelled).
// A collective only stores its name and start time (two atomic stores: a 4 KiB
// all-reduce takes 4 us, and waking a thread per call cost as much); the watchdog looks
// every eighth of the timeout (10 ms to 1 s), so it fires within 1.125 x the timeout.
class Watchdog {
 public:
  Watchdog(int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank),
        size_(size),
        timeout_(timeout),
        period_(std::clamp(timeout / 8, std::chrono::milliseconds(10), std::chrono::milliseconds(1000))),
        thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Watches the collective `what` while the returned guard lives (one at a time).
  struct Guard {
    Watchdog* w;
    ~Guard() { w->what_.store(nullptr, std::memory_order_release); }
  };
  Guard watch(const char* what) {
    started_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    what_.store(what, std::memory_order_release);
    return Guard{this};
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period_, [&] { return stop_; })) {
      const char* what = what_.load(std::memory_order_acquire);
      if (!what) continue;
      const auto started = std::chrono::steady_clock::time_point(
          std::chrono::steady_clock::duration(started_.load(std::memory_order_relaxed)));
      if (std::chrono::steady_clock::now() - started < timeout_ || what_.load(std::memory_order_acquire) != what)
        continue;
      std::fprintf(stderr,
                   "kiln: Unavailable: worker %d of %d: %s did not complete within %.3g s over MPI: another worker "
                   "died, hangs or lost the network; ending the job (MPI_Abort)\n",
                   rank_, size_, what, static_cast<double>(timeout_.count()) / 1000.0);
      std::fflush(stderr);
      // (Called while another thread waits inside MPI: beyond what MPI_THREAD_SERIALIZED
      // promises, but the way out OpenMPI provides; tests/cli/train_multi_worker.sh.)
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  const int rank_, size_;
  const std::chrono::milliseconds timeout_, period_;
  std::atomic<const char*> what_{nullptr};
  std::atomic<std::chrono::steady_clock::rep> started_{0};
  std::mutex mu_;  // (stop_ and the wait between looks)
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class MpiWorkerGroup final : public WorkerGroup {
 public:
  MpiWorkerGroup(const ClusterSpec& cluster, std::chrono::milliseconds timeout)
      : WorkerGroup(cluster), watchdog_(cluster.rank, cluster.size, timeout) {}
  std::string backend() const override { return "mpi"; }

  void all_reduce_sum(std::vector<Tensor>& tensors) override {
    for (DType dt : {DType::kF32, DType::kF64}) {
      const int64_t n = elements_of(tensors, dt);
      if (n == 0) continue;
      if (n > INT32_MAX) throw InvalidArgumentError("MPI all-reduce of more than 2^31 elements");
      // In place where the tensors lie back to back (a strategy's gradients do), else
      // through a flat copy.
      char* data = contiguous(tensors, dt);
      if (!data) {
        flat_.resize(static_cast<size_t>(n) * dtype_size(dt));
        pack(tensors, dt, flat_.data());
      }
      auto guard = watchdog_.watch("all_reduce");
      check(MPI_Allreduce(MPI_IN_PLACE, data ? data : flat_.data(), static_cast<int>(n),
                          dt == DType::kF32 ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
            "all_reduce");
      if (!data) unpack(flat_.data(), dt, tensors);
    }
  }

  void broadcast(std::vector<Tensor>& tensors, int root) override {
    auto guard = watchdog_.watch("broadcast");
    for (Tensor& t : tensors)
      if (t.nbytes() > 0)
        check(MPI_Bcast(t.raw_data(), static_cast<int>(t.nbytes()), MPI_BYTE, root, MPI_COMM_WORLD), "broadcast");
  }

  std::vector<std::string> all_gather(const std::string& value) override {
    auto guard = watchdog_.watch("all_gather");
    const int mine = static_cast<int>(value.size());
    std::vector<int> lens(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
    check(MPI_Allgather(&mine, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "all_gather");
    int total = 0;
    for (size_t r = 0; r < lens.size(); ++r) {
      offsets[r] = total;
      total += lens[r];
    }
    std::string all(static_cast<size_t>(total), '\0');
    check(MPI_Allgatherv(value.data(), mine, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR,
                         MPI_COMM_WORLD),
          "all_gather");
    std::vector<std::string> out;
    for (size_t r = 0; r < lens.size(); ++r)
      out.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lens[r])));
    return out;
  }

  void barrier() override {
    auto guard = watchdog_.watch("barrier");
    check(MPI_Barrier(MPI_COMM_WORLD), "barrier");
  }

 private:
  std::vector<char> flat_;
  Watchdog watchdog_;
};

void finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace
}  // namespace kiln::distribute

// The plugin's entry (worker_group.cc): a group of MPI_COMM_WORLD, which must be the
// cluster's (same size and rank), its collectives watched with `timeout_ms`, or null with
// the reason in `error`.
extern "C" kiln::distribute::WorkerGroup* kiln_mpi_connect(const kiln::distribute::ClusterSpec* cluster,
                                                           int64_t timeout_ms, std::string* error) {
  using namespace kiln::distribute;
  try {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
      if (provided < MPI_THREAD_SERIALIZED)
        throw kiln::UnavailableError("this MPI does not support calls from several threads (MPI_THREAD_SERIALIZED)");
      std::atexit(finalize);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors as exceptions, not aborts
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != cluster->rank || size != cluster->size)
      throw kiln::InvalidArgumentError(kiln::detail::str_cat("MPI says rank ", rank, " of ", size, ", the launcher's ",
                                                             "variables rank ", cluster->rank, " of ", cluster->size));
    return new MpiWorkerGroup(*cluster, std::chrono::milliseconds(timeout_ms));
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
