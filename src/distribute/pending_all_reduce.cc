// PendingAllReduce (kiln/distribute/strategy.h): an all-reduce in buckets that start as
// their tensors are given, on the replica's communication thread (a WorkPool of one).
#include <deque>
#include <exception>
#include <mutex>

#include "core/work_pool.h"
#include "distribute/local_collective.h"
#include "kiln/core/error.h"
#include "kiln/core/parallel.h"
#include "kiln/distribute/strategy.h"

namespace kiln::distribute {

struct PendingAllReduce::State {
  LocalCollective* collective = nullptr;
  int local = 0;
  double weight = 1.0;
  int64_t bytes_per_pack = 0;
  WorkPool* thread = nullptr;    // the replica's communication thread; null: the buckets are reduced in wait()
  std::vector<Tensor> given;     // by index
  size_t contiguous = 0;         // indexes [0, contiguous) were given
  size_t packed = 0;             // indexes [0, packed) are in buckets
  int64_t open_bytes = 0;        // of [packed, contiguous)
  bool waited = false;
  std::mutex mu;  // (the fields below: the communication thread writes them)
  std::condition_variable cv;
  std::deque<std::vector<Tensor>> buckets;  // a deque: the thread holds references into it
  size_t done = 0;                          // buckets finished (or failed) on the thread
  std::exception_ptr error;                 // the first bucket's error

  // Closes [packed, end) into a bucket and starts it (or leaves it for wait()).
  void close(size_t end) {
    std::vector<Tensor>* bucket;
    {
      std::lock_guard<std::mutex> lock(mu);
      buckets.emplace_back(given.begin() + static_cast<std::ptrdiff_t>(packed),
                           given.begin() + static_cast<std::ptrdiff_t>(end));
      bucket = &buckets.back();
    }
    packed = end;
    open_bytes = 0;
    if (thread)
      thread->submit([this, bucket] {
        ThreadLimitScope limit(1);  // a collective's copies and sums: never the intra-op pool
        reduce(*bucket, /*patient=*/true);
      });
  }
  void reduce(std::vector<Tensor>& bucket, bool patient) {
    std::exception_ptr e;
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mu);
      failed = error != nullptr;
    }
    if (!failed) {  // after a failed bucket the others are not run (the collective is aborted)
      try {
        collective->all_reduce(local, bucket, weight, patient);
      } catch (...) {
        e = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    // Moved, not copied: this thread keeps no reference to an exception the replica's
    // thread rethrows (the last reference's release would run its destructor here).
    if (e && !error) error = std::move(e);
    e = nullptr;
    ++done;
    cv.notify_all();
  }
  void wait_for_thread() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == buckets.size(); });
  }
};

PendingAllReduce::PendingAllReduce(std::unique_ptr<State> s) : s_(std::move(s)) {}
PendingAllReduce::PendingAllReduce(PendingAllReduce&&) noexcept = default;
PendingAllReduce& PendingAllReduce::operator=(PendingAllReduce&&) noexcept = default;

PendingAllReduce::~PendingAllReduce() {
  if (!s_ || s_->waited || !s_->thread) return;
  bool in_flight;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    in_flight = s_->done < s_->buckets.size();
  }
  if (!in_flight) return;
  // The replica gave up (it threw): a bucket waiting for the other replicas would wait
  // for ever for this one's next ones.
  s_->collective->abort(detail::str_cat("replica ", s_->local, " stopped during an all-reduce"));
  s_->wait_for_thread();
}

void PendingAllReduce::give(size_t index, const Tensor& t) {
  State& s = *s_;
  if (s.waited) throw FailedPreconditionError("PendingAllReduce::give after wait()");
  if (index >= s.given.size())
    throw InvalidArgumentError(detail::str_cat("PendingAllReduce: tensor ", index, " of ", s.given.size()));
  if (s.given[index].defined()) throw InvalidArgumentError(detail::str_cat("PendingAllReduce: tensor ", index, " given twice"));
  if (!t.defined()) throw InvalidArgumentError(detail::str_cat("PendingAllReduce: tensor ", index, " is undefined"));
  s.given[index] = t;
  while (s.contiguous < s.given.size() && s.given[s.contiguous].defined()) {
    s.open_bytes += s.given[s.contiguous].nbytes();
    ++s.contiguous;
    if (s.bytes_per_pack > 0 && s.open_bytes >= s.bytes_per_pack) s.close(s.contiguous);
  }
  if (s.contiguous == s.given.size() && s.packed < s.contiguous) s.close(s.contiguous);
}

size_t PendingAllReduce::num_buckets() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->buckets.size();
}

std::vector<Tensor> PendingAllReduce::wait() {
  State& s = *s_;
  if (s.waited) throw FailedPreconditionError("PendingAllReduce::wait called twice");
  if (s.contiguous < s.given.size()) {
    // Every replica must reach its buckets: this one's error stops the others.
    const std::string why = detail::str_cat("PendingAllReduce: tensor ", s.contiguous, " of ", s.given.size(),
                                            " was not given");
    s.collective->abort("replica " + std::to_string(s.local) + ": " + why);
    if (s.thread) s.wait_for_thread();
    s.waited = true;
    throw InvalidArgumentError(why);
  }
  if (s.thread) {
    s.wait_for_thread();
  } else {
    for (std::vector<Tensor>& b : s.buckets) s.reduce(b, /*patient=*/false);
  }
  s.waited = true;
  if (s.error) std::rethrow_exception(s.error);
  std::vector<Tensor> out;
  out.reserve(s.given.size());
  for (std::vector<Tensor>& b : s.buckets)
    for (Tensor& t : b) out.push_back(std::move(t));
  return out;
}

PendingAllReduce ReplicaContext::start_all_reduce(size_t count, ReduceOp op, double weight, bool may_overlap) {
  auto s = std::make_unique<PendingAllReduce::State>();
  s->collective = collective_;
  s->local = local_;
  s->weight = op == ReduceOp::kMean ? weight / num_replicas_ : weight;
  s->bytes_per_pack = comm_.bytes_per_pack;
  s->given.resize(count);
  const bool overlap = comm_.overlap == CommunicationOptions::Overlap::kOn ||
                       (comm_.overlap == CommunicationOptions::Overlap::kAuto && collective_->waits_on_network());
  if (may_overlap && overlap && device_.type == DeviceType::kCPU) {
    if (!*comm_thread_) *comm_thread_ = std::make_unique<WorkPool>(1);
    s->thread = comm_thread_->get();
  }
  return PendingAllReduce(std::move(s));
}

}  // namespace kiln::distribute
