#include "kiln/serving/batching.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kiln/core/error.h"

namespace kiln::serving {

namespace detail {
struct SchedulerCore {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::weak_ptr<BatchQueue>> queues;
  size_t next = 0;  // round-robin start
  bool stop = false;
};
}  // namespace detail

using detail::SchedulerCore;

void BatchingOptions::validate() const {
  auto bad = [](const std::string& m) { throw InvalidArgumentError("batching parameters: " + m); };
  if (max_batch_size <= 0) bad("max_batch_size must be positive, got " + std::to_string(max_batch_size));
  if (batch_timeout_micros < 0) bad("batch_timeout_micros must be >= 0, got " + std::to_string(batch_timeout_micros));
  if (max_enqueued_batches <= 0)
    bad("max_enqueued_batches must be positive, got " + std::to_string(max_enqueued_batches));
  if (num_batch_threads < 0) bad("num_batch_threads must be >= 0, got " + std::to_string(num_batch_threads));
  for (size_t i = 0; i < allowed_batch_sizes.size(); ++i) {
    if (allowed_batch_sizes[i] <= 0 || (i > 0 && allowed_batch_sizes[i] <= allowed_batch_sizes[i - 1]))
      bad("allowed_batch_sizes must be positive and increasing");
  }
  if (!allowed_batch_sizes.empty() && allowed_batch_sizes.back() != max_batch_size)
    bad("the last of allowed_batch_sizes (" + std::to_string(allowed_batch_sizes.back()) +
        ") must equal max_batch_size (" + std::to_string(max_batch_size) + ")");
}

// ---- tensors ----

namespace {

// Copies `src` into the leading corner of the zero-filled `dst` (same rank, every dim of
// dst >= src's).
void copy_into_corner(const Tensor& src, Tensor& dst) {
  const int rank = src.rank();
  const size_t item = src.itemsize();
  auto ss = src.shape().strides();
  auto ds = dst.shape().strides();
  const auto* s = static_cast<const uint8_t*>(src.raw_data());
  auto* d = static_cast<uint8_t*>(dst.raw_data());
  if (rank == 0 || src.numel() == 0) {
    if (src.numel()) std::memcpy(d, s, item);
    return;
  }
  const int64_t inner = src.shape()[rank - 1];
  const int64_t outer = src.numel() / inner;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, soff = 0, doff = 0;
    for (int k = rank - 2; k >= 0; --k) {
      int64_t idx = rem % src.shape()[k];
      rem /= src.shape()[k];
      soff += idx * ss[k];
      doff += idx * ds[k];
    }
    std::memcpy(d + doff * item, s + soff * item, inner * item);
  }
}

bool same_trailing(const Tensor& a, const Tensor& b) {
  if (a.rank() != b.rank() || a.dtype() != b.dtype()) return false;
  for (int k = 1; k < a.rank(); ++k)
    if (a.shape()[k] != b.shape()[k]) return false;
  return true;
}

}  // namespace

Tensor concat_rows(const std::vector<const Tensor*>& parts, int64_t pad_to_rows) {
  if (parts.empty()) throw InvalidArgumentError("concat_rows: no tensors");
  const Tensor& first = *parts[0];
  if (first.rank() == 0) throw InvalidArgumentError("concat_rows: scalar tensors have no rows");
  int64_t rows = 0;
  for (auto* p : parts) {
    if (!same_trailing(*p, first))
      throw InvalidArgumentError("concat_rows: " + p->desc() + " does not stack with " + first.desc());
    rows += p->dim(0);
  }
  Shape shape = first.shape();
  shape[0] = std::max(rows, pad_to_rows);
  Tensor out = Tensor::empty(shape, first.dtype());
  auto* d = static_cast<uint8_t*>(out.raw_data());
  size_t off = 0;
  for (auto* p : parts) {
    std::memcpy(d + off, p->raw_data(), p->nbytes());
    off += p->nbytes();
  }
  // Padding rows repeat the first row (as TF Serving pads).
  const size_t row_bytes = rows ? first.nbytes() / std::max<int64_t>(first.dim(0), 1) : 0;
  for (int64_t r = rows; r < shape[0]; ++r) {
    if (row_bytes) std::memcpy(d + off, d, row_bytes);
    else std::memset(d + off, 0, out.nbytes() / shape[0]);
    off += out.nbytes() / shape[0];
  }
  return out;
}

Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end) {
  if (t.rank() == 0 || begin < 0 || end > t.dim(0) || begin > end)
    throw InvalidArgumentError("slice_rows: rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                               ") of " + t.desc());
  Shape shape = t.shape();
  shape[0] = end - begin;
  const size_t row_bytes = t.dim(0) ? t.nbytes() / t.dim(0) : 0;
  return Tensor::from_bytes(static_cast<const uint8_t*>(t.raw_data()) + begin * row_bytes,
                            (end - begin) * row_bytes, shape, t.dtype());
}

// ---- queue ----

// No lock here: the last owner may be a batch thread that holds the scheduler's lock,
// and no other thread can reach a queue whose last strong reference is going.
BatchQueue::~BatchQueue() {
  for (auto& t : tasks_) t.done(Status{Code::kUnavailable, "model version unloaded before the request ran"}, {}, {});
}

void BatchQueue::submit(BatchTask task) {
  auto refuse = [&](Code c, const std::string& m) { task.done(Status{c, m}, {}, {}); };
  if (task.inputs.empty()) return refuse(Code::kInvalidArgument, "a batched request needs at least one input");
  int64_t rows = -1;
  for (auto& [name, t] : task.inputs) {
    if (t.rank() == 0)
      return refuse(Code::kInvalidArgument, "input '" + name + "' is a scalar; batched inputs need a batch dimension");
    if (rows < 0) rows = t.dim(0);
    else if (t.dim(0) != rows)
      return refuse(Code::kInvalidArgument, "inputs disagree on the batch size: input '" + name + "' has " +
                                                std::to_string(t.dim(0)) + " rows, another " + std::to_string(rows));
  }
  // Room in rows (overflow-safe): a request that could never fit is refused before it
  // is split.
  const int64_t capacity = opts_.max_batch_size > std::numeric_limits<int64_t>::max() / opts_.max_enqueued_batches
                               ? std::numeric_limits<int64_t>::max()
                               : opts_.max_batch_size * opts_.max_enqueued_batches;
  auto full = [&] {
    return "The batch scheduling queue to which this task was submitted is full (" +
           std::to_string(opts_.max_enqueued_batches) + " batches of " + std::to_string(opts_.max_batch_size) +
           " rows)";
  };
  if (rows > capacity) return refuse(Code::kResourceExhausted, full());
  task.rows = rows;
  task.enqueued = Clock::now();
  // A request larger than max_batch_size is split into pieces that batch like any
  // other request; its outputs are put back together in order (TF Serving's
  // enable_large_batch_splitting, always on here).
  std::vector<BatchTask> pieces;
  if (rows > opts_.max_batch_size) pieces = split(std::move(task));
  else pieces.push_back(std::move(task));
  {
    std::unique_lock<std::mutex> lock(core_->mu);
    if (closed_) {
      lock.unlock();
      return fail_all(pieces, Code::kUnavailable, "model version is unloading; retry");
    }
    if (rows > capacity - rows_) {
      lock.unlock();
      return fail_all(pieces, Code::kResourceExhausted, full());
    }
    rows_ += rows;
    for (auto& p : pieces) tasks_.push_back(std::move(p));
  }
  core_->cv.notify_one();
}

void BatchQueue::fail_all(std::vector<BatchTask>& tasks, Code code, const std::string& message) {
  // Pieces of one split request share one answer: the first failure is it.
  for (auto& t : tasks) t.done(Status{code, message}, {}, {});
}

std::vector<BatchTask> BatchQueue::split(BatchTask task) {
  struct Join {
    std::mutex mu;
    std::vector<TensorMap> parts;
    size_t left;
    Status status;
    BatchInfo info;
    std::function<void(const Status&, TensorMap, const BatchInfo&)> done;
  };
  const int64_t max = opts_.max_batch_size;
  const size_t n = static_cast<size_t>((task.rows + max - 1) / max);
  auto join = std::make_shared<Join>();
  join->parts.resize(n);
  join->left = n;
  join->done = std::move(task.done);
  std::vector<BatchTask> pieces(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t begin = static_cast<int64_t>(i) * max, end = std::min(task.rows, begin + max);
    BatchTask& p = pieces[i];
    for (auto& [name, t] : task.inputs) p.inputs.emplace(name, slice_rows(t, begin, end));
    p.rows = end - begin;
    p.deadline = task.deadline;
    p.cancelled = task.cancelled;
    p.enqueued = task.enqueued;
    p.done = [join, i](const Status& st, TensorMap out, const BatchInfo& info) {
      std::unique_lock<std::mutex> lock(join->mu);
      if (!st.ok() && join->status.ok()) join->status = st;
      join->parts[i] = std::move(out);
      join->info.batch_size = std::max(join->info.batch_size, info.batch_size);
      join->info.queue_seconds = std::max(join->info.queue_seconds, info.queue_seconds);
      join->info.compute_seconds += info.compute_seconds;
      if (--join->left > 0) return;
      lock.unlock();
      if (!join->status.ok()) return join->done(join->status, {}, join->info);
      TensorMap whole;
      Status status;
      try {
        for (auto& [name, first] : join->parts[0]) {
          std::vector<const Tensor*> parts;
          for (auto& part : join->parts) parts.push_back(&part.at(name));
          whole.emplace(name, concat_rows(parts, 0));
        }
      } catch (...) {
        status = status_of_current_exception();
        whole.clear();
      }
      join->done(status, std::move(whole), join->info);
    };
  }
  return pieces;
}

void BatchQueue::close() {
  std::deque<BatchTask> left;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    closed_ = true;
    left.swap(tasks_);
    rows_ = 0;
  }
  for (auto& t : left) t.done(Status{Code::kUnavailable, "model version unloaded before the request ran"}, {}, {});
}

int64_t BatchQueue::queued_rows() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return rows_;
}

bool BatchQueue::ready(Clock::time_point now, Clock::time_point* wake) const {
  if (tasks_.empty()) return false;
  if (rows_ >= opts_.max_batch_size) return true;
  auto due = tasks_.front().enqueued + std::chrono::microseconds(opts_.batch_timeout_micros);
  if (due <= now) return true;
  // Stop waiting as soon as the first request's deadline would pass.
  due = std::min(due, tasks_.front().deadline);
  if (due <= now) return true;
  *wake = std::min(*wake, due);
  return false;
}

std::vector<BatchTask> BatchQueue::take_batch() {
  std::vector<BatchTask> out;
  int64_t rows = 0;
  while (!tasks_.empty()) {
    BatchTask& t = tasks_.front();
    if (!out.empty()) {
      if (rows + t.rows > opts_.max_batch_size) break;
      if (!opts_.pad_variable_length_inputs) {
        bool fits = true;
        for (auto& [name, in] : t.inputs) {
          auto it = out.front().inputs.find(name);
          if (it == out.front().inputs.end() || !same_trailing(it->second, in)) fits = false;
        }
        if (!fits || t.inputs.size() != out.front().inputs.size()) break;
      }
    }
    rows += t.rows;
    rows_ -= t.rows;
    out.push_back(std::move(t));
    tasks_.pop_front();
  }
  return out;
}

void BatchQueue::run_batch(std::vector<BatchTask> tasks) {
  const auto start = Clock::now();
  // Requests whose deadline passed are answered and not run.
  std::vector<BatchTask> live;
  live.reserve(tasks.size());
  for (auto& t : tasks) {
    if (t.cancelled && t.cancelled->load()) {
      BatchInfo info;
      info.queue_seconds = std::chrono::duration<double>(start - t.enqueued).count();
      t.done(Status{Code::kCancelled, "the client closed the connection; the request was not run"}, {}, info);
    } else if (t.deadline <= start) {
      BatchInfo info;
      info.queue_seconds = std::chrono::duration<double>(start - t.enqueued).count();
      t.done(Status{Code::kDeadlineExceeded, "deadline exceeded after " +
                                                 std::to_string(static_cast<int64_t>(info.queue_seconds * 1e3)) +
                                                 " ms in the batching queue; the request was not run"},
             {}, info);
    } else {
      live.push_back(std::move(t));
    }
  }
  if (live.empty()) return;
  int64_t rows = 0;
  for (auto& t : live) rows += t.rows;
  int64_t padded = rows;
  for (int64_t s : opts_.allowed_batch_sizes)
    if (s >= rows) {
      padded = s;
      break;
    }
  Status status;
  TensorMap outputs;
  try {
    TensorMap inputs;
    for (auto& [name, first] : live.front().inputs) {
      std::vector<const Tensor*> parts;
      std::vector<Tensor> padded_parts;
      // Variable-length inputs: zero-pad every request to the largest trailing dims.
      Shape target = first.shape();
      for (auto& t : live) {
        auto it = t.inputs.find(name);
        if (it == t.inputs.end()) throw InvalidArgumentError("a batched request lacks input '" + name + "'");
        if (it->second.rank() != first.rank() || it->second.dtype() != first.dtype())
          throw InvalidArgumentError("input '" + name + "': " + it->second.desc() + " does not batch with " +
                                     first.desc());
        for (int k = 1; k < first.rank(); ++k) target[k] = std::max(target[k], it->second.shape()[k]);
      }
      padded_parts.reserve(live.size());
      for (auto& t : live) {
        const Tensor& in = t.inputs.at(name);
        bool same = true;
        for (int k = 1; k < in.rank(); ++k) same = same && in.shape()[k] == target[k];
        if (same) {
          parts.push_back(&in);
        } else {
          Shape s = target;
          s[0] = in.dim(0);
          padded_parts.push_back(Tensor::zeros(s, in.dtype()));
          copy_into_corner(in, padded_parts.back());
          parts.push_back(&padded_parts.back());
        }
      }
      inputs.emplace(name, concat_rows(parts, padded));
    }
    outputs = run_(inputs);
    for (auto& [name, t] : outputs)
      if (t.rank() == 0 || t.dim(0) != padded)
        throw InternalError("output '" + name + "' is " + t.desc() + ": a batched signature's outputs need the " +
                            std::to_string(padded) + " rows of the batch as dimension 0");
  } catch (...) {
    status = status_of_current_exception();
  }
  const auto end = Clock::now();
  int64_t off = 0;
  for (auto& t : live) {
    BatchInfo info;
    info.batch_size = padded;
    info.queue_seconds = std::chrono::duration<double>(start - t.enqueued).count();
    info.compute_seconds = std::chrono::duration<double>(end - start).count();
    if (!status.ok()) {
      t.done(status, {}, info);
      continue;
    }
    TensorMap mine;
    for (auto& [name, out] : outputs) mine.emplace(name, slice_rows(out, off, off + t.rows));
    off += t.rows;
    t.done(status, std::move(mine), info);
  }
}

// ---- scheduler ----

BatchScheduler::BatchScheduler(int num_threads) : core_(std::make_shared<SchedulerCore>()) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { loop(); });
}

BatchScheduler::~BatchScheduler() {
  std::vector<std::shared_ptr<BatchQueue>> live;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->stop = true;
    for (auto& w : core_->queues)
      if (auto q = w.lock()) live.push_back(std::move(q));
  }
  core_->cv.notify_all();
  for (auto& t : threads_) t.join();
  for (auto& q : live) q->close();
}

std::shared_ptr<BatchQueue> BatchScheduler::add_queue(std::string name, BatchRunner run, BatchingOptions opts) {
  opts.validate();
  std::shared_ptr<BatchQueue> q(new BatchQueue(core_, std::move(name), std::move(run), std::move(opts)));
  std::lock_guard<std::mutex> lock(core_->mu);
  if (core_->stop) q->closed_ = true;
  core_->queues.push_back(q);
  return q;
}

void BatchScheduler::loop() {
  SchedulerCore& c = *core_;
  std::unique_lock<std::mutex> lock(c.mu);
  while (!c.stop) {
    const auto now = Clock::now();
    auto wake = Clock::time_point::max();
    std::shared_ptr<BatchQueue> chosen;
    std::vector<BatchTask> batch;
    const size_t n = c.queues.size();
    for (size_t i = 0; i < n && !chosen; ++i) {
      size_t k = (c.next + i) % n;
      auto q = c.queues[k].lock();
      if (!q || q->closed_) continue;
      if (q->ready(now, &wake)) {
        batch = q->take_batch();
        if (!q->tasks_.empty()) c.cv.notify_one();  // more to do: wake another thread
        chosen = std::move(q);
        c.next = k + 1;
      }
    }
    // Forget queues that died.
    std::erase_if(c.queues, [](const std::weak_ptr<BatchQueue>& w) { return w.expired(); });
    if (chosen) {
      lock.unlock();
      chosen->run_batch(std::move(batch));
      chosen.reset();  // may destroy the queue: outside the lock
      lock.lock();
      continue;
    }
    if (wake == Clock::time_point::max()) c.cv.wait(lock);
    else c.cv.wait_until(lock, wake);
  }
}

}  // namespace kiln::serving
