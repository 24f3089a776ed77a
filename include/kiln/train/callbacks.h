#pragma once
// Callbacks (keras.callbacks): hooks that fit/evaluate call around epochs and
// batches. `logs` maps names ("loss", "accuracy", "val_loss", "lr", ...) to values.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln {
class Metrics;
}

namespace kiln::train {

class Model;
using Logs = std::map<std::string, double>;

class Callback {
 public:
  virtual ~Callback() = default;
  void set_model(Model* m) { model_ = m; }
  Model* model() const { return model_; }
  virtual void on_train_begin(Logs&) {}
  virtual void on_train_end(Logs&) {}
  virtual void on_epoch_begin(int /*epoch*/, Logs&) {}
  virtual void on_epoch_end(int /*epoch*/, Logs&) {}
  virtual void on_train_batch_begin(int64_t /*batch*/, Logs&) {}
  virtual void on_train_batch_end(int64_t /*batch*/, Logs&) {}
  virtual void on_test_begin(Logs&) {}
  virtual void on_test_end(Logs&) {}

 protected:
  Model* model_ = nullptr;
};
using CallbackPtr = std::shared_ptr<Callback>;

// What fit returns (keras History): one value per epoch for every log key.
struct History {
  std::map<std::string, std::vector<double>> history;
  std::vector<int> epochs;
  const std::vector<double>& at(const std::string& key) const;
};

namespace callbacks {

// Stops training when `monitor` stops improving by min_delta for `patience` epochs.
// mode: "min", "max" or "auto" (max for names containing "acc"/"auc").
CallbackPtr EarlyStopping(std::string monitor = "val_loss", double min_delta = 0, int patience = 0,
                          std::string mode = "auto", bool restore_best_weights = false);
// Saves the model weights (and optimizer state) to `filepath` after each epoch, or
// only when `monitor` improved if save_best_only. "{epoch}" in filepath is replaced
// by the 1-based epoch number.
CallbackPtr ModelCheckpoint(std::string filepath, std::string monitor = "val_loss", bool save_best_only = false,
                            std::string mode = "auto");
// Sets the optimizer's learning rate from schedule(epoch, current lr) at each epoch start.
CallbackPtr LearningRateScheduler(std::function<double(int epoch, double lr)> schedule);
// Appends one CSV row per epoch (header on first write): epoch, then the log keys.
CallbackPtr CSVLogger(std::string filename, char separator = ',', bool append = false);
// Crash recovery: saves model + optimizer state + epoch/step counters to backup_dir
// at every epoch end (and every save_freq batches when save_freq > 0); fit restores
// it at train begin and resumes where the backup was taken; deleted when training
// completes. Corrupted backups are skipped with a warning naming the file. Under a
// multi-worker strategy only the chief writes and deletes backups; every worker restores
// from backup_dir (a directory they share), so a relaunched job resumes every worker
// from the same backup.
CallbackPtr BackupAndRestore(std::string backup_dir, int64_t save_freq = 0, bool delete_checkpoint = true);
// Writes logs as TensorBoard scalars (train/ and validation/ runs) to log_dir,
// per epoch and every update_freq batches when update_freq > 0.
CallbackPtr TensorBoard(std::string log_dir, int64_t update_freq = 0);
// Training progress as Prometheus metrics in `metrics` (serve them with
// kiln/core/metrics_endpoint.h; `kiln train --metrics_port`): kiln_train_running (1
// while fit runs), kiln_train_epoch, kiln_train_steps_total, kiln_train_samples_total,
// kiln_train_step_seconds (histogram: a step's compute), kiln_train_input_wait_seconds_total
// (time between steps: the input pipeline), kiln_train_loss (the epoch's running mean),
// kiln_train_epoch_metric{name} (the last epoch's logs: accuracy, val_*, samples_per_sec,
// input_wait, ...). `metrics` must outlive the callback.
CallbackPtr PrometheusMetrics(Metrics& metrics);

}  // namespace callbacks
}  // namespace kiln::train
