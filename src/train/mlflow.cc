// MLflow's file store, written (kiln/train/mlflow.h).
#include "kiln/train/mlflow.h"

#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"

namespace kiln::train {
namespace fs = std::filesystem;

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string root_of(const std::string& uri) {
  std::string p = uri;
  if (p.rfind("file://", 0) == 0) p = p.substr(7);
  else if (p.rfind("file:", 0) == 0) p = p.substr(5);
  else if (p.find("://") != std::string::npos)
    throw UnimplementedError("MLflow tracking URI '" + uri +
                             "': kiln writes MLflow's file store (file:DIR); serve it with `mlflow server "
                             "--backend-store-uri` or migrate it to a database");
  if (p.empty()) throw InvalidArgumentError("MLflow tracking URI '" + uri + "' names no directory");
  return fs::absolute(p).lexically_normal().string();
}

// A YAML scalar in single quotes (MLflow's own meta.yaml quotes ids that way).
std::string yaml_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

void write(const fs::path& p, const std::string& text) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  if (ec) throw FailedPreconditionError("MLflow: cannot create " + p.parent_path().string() + ": " + ec.message());
  write_file_atomic(p.string(), text);
}

// A key MLflow accepts as a file name: letters, digits, _ - . space and /.
void check_key(const std::string& key, const char* what) {
  bool ok = !key.empty() && key.size() <= 250 && key.find("..") == std::string::npos && key[0] != '/';
  for (char c : key) ok &= std::isalnum(static_cast<unsigned char>(c)) || std::string("_-. /").find(c) != std::string::npos;
  if (!ok) throw InvalidArgumentError(std::string("MLflow ") + what + " '" + key + "' is not a valid name");
}

std::string experiment_yaml(const std::string& id, const std::string& name, const std::string& location, int64_t ms) {
  return "artifact_location: " + location + "\ncreation_time: " + std::to_string(ms) + "\nexperiment_id: " + yaml_quoted(id) +
         "\nlast_update_time: " + std::to_string(ms) + "\nlifecycle_stage: active\nname: " + yaml_quoted(name) + "\n";
}

// The experiment's id: an existing directory whose meta.yaml has this name, or a new one
// ("Default" is 0, others the next free number).
std::string find_or_create_experiment(const fs::path& root, const std::string& name) {
  std::error_code ec;
  int64_t next = 1;
  if (fs::is_directory(root, ec))
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string id = e.path().filename().string();
      if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) continue;
      next = std::max<int64_t>(next, std::stoll(id) + 1);
      std::ifstream meta(e.path() / "meta.yaml");
      for (std::string line; std::getline(meta, line);)
        if (line == "name: " + name || line == "name: " + yaml_quoted(name)) return id;
    }
  const std::string id = name == "Default" ? "0" : std::to_string(next);
  const int64_t ms = now_ms();
  write(root / id / "meta.yaml", experiment_yaml(id, name, "file://" + (root / id).string(), ms));
  return id;
}

std::string random_hex32() {
  std::random_device rd;
  std::mt19937_64 g((uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(now_ms()));
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(g()),
                static_cast<unsigned long long>(g()));
  return buf;
}

}  // namespace

std::shared_ptr<MlflowRun> MlflowRun::start(const MlflowRunOptions& opts) {
  const fs::path root = root_of(opts.tracking_uri);
  std::shared_ptr<MlflowRun> r(new MlflowRun());
  r->experiment_id_ = find_or_create_experiment(root, opts.experiment.empty() ? "Default" : opts.experiment);
  r->id_ = random_hex32();
  r->name_ = opts.run_name.empty() ? r->id_ : opts.run_name;
  r->dir_ = (root / r->experiment_id_ / r->id_).string();
  r->artifact_uri_ = "file://" + r->dir_ + "/artifacts";
  const passwd* pw = getpwuid(getuid());  // the account, as MLflow's client records it
  r->user_ = pw && pw->pw_name ? pw->pw_name : std::to_string(getuid());
  r->start_ms_ = now_ms();
  r->write_meta();
  std::error_code ec;
  fs::create_directories(fs::path(r->dir_) / "artifacts", ec);
  r->set_tag("mlflow.runName", r->name_);
  r->set_tag("mlflow.user", r->user_);
  r->set_tag("mlflow.source.type", "LOCAL");
  r->set_tag("mlflow.source.name", "kiln");
  return r;
}

void MlflowRun::write_meta() {
  std::string y = "artifact_uri: " + artifact_uri_ + "\n";
  y += "end_time: " + (end_ms_ ? std::to_string(end_ms_) : std::string("null")) + "\n";
  y += "entry_point_name: ''\nexperiment_id: " + yaml_quoted(experiment_id_) + "\nlifecycle_stage: active\n";
  y += "run_id: " + id_ + "\nrun_name: " + yaml_quoted(name_) + "\nrun_uuid: " + id_ + "\n";
  y += "source_name: ''\nsource_type: 4\nsource_version: ''\nstart_time: " + std::to_string(start_ms_) + "\n";
  y += "status: " + std::to_string(status_) + "\ntags: []\nuser_id: " + yaml_quoted(user_) + "\n";
  write(fs::path(dir_) / "meta.yaml", y);
}

void MlflowRun::log_param(const std::string& key, const std::string& value) {
  check_key(key, "param");
  const fs::path p = fs::path(dir_) / "params" / key;
  std::error_code ec;
  if (fs::exists(p, ec)) {
    if (read_file(p.string()) != value)
      throw InvalidArgumentError("MLflow param '" + key + "' was logged already with another value");
    return;
  }
  write(p, value);
}

void MlflowRun::log_metric(const std::string& key, double value, int64_t step) {
  check_key(key, "metric");
  const fs::path p = fs::path(dir_) / "metrics" / key;
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  std::ofstream out(p, std::ios::app);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  out << now_ms() << ' ' << buf << ' ' << step << '\n';
  if (!out) throw FailedPreconditionError("MLflow: cannot append to " + p.string());
}

void MlflowRun::set_tag(const std::string& key, const std::string& value) {
  check_key(key, "tag");
  write(fs::path(dir_) / "tags" / key, value);
}

void MlflowRun::log_artifacts(const std::string& path, const std::string& artifact_path) {
  const fs::path to = fs::path(dir_) / "artifacts" / artifact_path;
  std::error_code ec;
  fs::create_directories(to, ec);
  if (fs::is_directory(path, ec))
    fs::copy(path, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
  else
    fs::copy_file(path, to / fs::path(path).filename(), fs::copy_options::overwrite_existing, ec);
  if (ec) throw FailedPreconditionError("MLflow: cannot copy " + path + " to " + to.string() + ": " + ec.message());
}

void MlflowRun::end(const std::string& status) {
  if (status == "FINISHED") status_ = 3;
  else if (status == "FAILED") status_ = 4;
  else if (status == "KILLED") status_ = 5;
  else throw InvalidArgumentError("MLflow run status '" + status + "' (FINISHED, FAILED or KILLED)");
  end_ms_ = now_ms();
  write_meta();
}

namespace callbacks {
namespace {

class MlflowCallback : public Callback {
 public:
  explicit MlflowCallback(std::shared_ptr<MlflowRun> run) : run_(std::move(run)) {}
  ~MlflowCallback() override {
    if (running_) {
      try {
        run_->end("FAILED");  // fit left by an exception
      } catch (...) {
      }
    }
  }
  void on_train_begin(Logs&) override { running_ = true; }
  void on_epoch_end(int epoch, Logs& logs) override {
    for (const auto& [k, v] : logs) run_->log_metric(k, v, epoch);
  }
  void on_train_end(Logs&) override {
    running_ = false;
    run_->end("FINISHED");
  }

 private:
  std::shared_ptr<MlflowRun> run_;
  bool running_ = false;
};

}  // namespace

CallbackPtr MlflowLogger(std::shared_ptr<MlflowRun> run) { return std::make_shared<MlflowCallback>(std::move(run)); }

}  // namespace callbacks
}  // namespace kiln::train
