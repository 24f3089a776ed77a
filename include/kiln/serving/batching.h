#pragma once
// Dynamic batching: requests to one model version + signature queue up and run together
// as one batch, as TensorFlow Serving's shared batch scheduler does.
//
// The options are TensorFlow Serving's BatchingParameters (--batching_parameters_file):
//   max_batch_size        rows in one batch (a request with more rows is split into
//                         pieces that batch separately and is answered whole, as TF
//                         Serving's enable_large_batch_splitting; always on here)
//   batch_timeout_micros  how long the oldest request waits for a batch to fill
//   max_enqueued_batches  queue capacity in batches; beyond it submit() answers
//                         RESOURCE_EXHAUSTED at once (HTTP 429)
//   num_batch_threads     threads running batches, shared by every queue
//   allowed_batch_sizes   batches are padded up to the next of these (increasing; the
//                         last equals max_batch_size); padding rows repeat the first row
//   pad_variable_length_inputs  requests whose non-batch dimensions differ are zero-padded
//                         to the largest; without it they run in separate batches
// A request whose deadline has passed when its batch forms is answered
// DEADLINE_EXCEEDED and not run; one whose client went away, CANCELLED (HTTP 499). Outputs are split back by rows: every output of a
// batched signature must have the batch as its first dimension.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/serving/status.h"

namespace kiln::serving {

using Clock = std::chrono::steady_clock;
using TensorMap = std::map<std::string, Tensor>;

struct BatchingOptions {
  int64_t max_batch_size = 64;
  int64_t batch_timeout_micros = 1000;
  int64_t max_enqueued_batches = 64;
  int num_batch_threads = 0;  // 0: the number of cores
  std::vector<int64_t> allowed_batch_sizes;
  bool pad_variable_length_inputs = false;
  // Throws InvalidArgumentError naming the bad field.
  void validate() const;
};

// What a batch run reports to each of its requests.
struct BatchInfo {
  int64_t batch_size = 0;  // rows run, padding included
  double queue_seconds = 0;
  double compute_seconds = 0;
};

struct BatchTask {
  TensorMap inputs;  // every input has the request's rows as dimension 0
  Clock::time_point deadline = Clock::time_point::max();
  // Set (by the front end) when the client went away: the request is answered
  // CANCELLED and not run, like an expired one.
  std::shared_ptr<const std::atomic<bool>> cancelled;
  // Called exactly once, on a batch thread (or inside submit() when refused).
  std::function<void(const Status&, TensorMap outputs, const BatchInfo&)> done;
  // Filled by the scheduler:
  int64_t rows = 0;
  Clock::time_point enqueued;
};

// Runs one batch: inputs concatenated along dimension 0 -> outputs.
using BatchRunner = std::function<TensorMap(const TensorMap& inputs)>;

class BatchScheduler;
namespace detail {
struct SchedulerCore;  // the scheduler's lock, wake-up and queue list, shared with its queues
}

// One queue (a model version + signature). Owned by the servable; closing it (or
// destroying it) fails what is still queued with UNAVAILABLE.
class BatchQueue {
 public:
  ~BatchQueue();
  // Refused at once (done called before returning) with RESOURCE_EXHAUSTED when full
  // (a split request needs room for all its pieces), INVALID_ARGUMENT for inconsistent
  // batch sizes, UNAVAILABLE when closed.
  void submit(BatchTask task);
  void close();
  int64_t queued_rows() const;
  const std::string& name() const { return name_; }

 private:
  friend class BatchScheduler;
  BatchQueue(std::shared_ptr<detail::SchedulerCore> core, std::string name, BatchRunner run, BatchingOptions opts)
      : core_(std::move(core)), name_(std::move(name)), run_(std::move(run)), opts_(std::move(opts)) {}
  // Under the scheduler's lock: whether a batch can be taken now, or when it can.
  bool ready(Clock::time_point now, Clock::time_point* wake) const;
  std::vector<BatchTask> take_batch();  // under the scheduler's lock
  std::vector<BatchTask> split(BatchTask task);  // a request over max_batch_size -> pieces
  static void fail_all(std::vector<BatchTask>& tasks, Code code, const std::string& message);
  void run_batch(std::vector<BatchTask> tasks);
  std::shared_ptr<detail::SchedulerCore> core_;
  std::string name_;
  BatchRunner run_;
  BatchingOptions opts_;
  std::deque<BatchTask> tasks_;  // guarded by core_->mu
  int64_t rows_ = 0;             // guarded by core_->mu
  bool closed_ = false;          // guarded by core_->mu
};

// The threads shared by every queue.
class BatchScheduler {
 public:
  explicit BatchScheduler(int num_threads);
  ~BatchScheduler();  // fails what is queued (UNAVAILABLE) and joins
  std::shared_ptr<BatchQueue> add_queue(std::string name, BatchRunner run, BatchingOptions opts);
  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void loop();
  std::shared_ptr<detail::SchedulerCore> core_;
  std::vector<std::thread> threads_;
};

// Concatenates tensors along dimension 0 (same dtype and trailing dims); splits back.
Tensor concat_rows(const std::vector<const Tensor*>& parts, int64_t pad_to_rows);
Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end);

}  // namespace kiln::serving
