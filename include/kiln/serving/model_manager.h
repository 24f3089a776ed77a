#pragma once
// The model manager: which versions of which models serve, loading and unloading them
// as their base paths change, as TensorFlow Serving's AspiredVersionsManager does.
//
// Each configured model has a base path with numeric version directories (kiln model
// packages). A poll (every --file_system_poll_wait_seconds, or poll_now()) lists them,
// picks the versions its policy asks for (latest N, all, specific), loads and warms up
// the new ones on the polling thread, and only then publishes them: requests switch
// atomically to the new set. A version that leaves the set stops taking new requests
// at once and is freed when its last in-flight request finishes (requests hold a
// shared_ptr to their Servable). A version that fails to load or warm up is reported
// in status() with its error, is not retried until its directory changes, and never
// takes traffic; the versions already serving keep serving.
//
// Thread-safety: find(), status(), ready() may be called from any thread at any time;
// set_config() and poll_now() serialise with the polling thread.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/package/saved_model.h"
#include "kiln/serving/batching.h"
#include "kiln/serving/status.h"

namespace kiln {
class Metrics;
}

namespace kiln::serving {

struct VersionPolicy {
  enum class Kind { kLatest, kAll, kSpecific };
  Kind kind = Kind::kLatest;
  int64_t num_versions = 1;        // kLatest
  std::vector<int64_t> versions;   // kSpecific
};

struct ModelConfig {
  std::string name;
  std::string base_path;
  VersionPolicy policy;
  std::map<std::string, int64_t> labels;          // "stable" -> 3
  // Canary / A-B: requests that name no version or label go to these targets (a label
  // or a version number, as text) in proportion to the weights. Empty: the latest
  // available version takes them all.
  std::map<std::string, double> traffic_split;
};

// TensorFlow Serving's ModelVersionStatus.State numbers.
enum class VersionState { kUnknown = 0, kStart = 10, kLoading = 20, kAvailable = 30, kUnloading = 40, kEnd = 50 };
std::string_view state_name(VersionState s);  // "AVAILABLE", ...

struct VersionStatus {
  int64_t version = 0;
  VersionState state = VersionState::kUnknown;
  Status status;  // the load or warm-up error of a version that failed
};

// One loaded model version: what requests run on.
class Servable {
 public:
  Servable(std::string model_name, int64_t version, std::shared_ptr<const package::SavedModel> model);
  ~Servable();
  const std::string& model_name() const { return model_name_; }
  int64_t version() const { return version_; }
  const package::SavedModel& model() const { return *model_; }

  // Runs a signature, batched with other requests when batching is on for it (its
  // every output has the batch as dimension 0), else on the unbatched runner (or the
  // calling thread without one).
  // `done` is called exactly once (possibly before predict() returns).
  void predict(const std::string& signature, TensorMap inputs, Clock::time_point deadline,
               std::function<void(const Status&, TensorMap, const BatchInfo&)> done,
               std::shared_ptr<const std::atomic<bool>> cancelled = nullptr) const;
  // Blocking form; throws kiln::Error (UnavailableError, DeadlineExceededError, ...). `client_gone`, when given, is
  // polled every 10 ms while the call waits: once true, the request is cancelled
  // (dropped from its queue, CANCELLED) instead of run.
  TensorMap predict_sync(const std::string& signature, TensorMap inputs,
                         Clock::time_point deadline = Clock::time_point::max(), BatchInfo* info = nullptr,
                         const std::function<bool()>& client_gone = nullptr) const;
  void enable_batching(BatchScheduler& sched, const BatchingOptions& opts);
  // Where unbatched calls run (a thread pool); unset: on the calling thread.
  void set_unbatched_runner(std::function<void(std::function<void()>)> runner) { runner_ = std::move(runner); }
  // Rows waiting in this version's batching queues.
  int64_t queued_rows() const;

 private:
  std::string model_name_;
  int64_t version_;
  std::shared_ptr<const package::SavedModel> model_;
  std::map<std::string, std::shared_ptr<BatchQueue>> queues_;  // by signature
  std::function<void(std::function<void()>)> runner_;
};

struct ManagerOptions {
  double poll_seconds = 1.0;  // <= 0: no polling thread (poll_now() only)
  package::LoadOptions load;
  std::optional<BatchingOptions> batching;  // unset: no batching
  // Runs unbatched calls (Servable::set_unbatched_runner); unset: the caller's thread.
  std::function<void(std::function<void()>)> unbatched_runner;
  // Runs on each newly loaded version before it takes traffic (the server replays
  // assets.extra/tf_serving_warmup_requests); throwing marks the version failed.
  std::function<void(const Servable&)> warmup;
  Metrics* metrics = nullptr;
};

class ModelManager {
 public:
  explicit ModelManager(ManagerOptions opts);
  ~ModelManager();  // stops polling; servables die with their last request

  // Replaces the configured models (validated first: unique names, non-empty base
  // paths, positive weights; InvalidArgumentError otherwise, nothing changed). Models
  // no longer configured are unloaded; new ones load on the next poll (poll_now() runs
  // it at once).
  void set_config(std::vector<ModelConfig> models);
  std::vector<ModelConfig> config() const;
  void poll_now();
  void start();  // the polling thread (when poll_seconds > 0)

  // The servable for a request: a version, a label, or neither (traffic split or the
  // latest). NOT_FOUND for an unknown model or version (or a label whose version is not
  // available: labels resolve at request time, as TF Serving's
  // --allow_version_labels_for_unavailable_models), INVALID_ARGUMENT for an unknown
  // label (TF Serving's code), UNAVAILABLE while the model has no available version yet.
  std::shared_ptr<const Servable> find(const std::string& model, std::optional<int64_t> version,
                                       const std::string& label) const;
  std::vector<VersionStatus> status(const std::string& model) const;  // NOT_FOUND if unknown
  std::vector<std::string> model_names() const;
  // Every configured model has an available version.
  bool ready() const;
  // Rows waiting in the batching queues of each model's available versions.
  std::map<std::string, int64_t> queued_rows() const;
  // Versions loaded and unloaded so far (tests, metrics).
  int64_t loads() const { return loads_.load(); }

 private:
  struct Model;
  // poll_model's phases (model_manager.cc).
  void poll_model(Model& m);
  std::map<int64_t, std::string> list_versions(Model& m, const ModelConfig& cfg);
  std::vector<int64_t> load_desired(Model& m, const ModelConfig& cfg, const std::map<int64_t, std::string>& stamps);
  bool load_version(Model& m, const ModelConfig& cfg, int64_t v, const std::string& stamp);
  void publish(Model& m, const ModelConfig& cfg, const std::vector<int64_t>& desired,
               const std::map<int64_t, std::string>& stamps);
  void loop();
  ManagerOptions opts_;
  std::unique_ptr<BatchScheduler> scheduler_;
  mutable std::mutex mu_;  // guards models_ (the map and each Model's published state)
  std::map<std::string, std::shared_ptr<Model>> models_;
  std::mutex poll_mu_;     // one poll at a time
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  std::atomic<int64_t> loads_{0};
  mutable std::mutex rng_mu_;
  mutable std::mt19937_64 rng_{0x6b696c6e};
};

}  // namespace kiln::serving
