#pragma once
// Experiment lineage in MLflow's file store (the `file:` tracking URI layout that
// MLflow's client reads; `kiln train --mlflow_tracking_uri file:DIR`):
//   DIR/<experiment id>/meta.yaml                   the experiment ("Default" is id 0)
//   DIR/<experiment id>/<run id>/meta.yaml          run status, start/end times, name
//   .../<run id>/params/<key>                       a value
//   .../<run id>/metrics/<key>                      lines "<ms since epoch> <value> <step>"
//   .../<run id>/tags/<key>                         a value (mlflow.runName, mlflow.user,
//                                                   mlflow.source.*, kiln.* ...)
//   .../<run id>/artifacts/...                      files (the exported package)
//
//   auto run = MlflowRun::start({.tracking_uri = "file:mlruns", .run_name = "mlp"});
//   run->log_param("epochs", "5");
//   fit(..., {.callbacks = {callbacks::MlflowLogger(run)}});   // per-epoch metrics, status
//   run->log_artifacts("runs/mlp/export/1", "model");
//
// Errors: a tracking URI that is not `file:` (or a plain path) is UnimplementedError; a
// directory that cannot be written is FailedPreconditionError naming it; a param logged
// twice with another value is InvalidArgumentError (as MLflow refuses it).
// Thread-safety: a run is used by one thread at a time.
#include <map>
#include <memory>
#include <string>

#include "kiln/train/callbacks.h"

namespace kiln::train {

struct MlflowRunOptions {
  std::string tracking_uri;             // "file:/path", "file:///path" or a path
  std::string experiment = "Default";   // created when missing
  std::string run_name;                 // empty: the run id
};

class MlflowRun {
 public:
  static std::shared_ptr<MlflowRun> start(const MlflowRunOptions& opts);
  const std::string& id() const { return id_; }
  const std::string& experiment_id() const { return experiment_id_; }
  const std::string& dir() const { return dir_; }  // the run's directory
  void log_param(const std::string& key, const std::string& value);
  void log_metric(const std::string& key, double value, int64_t step);
  void set_tag(const std::string& key, const std::string& value);
  // Copies a file or a directory tree under artifacts/<artifact_path>/.
  void log_artifacts(const std::string& path, const std::string& artifact_path);
  // FINISHED, FAILED or KILLED, with the end time. A run never ended stays RUNNING.
  void end(const std::string& status = "FINISHED");

 private:
  MlflowRun() = default;
  void write_meta();
  std::string dir_, id_, experiment_id_, name_, user_, artifact_uri_;
  int64_t start_ms_ = 0, end_ms_ = 0;
  int status_ = 1;  // MLflow's RunStatus: RUNNING 1, FINISHED 3, FAILED 4, KILLED 5
};

namespace callbacks {
// Logs every epoch's logs (loss, accuracy, val_*, samples_per_sec, ...) as metrics with
// step = epoch, and ends the run FINISHED when fit ends (FAILED if an exception leaves
// fit: the callback's destructor marks a run still running as FAILED).
CallbackPtr MlflowLogger(std::shared_ptr<MlflowRun> run);
}  // namespace callbacks

}  // namespace kiln::train
