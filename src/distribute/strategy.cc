#include "kiln/distribute/strategy.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/work_pool.h"
#include "distribute/local_collective.h"
#include "distribute/worker_group.h"
#include "kiln/distribute/cluster.h"
#include "kiln/core/cross_replica.h"
#include "kiln/core/parallel.h"

namespace kiln::distribute {

// ---- replica threads ---------------------------------------------------------------

// N threads that live as long as the strategy, each waiting for the next run().
class Strategy::Threads {
 public:
  Threads(int n, LocalCollective* collective) : collective_(collective), errors_(static_cast<size_t>(n)) {
    // The replicas share the pool's cores (fixed at the strategy's creation).
    const int cap = std::max(1, num_threads() / n);
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r, cap] { loop(r, cap); });
  }
  ~Threads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Runs job(r) on every thread; returns the first replica's error (others' CancelledErrors
  // only when no replica failed otherwise).
  void run(const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    pending_ = static_cast<int>(threads_.size());
    for (auto& e : errors_) e = nullptr;
    ++round_;
    wake_.notify_all();
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    lock.unlock();
    collective_->reset();
    std::exception_ptr first_cancelled;
    for (const std::exception_ptr& e : errors_) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const CancelledError&) {
        if (!first_cancelled) first_cancelled = e;
      } catch (...) {
        std::rethrow_exception(e);
      }
    }
    if (first_cancelled) std::rethrow_exception(first_cancelled);
  }

 private:
  void loop(int r, int cap) {
    ReplicaScope replica(r);
    ThreadLimitScope limit(cap);
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen = round_;
        job = job_;
      }
      try {
        (*job)(r);
      } catch (...) {
        errors_[static_cast<size_t>(r)] = std::current_exception();
        std::string what = "replica " + std::to_string(r) + " failed";
        try {
          throw;
        } catch (const std::exception& e) {
          what += ": " + std::string(e.what());
        } catch (...) {
        }
        collective_->abort(what);  // the others stop waiting for this one
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  LocalCollective* collective_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t round_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

// ---- ReplicaContext -----------------------------------------------------------------

void ReplicaContext::all_reduce(std::vector<Tensor>& tensors, ReduceOp op, double weight) {
  if (op == ReduceOp::kMean) weight /= num_replicas_;
  collective_->all_reduce(local_, tensors, weight);
}

void ReplicaContext::barrier() { collective_->barrier(); }

// ---- Strategy -----------------------------------------------------------------------

namespace {
// A mismatch every worker found in the same gathered values: all throw it, after a
// barrier, so that every worker has its gather before any leaves (one that threw at once
// could close the connections under a slower worker's gather, which would then report a
// lost worker instead). The barrier's own failure changes nothing here.
[[noreturn]] void fail_together(WorkerGroup& workers, const std::string& message) {
  try {
    workers.barrier();
  } catch (const Error&) {
  }
  throw InvalidArgumentError(message);
}

// GPU replicas sum through their devices' collectives (NCCL), across the workers too:
// one group of every GPU replica of the job; CPU replicas in host memory.
std::unique_ptr<DeviceGroup> device_group(const std::vector<Device>& devices, WorkerGroup* workers) {
  const bool several = workers && workers->size() > 1;
  if (several) {
    // Every worker needs as many replicas of one device type (checked before any
    // worker's group waits for the others).
    const std::string mine = detail::str_cat(devices.size(), " ", device_type_name(devices.at(0).type));
    const std::vector<std::string> all = workers->all_gather(mine);
    for (size_t w = 0; w < all.size(); ++w)
      if (all[w] != all[0])
        fail_together(*workers, detail::str_cat("MultiWorkerMirroredStrategy: worker ", w, " has ", all[w],
                                                " replicas, worker 0 has ", all[0], " (every worker needs as many, "
                                                "on devices of one type)"));
  }
  if (devices.at(0).type == DeviceType::kCPU) return nullptr;
  DeviceGroupSpan span;
  if (several) {
    const int local = static_cast<int>(devices.size());
    span.first = workers->rank() * local;
    span.size = workers->size() * local;
    span.share = [workers](const std::string& mine) { return workers->all_gather(mine).at(0); };
  }
  std::string why;
  std::unique_ptr<DeviceGroup> g = make_device_group(devices, &why, span);
  if (!g) throw UnimplementedError("strategy: replicas on " + devices[0].str() + ": " + why);
  return g;
}
}  // namespace

Strategy::Strategy(std::vector<Device> devices, std::unique_ptr<WorkerGroup> workers)
    : devices_(std::move(devices)),
      workers_(std::move(workers)),
      collective_(std::make_unique<LocalCollective>(static_cast<int>(devices_.size()), workers_.get(),
                                                    device_group(devices_, workers_.get()))),
      threads_(std::make_unique<Threads>(static_cast<int>(devices_.size()), collective_.get())),
      comm_threads_(devices_.size()) {}

Strategy::~Strategy() = default;

void Strategy::run(const std::function<void(ReplicaContext&)>& fn) {
  const int n = num_replicas_in_sync(), first = worker_rank() * num_local_replicas();
  threads_->run([&](int r) {
    ReplicaContext ctx(r, first, n, devices_[static_cast<size_t>(r)], collective_.get(), comm_,
                       &comm_threads_[static_cast<size_t>(r)]);
    // ops::cross_replica_sum in the replica's model (synchronized BatchNormalization).
    CrossReplicaSumScope cross_replica([&ctx](const Tensor& x) {
      std::vector<Tensor> t{x};
      ctx.all_reduce(t);
      return t[0];
    });
    fn(ctx);
  });
}

int Strategy::num_workers() const { return workers_ ? workers_->size() : 1; }
int Strategy::worker_rank() const { return workers_ ? workers_->rank() : 0; }

void Strategy::sync_workers() const {
  if (workers_) workers_->barrier();
}

void Strategy::check_same_on_workers(const std::string& what, const std::string& value) const {
  if (!workers_) return;
  const std::vector<std::string> all = workers_->all_gather(value);
  for (size_t w = 1; w < all.size(); ++w)
    if (all[w] != all[0])
      fail_together(*workers_, detail::str_cat("multi-worker: worker ", w, "'s ", what, " differs from the chief's: ",
                                               all[w], " vs ", all[0], " (every worker must run the same configuration)"));
}

Tensor Strategy::reduce(ReduceOp op, const std::vector<Tensor>& per_replica) const {
  if (static_cast<int>(per_replica.size()) != num_local_replicas())
    throw InvalidArgumentError(detail::str_cat("Strategy::reduce: ", per_replica.size(), " values for ",
                                               num_local_replicas(), " local replicas"));
  Tensor acc;
  for (size_t r = 0; r < per_replica.size(); ++r) {
    const Tensor& v = per_replica[r];
    if (!v.defined()) throw InvalidArgumentError(detail::str_cat("Strategy::reduce: replica ", r, "'s value is undefined"));
    if (r > 0 && (v.shape() != per_replica[0].shape() || v.dtype() != per_replica[0].dtype()))
      throw InvalidArgumentError(detail::str_cat("Strategy::reduce: replica ", r, "'s value is ", v.desc(),
                                                 ", replica 0's is ", per_replica[0].desc()));
    const Tensor h = v.to(DType::kF64).to(Device::cpu());
    if (!acc.defined()) {
      acc = h.clone();
      continue;
    }
    double* a = acc.data<double>();
    const double* b = h.data<double>();
    for (int64_t i = 0; i < acc.numel(); ++i) a[i] += b[i];
  }
  if (workers_) {
    std::vector<Tensor> t = {acc};
    workers_->all_reduce_sum(t);
  }
  if (op == ReduceOp::kMean) {
    double* a = acc.data<double>();
    for (int64_t i = 0; i < acc.numel(); ++i) a[i] /= static_cast<double>(num_replicas_in_sync());
  }
  return acc.to(per_replica[0].dtype());
}

void Strategy::mirror(const std::vector<Variable>& vars) const {
  if (workers_) {
    // Every worker starts from the chief's values.
    std::vector<Tensor> values;
    for (const Variable& v : vars) values.push_back(v.replica_value(0).to(Device::cpu()).clone());
    workers_->broadcast(values, 0);
    for (size_t i = 0; i < vars.size(); ++i) vars[i].assign_replica(0, values[i].to(vars[i].replica_value(0).device()));
  }
  for (const Variable& v : vars) v.mirror(devices_);
}

namespace {
// Rows of global replica g when `rows` are split over n replicas.
int64_t rows_of(int64_t rows, int64_t n, int64_t g) { return rows / n + (g < rows % n ? 1 : 0); }
}  // namespace

std::vector<int64_t> Strategy::shard_rows(int64_t rows, BatchOf of) const {
  const bool job = of == BatchOf::kJob;
  const int64_t n = job ? num_replicas_in_sync() : num_local_replicas();
  const int64_t first = job ? int64_t{worker_rank()} * num_local_replicas() : 0;
  std::vector<int64_t> out(static_cast<size_t>(num_local_replicas()));
  for (size_t r = 0; r < out.size(); ++r) out[r] = rows_of(rows, n, first + static_cast<int64_t>(r));
  return out;
}

std::vector<int64_t> Strategy::sum_over_workers(std::vector<int64_t> values) const {
  if (!workers_ || values.empty()) return values;
  std::vector<double> d(values.begin(), values.end());  // exact below 2^53
  std::vector<Tensor> t = {Tensor::from_vector<double>(d, {static_cast<int64_t>(d.size())})};
  workers_->all_reduce_sum(t);
  d = t[0].to_vector<double>();
  for (size_t i = 0; i < d.size(); ++i) values[i] = static_cast<int64_t>(d[i]);
  return values;
}

Tensor Strategy::all_gather_rows(const Tensor& local) const {
  if (!workers_) return local;
  std::string mine;
  std::string header;  // dtype and per-row shape, so that a worker without rows learns them
  if (local.defined()) {
    const Tensor h = local.to(Device::cpu());
    header = std::string(dtype_name(h.dtype()));
    for (int d = 1; d < h.rank(); ++d) header += "," + std::to_string(h.dim(d));
    mine = header + "\n" + std::string(static_cast<const char*>(h.raw_data()), h.nbytes());
  }
  const std::vector<std::string> all = workers_->all_gather(mine);
  Tensor first;
  std::vector<std::pair<const char*, size_t>> parts;
  for (const std::string& a : all) {
    if (a.empty()) continue;
    const size_t nl = a.find('\n');
    const std::string h = a.substr(0, nl);
    if (!first.defined()) {
      // dtype[,dim1,dim2...]
      std::vector<int64_t> dims = {0};
      size_t b = h.find(',');
      const std::string dt = h.substr(0, b);
      while (b != std::string::npos) {
        const size_t e = h.find(',', b + 1);
        dims.push_back(std::stoll(h.substr(b + 1, e == std::string::npos ? std::string::npos : e - b - 1)));
        b = e;
      }
      first = Tensor::empty(Shape(dims), dtype_from_name(dt));
    }
    parts.emplace_back(a.data() + nl + 1, a.size() - nl - 1);
  }
  if (!first.defined()) return local;
  size_t bytes = 0;
  for (const auto& p : parts) bytes += p.second;
  std::vector<int64_t> dims = first.shape().vec();
  size_t row_bytes = first.itemsize();
  for (size_t d = 1; d < dims.size(); ++d) row_bytes *= static_cast<size_t>(dims[d]);
  dims[0] = row_bytes ? static_cast<int64_t>(bytes / row_bytes) : 0;
  Tensor out = Tensor::empty(Shape(dims), first.dtype());
  size_t off = 0;
  for (const auto& p : parts) {
    std::memcpy(static_cast<char*>(out.raw_data()) + off, p.first, p.second);
    off += p.second;
  }
  return out;
}

namespace {
size_t byte_offset(const Tensor& t) {
  return static_cast<size_t>(static_cast<const char*>(t.raw_data()) - static_cast<const char*>(t.storage()->data()));
}
}  // namespace

std::vector<std::vector<Tensor>> Strategy::split_batch(const std::vector<Tensor>& batch, BatchOf of) const {
  if (batch.empty()) throw InvalidArgumentError("Strategy::split_batch: an empty batch");
  for (const Tensor& t : batch)
    if (!t.defined() || t.rank() < 1 || t.dim(0) != batch[0].dim(0))
      throw InvalidArgumentError("Strategy::split_batch: every tensor of a batch needs the same rows (dim 0); got " +
                                 (t.defined() ? t.desc() : std::string("an undefined tensor")) + " beside " +
                                 batch[0].desc());
  const std::vector<int64_t> rows = shard_rows(batch[0].dim(0), of);
  std::vector<std::vector<Tensor>> shards(rows.size());
  int64_t lo = 0;  // the rows of the replicas of the workers before this one
  if (of == BatchOf::kJob)
    for (int64_t g = 0; g < int64_t{worker_rank()} * num_local_replicas(); ++g)
      lo += rows_of(batch[0].dim(0), num_replicas_in_sync(), g);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const Tensor& t : batch) {
      // Rows are contiguous: a view of them, copied to the replica's device (shared when it is t's).
      std::vector<int64_t> dims = t.shape().vec();
      const size_t row_bytes = dims[0] > 0 ? t.nbytes() / static_cast<size_t>(dims[0]) : 0;
      dims[0] = rows[r];
      const Tensor view(t.storage(), static_cast<size_t>(lo) * row_bytes + byte_offset(t), Shape(dims), t.dtype());
      shards[r].push_back(view.to(devices_[r]));
    }
    lo += rows[r];
  }
  return shards;
}

// ---- MirroredStrategy ---------------------------------------------------------------

namespace {
void check_devices(std::vector<Device>& devices) {
  if (devices.empty()) devices.push_back(Device::cpu());
  std::set<std::string> seen;
  for (const Device& d : devices) {
    if (!seen.insert(d.str()).second)
      throw InvalidArgumentError("strategy: device " + d.str() + " is listed twice");
    if (d.type != devices[0].type)
      throw InvalidArgumentError("strategy: the replicas are on one kind of device, got " + devices[0].str() +
                                 " and " + d.str());
    backend_for(d);  // NotFoundError: no such device, and why
  }
}
}  // namespace

std::shared_ptr<MirroredStrategy> MirroredStrategy::create(std::vector<Device> devices) {
  check_devices(devices);
  return std::shared_ptr<MirroredStrategy>(new MirroredStrategy(std::move(devices), nullptr));
}

std::shared_ptr<MultiWorkerMirroredStrategy> MultiWorkerMirroredStrategy::create(const ClusterSpec& cluster,
                                                                                 std::vector<Device> devices,
                                                                                 double timeout_seconds,
                                                                                 Collectives collectives) {
  check_devices(devices);
  if (!(timeout_seconds > 0))
    throw InvalidArgumentError(detail::str_cat("MultiWorkerMirroredStrategy: timeout must be > 0 s, got ",
                                               timeout_seconds));
  auto workers = WorkerGroup::connect(
      cluster, std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)), collectives);
  auto s = std::shared_ptr<MultiWorkerMirroredStrategy>(new MultiWorkerMirroredStrategy(std::move(devices),
                                                                                       std::move(workers)));
  s->check_same_on_workers("local replica count", std::to_string(s->num_local_replicas()));
  return s;
}

std::string MultiWorkerMirroredStrategy::collectives() const { return workers() ? workers()->backend() : "gloo"; }

std::shared_ptr<MirroredStrategy> MirroredStrategy::create(const std::string& devices) {
  std::vector<Device> list;
  std::stringstream ss(devices);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw InvalidArgumentError("MirroredStrategy: an empty device name in '" + devices + "'");
    list.push_back(parse_device(item));
  }
  if (list.empty()) throw InvalidArgumentError("MirroredStrategy: no devices in '" + devices + "'");
  return create(std::move(list));
}

// ---- StrategyScope ------------------------------------------------------------------

namespace {
thread_local StrategyPtr t_strategy;
}  // namespace

StrategyScope::StrategyScope(StrategyPtr strategy) : previous_(std::move(t_strategy)) {
  t_strategy = std::move(strategy);
}
StrategyScope::~StrategyScope() { t_strategy = std::move(previous_); }
StrategyPtr StrategyScope::current() { return t_strategy; }

}  // namespace kiln::distribute
