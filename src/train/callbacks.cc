#include "kiln/train/callbacks.h"

#include "kiln/distribute/strategy.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "kiln/core/device_config.h"
#include "kiln/train/model.h"
#include "kiln/train/tensorboard.h"
#include "train_util.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;

bool maximize(const std::string& monitor, const std::string& mode) {
  if (mode == "max") return true;
  if (mode == "min") return false;
  if (mode != "auto") throw InvalidArgumentError("callback mode must be 'min', 'max' or 'auto', got '" + mode + "'");
  return monitor.find("acc") != std::string::npos || monitor.find("auc") != std::string::npos;
}

const double* find_log(const Logs& logs, const std::string& key) {
  auto it = logs.find(key);
  return it == logs.end() ? nullptr : &it->second;
}

// ---- EarlyStopping ----------------------------------------------------------------

class EarlyStoppingCb : public Callback {
 public:
  EarlyStoppingCb(std::string monitor, double min_delta, int patience, std::string mode, bool restore)
      : monitor_(std::move(monitor)),
        min_delta_(std::abs(min_delta)),
        patience_(patience),
        max_(maximize(monitor_, mode)),
        restore_(restore) {}
  void on_train_begin(Logs&) override {
    wait_ = 0;
    best_ = max_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    best_weights_.clear();
  }
  void on_epoch_end(int epoch, Logs& logs) override {
    const double* v = find_log(logs, monitor_);
    if (!v) {
      std::cerr << "EarlyStopping: metric '" << monitor_ << "' is not in the logs; available:";
      for (auto& [k, _] : logs) std::cerr << " " << k;
      std::cerr << "\n";
      return;
    }
    bool better = max_ ? *v > best_ + min_delta_ : *v < best_ - min_delta_;
    if (better) {
      best_ = *v;
      wait_ = 0;
      if (restore_) {
        best_weights_.clear();
        for (const Variable& w : model()->weights()) best_weights_.push_back(w.peek().clone());
      }
      return;
    }
    if (++wait_ > patience_) {
      model()->stop_training = true;
      stopped_epoch_ = epoch;
    }
  }
  void on_train_end(Logs&) override {
    if (restore_ && stopped_epoch_ >= 0 && !best_weights_.empty()) {
      auto ws = model()->weights();
      for (size_t i = 0; i < ws.size() && i < best_weights_.size(); ++i) ws[i].assign(best_weights_[i]);
    }
  }

 private:
  std::string monitor_;
  double min_delta_;
  int patience_;
  bool max_, restore_;
  int wait_ = 0;
  int stopped_epoch_ = -1;
  double best_ = 0;
  std::vector<Tensor> best_weights_;
};

// ---- ModelCheckpoint --------------------------------------------------------------

std::string format_epoch(std::string path, int epoch) {
  const std::string key = "{epoch}";
  for (size_t p; (p = path.find(key)) != std::string::npos;) path.replace(p, key.size(), std::to_string(epoch));
  return path;
}

class ModelCheckpointCb : public Callback {
 public:
  ModelCheckpointCb(std::string path, std::string monitor, bool best_only, std::string mode)
      : path_(std::move(path)), monitor_(std::move(monitor)), best_only_(best_only), max_(maximize(monitor_, mode)) {
    best_ = max_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  void on_epoch_end(int epoch, Logs& logs) override {
    if (best_only_) {
      const double* v = find_log(logs, monitor_);
      if (!v) {
        std::cerr << "ModelCheckpoint: metric '" << monitor_ << "' is not in the logs; not saving\n";
        return;
      }
      if (!(max_ ? *v > best_ : *v < best_)) return;
      best_ = *v;
    }
    std::string p = format_epoch(path_, epoch + 1);
    fs::path parent = fs::path(p).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    model()->save_weights(p);
  }

 private:
  std::string path_, monitor_;
  bool best_only_, max_;
  double best_;
};

// ---- LearningRateScheduler ----------------------------------------------------------

class LrSchedulerCb : public Callback {
 public:
  explicit LrSchedulerCb(std::function<double(int, double)> f) : f_(std::move(f)) {}
  void on_epoch_begin(int epoch, Logs&) override {
    const OptimizerPtr& opt = model()->optimizer();
    if (!opt) throw FailedPreconditionError("LearningRateScheduler: the model has no optimizer (compile it)");
    double lr = f_(epoch, opt->learning_rate());
    if (!std::isfinite(lr) || lr < 0)
      throw InvalidArgumentError("LearningRateScheduler: schedule returned " + std::to_string(lr) + " for epoch " +
                                 std::to_string(epoch));
    opt->set_learning_rate(lr);
  }

 private:
  std::function<double(int, double)> f_;
};

// ---- CSVLogger -----------------------------------------------------------------------

class CsvLoggerCb : public Callback {
 public:
  CsvLoggerCb(std::string file, char sep, bool append) : file_(std::move(file)), sep_(sep), append_(append) {}
  void on_train_begin(Logs&) override {
    bool has_header = append_ && fs::exists(file_) && fs::file_size(file_) > 0;
    out_.open(file_, append_ ? std::ios::app : std::ios::trunc);
    if (!out_) throw NotFoundError("CSVLogger: cannot open '" + file_ + "' for writing");
    header_written_ = has_header;
  }
  void on_epoch_end(int epoch, Logs& logs) override {
    if (!header_written_) {
      out_ << "epoch";
      for (auto& [k, _] : logs) out_ << sep_ << k;
      out_ << "\n";
      header_written_ = true;
    }
    out_ << epoch;
    char buf[64];
    for (auto& [_, v] : logs) {
      std::snprintf(buf, sizeof buf, "%.17g", v);
      out_ << sep_ << buf;
    }
    out_ << "\n";
    out_.flush();
  }
  void on_train_end(Logs&) override { out_.close(); }

 private:
  std::string file_;
  char sep_;
  bool append_;
  bool header_written_ = false;
  std::ofstream out_;
};

// ---- BackupAndRestore ----------------------------------------------------------------

class BackupAndRestoreCb : public Callback {
 public:
  BackupAndRestoreCb(std::string dir, int64_t freq, bool del)
      : manager_(std::move(dir), /*max_to_keep=*/2, "backup"), freq_(freq), delete_(del) {}
  void on_train_begin(Logs&) override {
    std::vector<std::pair<std::string, std::string>> skipped;
    std::optional<CheckpointData> d = manager_.restore_latest(&skipped);
    for (auto& [path, why] : skipped)
      std::cerr << "BackupAndRestore: skipping corrupted backup " << path << ": " << why << "\n";
    if (!d) return;
    model()->load_state(*d);
    global_step_ = model()->optimizer() ? model()->optimizer()->iterations() : 0;
    std::cerr << "BackupAndRestore: resumed from " << manager_.latest().value_or("?") << " at epoch "
              << model()->epoch_counter + 1 << ", batch " << model()->step_in_epoch << "\n";
  }
  void on_train_batch_end(int64_t, Logs&) override {
    ++global_step_;
    if (freq_ > 0 && global_step_ % freq_ == 0) save();
  }
  void on_epoch_end(int, Logs&) override { save(); }
  void on_train_end(Logs&) override {
    if (!delete_ || model()->stop_training || !writer()) return;
    for (const std::string& p : manager_.checkpoints()) fs::remove(p);
  }

 private:
  // Under a multi-worker strategy the chief alone writes (the others read the same directory).
  bool writer() const { return !model()->strategy() || model()->strategy()->is_chief(); }
  void save() {
    if (!writer()) return;
    int64_t step = model()->optimizer() ? model()->optimizer()->iterations() : global_step_;
    manager_.save(model()->state(), step);
  }
  CheckpointManager manager_;
  int64_t freq_;
  bool delete_;
  int64_t global_step_ = 0;
};

// ---- TensorBoard -------------------------------------------------------------------------

class TensorBoardCb : public Callback {
 public:
  TensorBoardCb(std::string dir, int64_t freq) : dir_(std::move(dir)), freq_(freq) {}
  void on_train_begin(Logs&) override {
    train_ = std::make_unique<SummaryWriter>((fs::path(dir_) / "train").string());
    val_ = std::make_unique<SummaryWriter>((fs::path(dir_) / "validation").string());
    step_ = model()->optimizer() ? model()->optimizer()->iterations() : 0;
  }
  void on_train_batch_end(int64_t, Logs& logs) override {
    ++step_;
    if (freq_ > 0 && step_ % freq_ == 0)
      for (auto& [k, v] : logs) train_->scalar("batch_" + k, v, step_);
  }
  // Initialized logical devices, without asking about device types nobody used (that
  // would load the CUDA plugin into a CPU-only process).
  static std::vector<config::LogicalDevice> initialized_devices() {
    std::vector<config::LogicalDevice> out;
    for (DeviceType t : {DeviceType::kCPU, DeviceType::kCUDA}) {
      if (!config::is_initialized(t)) continue;
      for (const auto& d : config::list_logical_devices(t))
        if (d.initialized) out.push_back(d);
    }
    return out;
  }
  void on_epoch_begin(int, Logs&) override {
    // Peaks are per epoch: each initialized device's peak restarts here.
    for (const auto& d : initialized_devices()) config::reset_peak_memory_stats(d.device);
  }
  void on_epoch_end(int epoch, Logs& logs) override {
    for (auto& [k, v] : logs) {
      if (k.rfind("val_", 0) == 0)
        val_->scalar("epoch_" + k.substr(4), v, epoch);
      else
        train_->scalar("epoch_" + k, v, epoch);
    }
    // Allocator statistics of every initialized logical device, as
    // memory/<device>/<stat> with the device's ':' made '_' (as TensorFlow sanitizes tags).
    for (const auto& d : initialized_devices()) {
      AllocatorStats st = config::memory_stats(d.device);
      std::string dev = d.device.str();
      dev[dev.find(':')] = '_';
      train_->scalar("memory/" + dev + "/bytes_in_use", static_cast<double>(st.bytes_in_use), epoch);
      train_->scalar("memory/" + dev + "/peak_bytes_in_use", static_cast<double>(st.peak_bytes_in_use), epoch);
      train_->scalar("memory/" + dev + "/bytes_reserved", static_cast<double>(st.bytes_reserved), epoch);
    }
    train_->flush();
    val_->flush();
  }
  void on_train_end(Logs&) override {
    train_.reset();
    val_.reset();
  }

 private:
  std::string dir_;
  int64_t freq_;
  int64_t step_ = 0;
  std::unique_ptr<SummaryWriter> train_, val_;
};

// ---- Progress bar ----------------------------------------------------------------------

std::string fmt_logs(const Logs& logs) {
  std::ostringstream os;
  char buf[64];
  for (auto& [k, v] : logs) {
    if (k == "samples_per_sec" || k == "epoch_time" || k == "learning_rate" || k == "input_wait" || k == "size") continue;
    std::snprintf(buf, sizeof buf, "%.4f", v);
    os << " - " << k << ": " << buf;
  }
  return os.str();
}

class Progbar : public Callback {
 public:
  Progbar(int verbose, int64_t steps, int epochs)
      : verbose_(verbose), steps_(steps), epochs_(epochs), tty_(isatty(STDOUT_FILENO) != 0) {}
  void on_epoch_begin(int epoch, Logs&) override {
    if (verbose_ == 1 && tty_) std::cout << "Epoch " << epoch + 1 << "/" << epochs_ << "\n" << std::flush;
    t0_ = last_ = std::chrono::steady_clock::now();
    samples_ = 0;
  }
  void on_train_batch_end(int64_t batch, Logs& logs) override {
    ++samples_;
    if (verbose_ != 1 || !tty_) return;
    auto now = std::chrono::steady_clock::now();
    if ((steps_ <= 0 || batch + 1 < steps_) && std::chrono::duration<double>(now - last_).count() < 0.1) return;
    last_ = now;
    const int width = 30;
    int64_t done = batch + 1;
    if (steps_ <= 0) {  // a dataset of unknown length: count only
      double el = std::chrono::duration<double>(now - t0_).count();
      std::cout << "\r" << done << "/Unknown - " << static_cast<int>(el) << "s " << fmt_logs(logs) << "\033[K"
                << std::flush;
      return;
    }
    int filled = static_cast<int>(width * done / std::max<int64_t>(1, steps_));
    std::string bar(width, '.');
    for (int i = 0; i < filled; ++i) bar[i] = '=';
    if (filled < width) bar[filled] = '>';
    double el = std::chrono::duration<double>(now - t0_).count();
    double per_step = el / static_cast<double>(samples_);
    double eta = per_step * static_cast<double>(steps_ - done);
    char head[160];
    std::snprintf(head, sizeof head, "\r%*lld/%lld [%s] - %s %.0fms/step", int(std::to_string(steps_).size()),
                  static_cast<long long>(done), static_cast<long long>(steps_), bar.c_str(),
                  done < steps_ ? ("ETA: " + std::to_string(static_cast<int>(eta)) + "s").c_str()
                                : (std::to_string(static_cast<int>(el)) + "s").c_str(),
                  per_step * 1000);
    std::cout << head << fmt_logs(logs) << "\033[K" << std::flush;
  }
  void on_epoch_end(int epoch, Logs& logs) override {
    char sps[64];
    std::snprintf(sps, sizeof sps, " - %.0f samples/s - input wait %.1f%%",
                  logs.count("samples_per_sec") ? logs["samples_per_sec"] : 0.0,
                  100 * (logs.count("input_wait") ? logs["input_wait"] : 0.0));
    if (verbose_ == 1 && tty_) {
      std::cout << sps << "\n";
      // Validation figures arrive after the bar finished: print them on their own line.
      Logs val;
      for (auto& [k, v] : logs)
        if (k.rfind("val_", 0) == 0) val[k] = v;
      if (!val.empty()) std::cout << "   " << fmt_logs(val) << "\n";
      std::cout << std::flush;
      return;
    }
    char t[32];
    std::snprintf(t, sizeof t, "%.1fs", logs.count("epoch_time") ? logs["epoch_time"] : 0.0);
    std::cout << "Epoch " << epoch + 1 << "/" << epochs_ << " - " << t << fmt_logs(logs) << sps << "\n" << std::flush;
  }

 private:
  int verbose_;
  int64_t steps_;
  int epochs_;
  bool tty_;
  int64_t samples_ = 0;
  std::chrono::steady_clock::time_point t0_, last_;
};

}  // namespace

CallbackPtr make_progbar(int verbose, int64_t steps, int epochs) {
  return std::make_shared<Progbar>(verbose, steps, epochs);
}

namespace callbacks {
CallbackPtr EarlyStopping(std::string monitor, double min_delta, int patience, std::string mode,
                          bool restore_best_weights) {
  return std::make_shared<EarlyStoppingCb>(std::move(monitor), min_delta, patience, std::move(mode),
                                           restore_best_weights);
}
CallbackPtr ModelCheckpoint(std::string filepath, std::string monitor, bool save_best_only, std::string mode) {
  return std::make_shared<ModelCheckpointCb>(std::move(filepath), std::move(monitor), save_best_only, std::move(mode));
}
CallbackPtr LearningRateScheduler(std::function<double(int, double)> schedule) {
  if (!schedule) throw InvalidArgumentError("LearningRateScheduler: the schedule function is empty");
  return std::make_shared<LrSchedulerCb>(std::move(schedule));
}
CallbackPtr CSVLogger(std::string filename, char separator, bool append) {
  return std::make_shared<CsvLoggerCb>(std::move(filename), separator, append);
}
CallbackPtr BackupAndRestore(std::string backup_dir, int64_t save_freq, bool delete_checkpoint) {
  if (backup_dir.empty()) throw InvalidArgumentError("BackupAndRestore: backup_dir is empty");
  return std::make_shared<BackupAndRestoreCb>(std::move(backup_dir), save_freq, delete_checkpoint);
}
CallbackPtr TensorBoard(std::string log_dir, int64_t update_freq) {
  return std::make_shared<TensorBoardCb>(std::move(log_dir), update_freq);
}
}  // namespace callbacks

}  // namespace kiln::train
