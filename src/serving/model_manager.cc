#include "kiln/serving/model_manager.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/parallel.h"
#include "kiln/core/metrics.h"
#include "log.h"

namespace fs = std::filesystem;

namespace kiln::serving {

std::string_view state_name(VersionState s) {
  switch (s) {
    case VersionState::kUnknown: return "UNKNOWN";
    case VersionState::kStart: return "START";
    case VersionState::kLoading: return "LOADING";
    case VersionState::kAvailable: return "AVAILABLE";
    case VersionState::kUnloading: return "UNLOADING";
    case VersionState::kEnd: return "END";
  }
  return "UNKNOWN";
}

// ---- Servable ----

Servable::Servable(std::string model_name, int64_t version, std::shared_ptr<const package::SavedModel> model)
    : model_name_(std::move(model_name)), version_(version), model_(std::move(model)) {}

Servable::~Servable() {
  for (auto& [sig, q] : queues_) q->close();
}

void Servable::enable_batching(BatchScheduler& sched, const BatchingOptions& opts) {
  for (const auto& sig : model_->signatures()) {
    // Batchable: every input and output has an open batch dimension first.
    bool ok = !sig.inputs.empty();
    for (auto& t : sig.inputs) ok = ok && !t.spec.shape.empty() && t.spec.shape[0] == -1;
    for (auto& t : sig.outputs) ok = ok && !t.spec.shape.empty() && t.spec.shape[0] == -1;
    if (!ok) continue;
    auto model = model_;
    std::string name = sig.name;
    queues_[sig.name] = sched.add_queue(model_name_ + "/" + std::to_string(version_) + "/" + sig.name,
                                        [model, name](const TensorMap& in) { return model->run(name, in); }, opts);
  }
}

int64_t Servable::queued_rows() const {
  int64_t n = 0;
  for (auto& [sig, q] : queues_) n += q->queued_rows();
  return n;
}

void Servable::predict(const std::string& signature, TensorMap inputs, Clock::time_point deadline,
                       std::function<void(const Status&, TensorMap, const BatchInfo&)> done,
                       std::shared_ptr<const std::atomic<bool>> cancelled) const {
  auto q = queues_.find(signature);
  if (q != queues_.end()) {
    // Checked here so that a bad request fails alone, not its whole batch.
    try {
      const auto& sig = model_->signature(signature);
      for (auto& kv : inputs) {
        const std::string& name = kv.first;  // (clang 14 cannot capture structured bindings)
        const Tensor& t = kv.second;
        auto it = std::find_if(sig.inputs.begin(), sig.inputs.end(), [&](auto& i) { return i.name == name; });
        if (it == sig.inputs.end()) {
          std::string have;
          for (auto& i : sig.inputs) have += (have.empty() ? "" : ", ") + i.name;
          throw InvalidArgumentError("signature '" + signature + "' has no input '" + name + "' (it has: " + have + ")");
        }
        package::check_spec(t, it->spec, "input '" + name + "' of signature '" + signature + "'");
      }
      if (inputs.size() != sig.inputs.size()) {
        for (auto& i : sig.inputs)
          if (!inputs.count(i.name))
            throw InvalidArgumentError("signature '" + signature + "' needs input '" + i.name + "' (" +
                                       package::spec_str(i.spec) + ")");
      }
    } catch (...) {
      done(status_of_current_exception(), {}, {});
      return;
    }
    BatchTask task;
    task.inputs = std::move(inputs);
    task.deadline = deadline;
    task.cancelled = std::move(cancelled);
    task.done = std::move(done);
    q->second->submit(std::move(task));
    return;
  }
  // Unbatched: run on the runner's threads (the server's work pool), else right here.
  auto job = [model = model_, signature, inputs = std::move(inputs), deadline, done = std::move(done),
              cancelled = std::move(cancelled), queued = Clock::now()]() mutable {
    BatchInfo info;
    const auto start = Clock::now();
    info.queue_seconds = std::chrono::duration<double>(start - queued).count();
    if (cancelled && cancelled->load())
      return done(Status{Code::kCancelled, "the client closed the connection; the request was not run"}, {}, info);
    if (start >= deadline) return done(Status{Code::kDeadlineExceeded, "deadline exceeded before the request ran"}, {}, info);
    TensorMap out;
    Status st;
    try {
      out = model->run(signature, inputs);
      info.batch_size = inputs.empty() || inputs.begin()->second.rank() == 0 ? 1 : inputs.begin()->second.dim(0);
    } catch (...) {
      st = status_of_current_exception();
    }
    info.compute_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    done(st, std::move(out), info);
  };
  if (runner_) runner_(std::move(job));
  else job();
}

TensorMap Servable::predict_sync(const std::string& signature, TensorMap inputs, Clock::time_point deadline,
                                 BatchInfo* info, const std::function<bool()>& client_gone) const {
  auto cancelled = client_gone ? std::make_shared<std::atomic<bool>>(false) : nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  Status status;
  TensorMap result;
  BatchInfo bi;
  predict(
      signature, std::move(inputs), deadline,
      [&](const Status& s, TensorMap out, const BatchInfo& i) {
        std::lock_guard<std::mutex> lock(mu);
        status = s;
        result = std::move(out);
        bi = i;
        finished = true;
        cv.notify_one();
      },
      cancelled);
  std::unique_lock<std::mutex> lock(mu);
  if (!client_gone) {
    cv.wait(lock, [&] { return finished; });
  } else {
    while (!cv.wait_for(lock, std::chrono::milliseconds(10), [&] { return finished; }))
      if (client_gone()) cancelled->store(true);
  }
  if (info) *info = bi;
  throw_if_error(status);
  return result;
}

// ---- ModelManager ----

struct ModelManager::Model {
  ModelConfig config;
  std::map<int64_t, VersionStatus> status;                        // every version seen
  std::map<int64_t, std::shared_ptr<const Servable>> available;   // taking traffic
  std::map<int64_t, std::string> failed;                          // version -> directory stamp at failure
  bool missing_base_logged = false;
};

namespace {

// Changes when a version directory is rewritten: a failed version is retried then.
std::string dir_stamp(const fs::path& dir) {
  std::error_code ec;
  auto t = fs::last_write_time(dir / package::kManifestFile, ec);
  auto sz = fs::file_size(dir / package::kManifestFile, ec);
  return std::to_string(ec ? 0 : t.time_since_epoch().count()) + ":" + std::to_string(ec ? 0 : sz);
}

std::vector<int64_t> apply_policy(const VersionPolicy& p, const std::vector<int64_t>& listed) {
  switch (p.kind) {
    case VersionPolicy::Kind::kAll: return listed;
    case VersionPolicy::Kind::kSpecific: {
      std::vector<int64_t> out;
      for (int64_t v : p.versions)
        if (std::binary_search(listed.begin(), listed.end(), v)) out.push_back(v);
      return out;
    }
    case VersionPolicy::Kind::kLatest: {
      const size_t n = static_cast<size_t>(std::max<int64_t>(p.num_versions, 1));
      return {listed.end() - std::min(n, listed.size()), listed.end()};
    }
  }
  return {};
}

}  // namespace

ModelManager::ModelManager(ManagerOptions opts) : opts_(std::move(opts)) {
  if (opts_.batching) {
    opts_.batching->validate();
    scheduler_ = std::make_unique<BatchScheduler>(opts_.batching->num_batch_threads);
  }
}

ModelManager::~ModelManager() {
  {
    std::lock_guard<std::mutex> lock(poll_mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  models_.clear();
}

void ModelManager::set_config(std::vector<ModelConfig> models) {
  std::set<std::string> names;
  for (auto& m : models) {
    if (m.name.empty()) throw InvalidArgumentError("model config: a model has no name");
    if (m.base_path.empty()) throw InvalidArgumentError("model config: model '" + m.name + "' has no base_path");
    if (!names.insert(m.name).second) throw InvalidArgumentError("model config: model '" + m.name + "' appears twice");
    if (m.policy.kind == VersionPolicy::Kind::kLatest && m.policy.num_versions < 1)
      throw InvalidArgumentError("model config: model '" + m.name + "': latest.num_versions must be >= 1");
    if (m.policy.kind == VersionPolicy::Kind::kSpecific && m.policy.versions.empty())
      throw InvalidArgumentError("model config: model '" + m.name + "': specific policy lists no versions");
    for (auto& [target, w] : m.traffic_split) {
      if (!(w > 0)) throw InvalidArgumentError("model config: model '" + m.name + "': traffic_split weight of '" +
                                               target + "' must be positive");
      int64_t v = 0;
      auto r = std::from_chars(target.data(), target.data() + target.size(), v);
      const bool is_version = !target.empty() && r.ec == std::errc() && r.ptr == target.data() + target.size() && v >= 0;
      if (!is_version && !m.labels.count(target))
        throw InvalidArgumentError("model config: model '" + m.name + "': traffic_split target '" + target +
                                   "' is neither a version number nor one of its version_labels");
    }
  }
  std::lock_guard<std::mutex> poll(poll_mu_);
  // Models dropped here are freed after the lock is released (unmapping gigabytes of
  // weights must not stall every lookup).
  std::map<std::string, std::shared_ptr<Model>> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : models) {
      auto it = models_.find(c.name);
      std::shared_ptr<Model> m;
      if (it != models_.end() && it->second->config.base_path == c.base_path) {
        m = it->second;  // keep what is loaded; the next poll applies the new policy
      } else {
        m = std::make_shared<Model>();
      }
      m->config = std::move(c);
      next[m->config.name] = m;
    }
    for (auto& [name, m] : models_)
      if (!next.count(name)) log_event(LogLevel::kInfo, "model_removed", {{"model", name}});
    models_.swap(next);
  }
  next.clear();  // the previous map: outside the lock
}

std::vector<ModelConfig> ModelManager::config() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModelConfig> out;
  for (auto& [n, m] : models_) out.push_back(m->config);
  return out;
}

void ModelManager::poll_now() {
  std::lock_guard<std::mutex> poll(poll_mu_);
  std::vector<std::shared_ptr<Model>> models;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [n, m] : models_) models.push_back(m);
  }
  for (auto& m : models) poll_model(*m);
  // This thread (the manager's, or the server's main thread at start-up and on a config
  // reload) now waits: its pool workers would only slow the threads that serve.
  release_idle_workers();
}

// One poll of one model: list its versions, load what the policy wants, publish the
// result (retiring what it no longer wants).
void ModelManager::poll_model(Model& m) {
  ModelConfig cfg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cfg = m.config;
  }
  const std::map<int64_t, std::string> stamps = list_versions(m, cfg);
  publish(m, cfg, load_desired(m, cfg, stamps), stamps);
}

// The version directories under base_path with their stamps (a missing base path is
// logged once, then again only after it came back).
std::map<int64_t, std::string> ModelManager::list_versions(Model& m, const ModelConfig& cfg) {
  std::error_code ec;
  if (!fs::is_directory(cfg.base_path, ec)) {
    if (!m.missing_base_logged)
      log_event(LogLevel::kWarning, "base_path_missing", {{"model", cfg.name}, {"base_path", cfg.base_path}});
    m.missing_base_logged = true;
  } else {
    m.missing_base_logged = false;
  }
  std::map<int64_t, std::string> stamps;
  for (int64_t v : package::list_versions(cfg.base_path)) stamps[v] = dir_stamp(fs::path(cfg.base_path) / std::to_string(v));
  return stamps;
}

// Loads the versions the policy wants and returns them. Versions that failed and have
// not changed since are not candidates: the policy then falls back to the versions that
// work (latest(1) keeps the previous one).
std::vector<int64_t> ModelManager::load_desired(Model& m, const ModelConfig& cfg,
                                                const std::map<int64_t, std::string>& stamps) {
  std::vector<int64_t> desired;
  for (;;) {
    std::vector<int64_t> candidates;
    for (const auto& [v, stamp] : stamps) {
      auto f = m.failed.find(v);
      if (f == m.failed.end() || f->second != stamp) candidates.push_back(v);
    }
    desired = apply_policy(cfg.policy, candidates);
    bool all_loaded = true;
    for (int64_t v : desired) {
      bool loaded;
      {
        std::lock_guard<std::mutex> lock(mu_);
        loaded = m.available.count(v) > 0;
      }
      if (loaded) continue;
      all_loaded = false;
      if (!load_version(m, cfg, v, stamps.at(v))) break;  // recompute the desired set without it
    }
    if (all_loaded) break;
    // Loop again: either everything desired is now loaded, or a failure changed the set.
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t v : desired) changed = changed || !m.available.count(v);
    }
    if (!changed) break;
  }
  return desired;
}

// Loads (and warms up) version v; on failure records it as failed at this stamp.
bool ModelManager::load_version(Model& m, const ModelConfig& cfg, int64_t v, const std::string& stamp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    m.status[v] = VersionStatus{v, VersionState::kLoading, {}};
  }
  const std::string dir = (fs::path(cfg.base_path) / std::to_string(v)).string();
  log_event(LogLevel::kInfo, "version_loading", {{"model", cfg.name}, {"version", std::to_string(v)}, {"dir", dir}});
  const auto t0 = Clock::now();
  try {
    auto saved = package::SavedModel::load(dir, opts_.load);
    auto servable = std::make_shared<Servable>(cfg.name, v, std::move(saved));
    if (scheduler_) servable->enable_batching(*scheduler_, *opts_.batching);
    servable->set_unbatched_runner(opts_.unbatched_runner);
    if (opts_.warmup) opts_.warmup(*servable);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      m.available[v] = std::move(servable);
      m.status[v] = VersionStatus{v, VersionState::kAvailable, {}};
      m.failed.erase(v);
    }
    ++loads_;
    if (opts_.metrics) {
      opts_.metrics->gauge("kiln_model_load_seconds", "Seconds the last load (with warm-up) of a version took",
                           {"model", "version"}).at({cfg.name, std::to_string(v)}).set(secs);
      opts_.metrics->counter("kiln_model_loads_total", "Version loads by result", {"model", "result"})
          .at({cfg.name, "ok"}).inc();
    }
    log_event(LogLevel::kInfo, "version_available",
              {{"model", cfg.name}, {"version", std::to_string(v)}, {"seconds", std::to_string(secs)}});
    return true;
  } catch (...) {
    Status st = status_of_current_exception();
    {
      std::lock_guard<std::mutex> lock(mu_);
      m.status[v] = VersionStatus{v, VersionState::kEnd, st};
      m.failed[v] = stamp;
    }
    if (opts_.metrics)
      opts_.metrics->counter("kiln_model_loads_total", "Version loads by result", {"model", "result"})
          .at({cfg.name, "error"}).inc();
    log_event(LogLevel::kError, "version_failed",
              {{"model", cfg.name}, {"version", std::to_string(v)}, {"code", std::string(code_name(st.code))},
               {"error", st.message}});
    return false;
  }
}

// Publishes a poll's result: versions no longer desired stop taking traffic now and are
// freed when their last in-flight request ends; the status list stays bounded.
void ModelManager::publish(Model& m, const ModelConfig& cfg, const std::vector<int64_t>& desired,
                           const std::map<int64_t, std::string>& stamps) {
  std::vector<std::shared_ptr<const Servable>> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = m.available.begin(); it != m.available.end();) {
      if (std::find(desired.begin(), desired.end(), it->first) == desired.end()) {
        m.status[it->first] = VersionStatus{it->first, VersionState::kEnd, {}};
        retired.push_back(std::move(it->second));
        it = m.available.erase(it);
      } else {
        ++it;
      }
    }
    // Keep the status of the 16 most recent unloaded versions: a server swapping versions
    // for months must not grow its status list forever.
    int ended = 0;
    for (auto it = m.status.rbegin(); it != m.status.rend();) {
      const bool drop = it->second.state == VersionState::kEnd && it->second.status.ok() && ++ended > 16;
      it = drop ? decltype(it)(m.status.erase(std::next(it).base())) : std::next(it);
    }
    // Forget failed versions whose directory is gone.
    for (auto it = m.failed.begin(); it != m.failed.end();) {
      if (!stamps.count(it->first)) {
        m.status.erase(it->first);
        it = m.failed.erase(it);
      } else {
        ++it;
      }
    }
    if (opts_.metrics) {
      auto& g = opts_.metrics->gauge("kiln_model_version_state",
                                     "State of each version (TF Serving's numbers: 30 AVAILABLE, 50 END)",
                                     {"model", "version"});
      for (auto& [v, s] : m.status) g.at({cfg.name, std::to_string(v)}).set(static_cast<double>(s.state));
    }
  }
  for (auto& s : retired)
    log_event(LogLevel::kInfo, "version_unloading", {{"model", cfg.name}, {"version", std::to_string(s->version())}});
}

void ModelManager::start() {
  if (opts_.poll_seconds <= 0 || thread_.joinable()) return;
  thread_ = std::thread([this] { loop(); });
}

void ModelManager::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(poll_mu_);
      if (cv_.wait_for(lock, std::chrono::duration<double>(opts_.poll_seconds), [&] { return stop_; })) return;
    }
    try {
      poll_now();
    } catch (...) {
      auto st = status_of_current_exception();
      log_event(LogLevel::kError, "poll_failed", {{"error", st.message}});
    }
  }
}

std::shared_ptr<const Servable> ModelManager::find(const std::string& model, std::optional<int64_t> version,
                                                   const std::string& label) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end())
    throw NotFoundError("Servable not found for request: model '" + model + "' is not configured");
  const Model& m = *it->second;
  auto specific = [&](int64_t v, const std::string& how) -> std::shared_ptr<const Servable> {
    auto a = m.available.find(v);
    if (a == m.available.end())
      throw NotFoundError("Servable not found for request: " + how + " of model '" + model +
                                              "': version " + std::to_string(v) + " is not available");
    return a->second;
  };
  if (version) return specific(*version, "version " + std::to_string(*version));
  if (!label.empty()) {
    auto l = m.config.labels.find(label);
    if (l == m.config.labels.end())
      throw InvalidArgumentError("Unrecognized servable version label: '" + label + "' of model '" + model + "'");
    return specific(l->second, "label '" + label + "'");
  }
  if (m.available.empty())
    throw UnavailableError("model '" + model + "' has no available version yet");
  if (!m.config.traffic_split.empty()) {
    // Weighted choice among the targets that resolve to an available version.
    std::vector<std::pair<std::shared_ptr<const Servable>, double>> targets;
    double total = 0;
    for (auto& [target, w] : m.config.traffic_split) {
      int64_t v;
      auto l = m.config.labels.find(target);
      if (l != m.config.labels.end()) v = l->second;
      else std::from_chars(target.data(), target.data() + target.size(), v);  // validated by set_config
      auto a = m.available.find(v);
      if (a == m.available.end()) continue;
      targets.emplace_back(a->second, w);
      total += w;
    }
    if (!targets.empty()) {
      double r;
      {
        std::lock_guard<std::mutex> rl(rng_mu_);
        r = std::uniform_real_distribution<double>(0, total)(rng_);
      }
      for (auto& [s, w] : targets) {
        if (r < w) return s;
        r -= w;
      }
      return targets.back().first;
    }
  }
  return m.available.rbegin()->second;
}

std::vector<VersionStatus> ModelManager::status(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it == models_.end())
    throw NotFoundError("Could not find any versions of model " + model);
  std::vector<VersionStatus> out;
  for (auto& [v, s] : it->second->status) out.push_back(s);
  // Newest first, as TF Serving lists them.
  std::reverse(out.begin(), out.end());
  return out;
}

std::map<std::string, int64_t> ModelManager::queued_rows() const {
  std::vector<std::pair<std::string, std::shared_ptr<const Servable>>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [n, m] : models_)
      for (auto& [v, s] : m->available) all.emplace_back(n, s);
  }
  std::map<std::string, int64_t> out;
  for (auto& [n, s] : all) out[n] += s->queued_rows();
  return out;
}

std::vector<std::string> ModelManager::model_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (auto& [n, m] : models_) out.push_back(n);
  return out;
}

bool ModelManager::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (models_.empty()) return false;
  for (auto& [n, m] : models_)
    if (m->available.empty()) return false;
  return true;
}

}  // namespace kiln::serving
