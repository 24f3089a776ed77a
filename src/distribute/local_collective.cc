#include "distribute/local_collective.h"

#include <cstring>

#include "distribute/worker_group.h"
#include "kiln/core/error.h"
#include "kiln/ops/elementwise.h"

namespace kiln::distribute {

LocalCollective::LocalCollective(int replicas, WorkerGroup* workers, std::unique_ptr<DeviceGroup> devices)
    : n_(replicas),
      workers_(workers),
      devices_(std::move(devices)),
      inputs_(static_cast<size_t>(replicas)),
      weights_(static_cast<size_t>(replicas)) {
  if (replicas < 1) throw InvalidArgumentError("LocalCollective: needs at least one replica");
}

LocalCollective::~LocalCollective() = default;

bool LocalCollective::waits_on_network() const { return workers_ && workers_->backend() == "gloo"; }

void LocalCollective::throw_if_aborted() const {
  if (aborted_) throw CancelledError(reason_);
}

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

template <class F>
void LocalCollective::arrive(F&& last, int spins) {
  std::unique_lock<std::mutex> lock(mu_);
  throw_if_aborted();
  const uint64_t generation = generation_.load();
  if (++arrived_ == n_) {
    arrived_ = 0;
    std::string error = last();
    if (!error.empty()) {
      aborted_ = true;
      reason_ = error;
    }
    generation_.store(generation + 1);
    cv_.notify_all();
    if (!error.empty()) throw InvalidArgumentError(error);
    return;
  }
  // The replicas of a step arrive within microseconds of each other: spin a little
  // (a futex sleep and wake-up costs tens of microseconds a barrier), then sleep.
  lock.unlock();
  for (int i = 0; i < spins && generation_.load(std::memory_order_acquire) == generation && !aborted_.load(); ++i)
    cpu_relax();
  lock.lock();
  cv_.wait(lock, [&] { return generation_.load() != generation || aborted_.load(); });
  throw_if_aborted();
}

void LocalCollective::barrier() { barrier(kSpins); }

void LocalCollective::barrier(int spins) {
  arrive([] { return std::string(); }, spins);
}

void LocalCollective::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  reason_ = reason;
  cv_.notify_all();
}

void LocalCollective::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  reason_.clear();
  arrived_ = 0;
  results_.clear();
  for (auto& p : inputs_) p.clear();
}

namespace {
// Slice r of n of tensor k of replica 0's result, copied to the other replicas' results.
void copy_slice(size_t k, std::vector<std::vector<Tensor>>& results, int r, int n) {
  const Tensor& src = results[0][k];
  const size_t item = src.itemsize(), len = static_cast<size_t>(src.numel());
  const size_t lo = len * static_cast<size_t>(r) / static_cast<size_t>(n);
  const size_t hi = len * static_cast<size_t>(r + 1) / static_cast<size_t>(n);
  for (size_t q = 1; q < results.size(); ++q)
    if (hi > lo)
      std::memcpy(static_cast<char*>(results[q][k].raw_data()) + lo * item,
                  static_cast<const char*>(src.raw_data()) + lo * item, (hi - lo) * item);
}

// Slice r of n of tensor k: the weighted sum into replica 0's result.
template <typename T>
void reduce_slice(const std::vector<std::vector<Tensor>>& inputs, const std::vector<double>& weights, size_t k,
                  std::vector<std::vector<Tensor>>& results, int r, int n) {
  const int64_t len = results[0][k].numel(), lo = len * r / n, hi = len * (r + 1) / n;
  T* dst = results[0][k].data<T>();
  for (size_t q = 0; q < inputs.size(); ++q) {
    const T* src = inputs[q][k].data<T>();
    const T w = static_cast<T>(weights[q]);
    if (q == 0) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = w * src[i];
    } else {
      for (int64_t i = lo; i < hi; ++i) dst[i] += w * src[i];
    }
  }
}
}  // namespace

void LocalCollective::all_reduce(int r, std::vector<Tensor>& tensors, double weight, bool patient) {
  const int spins = patient ? kPatientSpins : kSpins;
  {
    // Not once aborted: another replica may still be reading this one's last inputs.
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_aborted();
    inputs_[static_cast<size_t>(r)] = tensors;
    weights_[static_cast<size_t>(r)] = weight;
  }
  // Everyone has posted: check that the calls match, make the results.
  arrive([&]() -> std::string {
    const std::vector<Tensor>& first = inputs_[0];
    for (int q = 0; q < n_; ++q) {
      const std::vector<Tensor>& ts = inputs_[static_cast<size_t>(q)];
      if (ts.size() != first.size())
        return detail::str_cat("all_reduce: replica ", q, " gave ", ts.size(), " tensors, replica 0 gave ",
                               first.size());
      for (size_t k = 0; k < ts.size(); ++k) {
        const Tensor& t = ts[k];
        if (!t.defined()) return detail::str_cat("all_reduce: replica ", q, "'s tensor ", k, " is undefined");
        if (t.dtype() != DType::kF32 && t.dtype() != DType::kF64)
          return detail::str_cat("all_reduce: replica ", q, "'s tensor ", k, " is ", t.desc(),
                                 "; all_reduce takes f32 and f64");
        if (t.device().type != (devices_ ? DeviceType::kCUDA : DeviceType::kCPU))
          return detail::str_cat("all_reduce: replica ", q, "'s tensor ", k, " is ", t.desc(), "; the replicas are on ",
                                 devices_ ? "GPUs" : "CPU devices");
        if (t.shape() != first[k].shape() || t.dtype() != first[k].dtype())
          return detail::str_cat("all_reduce: replica ", q, "'s tensor ", k, " is ", t.desc(), ", replica 0's is ",
                                 first[k].desc());
      }
    }
    if (devices_) return std::string();  // (the devices' collective makes the results)
    results_.assign(static_cast<size_t>(n_), {});
    for (int q = 0; q < n_; ++q) {
      const std::vector<Tensor>& ts = inputs_[static_cast<size_t>(q)];
      if (q == 0 && workers_) {
        // Replica 0's results, which go to the other workers, lie back to back in one
        // block per dtype: a collective can sum them in place (WorkerGroup::contiguous).
        results_[0].resize(ts.size());
        for (DType dt : {DType::kF32, DType::kF64}) {
          int64_t total = 0;
          for (const Tensor& t : ts)
            if (t.dtype() == dt) total += t.numel();
          if (total == 0) continue;
          const Tensor block = Tensor::empty({total}, dt, ts[0].device());
          size_t offset = 0;
          for (size_t k = 0; k < ts.size(); ++k)
            if (ts[k].dtype() == dt) {
              results_[0][k] = Tensor(block.storage(), offset, ts[k].shape(), dt);
              offset += ts[k].nbytes();
            }
        }
        continue;
      }
      for (const Tensor& t : ts) results_[static_cast<size_t>(q)].push_back(Tensor::empty(t.shape(), t.dtype(), t.device()));
    }
    return {};
  }, spins);
  if (devices_) {
    // Each replica's weighted tensors (new ones: the caller's may be shared), summed in
    // place on the devices.
    std::vector<Tensor> out;
    for (const Tensor& t : tensors) out.push_back(weight == 1.0 ? t.clone() : ops::mul(t, ops::scalar(weight, t.dtype())));
    devices_->all_reduce_sum(r, out);
    tensors = std::move(out);
    return;
  }
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].dtype() == DType::kF32) reduce_slice<float>(inputs_, weights_, k, results_, r, n_);
    else reduce_slice<double>(inputs_, weights_, k, results_, r, n_);
    if (!workers_) copy_slice(k, results_, r, n_);
  }
  barrier(spins);  // every slice written; no one reads the inputs any more
  if (workers_) {
    // This process's sum, summed across the workers by one thread; then every replica
    // takes its slice of the result to the others.
    if (r == 0) workers_->all_reduce_sum(results_[0]);
    barrier(spins);
    for (size_t k = 0; k < tensors.size(); ++k) copy_slice(k, results_, r, n_);
    barrier(spins);
  }
  tensors = results_[static_cast<size_t>(r)];
}

}  // namespace kiln::distribute
