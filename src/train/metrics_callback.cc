// callbacks::PrometheusMetrics: training progress as Prometheus series.
#include <chrono>

#include "kiln/core/metrics.h"
#include "kiln/train/callbacks.h"

namespace kiln::train::callbacks {
namespace {

using Clock = std::chrono::steady_clock;

// Step times: 1 ms .. 60 s.
const std::vector<double>& step_buckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return b;
}

class PrometheusCallback : public Callback {
 public:
  explicit PrometheusCallback(Metrics& m)
      : running_(m.gauge("kiln_train_running", "1 while a fit runs", {}).at({})),
        epoch_(m.gauge("kiln_train_epoch", "The epoch being trained (1-based)", {}).at({})),
        steps_(m.counter("kiln_train_steps_total", "Training steps run", {}).at({})),
        samples_(m.counter("kiln_train_samples_total", "Samples trained on", {}).at({})),
        step_seconds_(m.histogram("kiln_train_step_seconds", "Compute time of one training step", {}, step_buckets())
                          .at({})),
        wait_(m.counter("kiln_train_input_wait_seconds_total",
                        "Time between training steps: waiting for the input pipeline", {})
                  .at({})),
        loss_(m.gauge("kiln_train_loss", "Running mean of the loss over the current epoch", {}).at({})),
        epoch_metric_(m.gauge("kiln_train_epoch_metric", "The last finished epoch's logs (accuracy, val_loss, ...)",
                              {"name"})) {}

  void on_train_begin(Logs&) override { running_.set(1); }
  void on_train_end(Logs&) override { running_.set(0); }
  void on_epoch_begin(int epoch, Logs&) override {
    epoch_.set(epoch + 1);
    last_end_ = Clock::now();
  }
  void on_train_batch_begin(int64_t, Logs&) override {
    begin_ = Clock::now();
    wait_.inc(std::chrono::duration<double>(begin_ - last_end_).count());
  }
  void on_train_batch_end(int64_t, Logs& logs) override {
    last_end_ = Clock::now();
    step_seconds_.observe(std::chrono::duration<double>(last_end_ - begin_).count());
    steps_.inc();
    if (auto it = logs.find("size"); it != logs.end()) samples_.inc(it->second);
    if (auto it = logs.find("loss"); it != logs.end()) loss_.set(it->second);
  }
  void on_epoch_end(int, Logs& logs) override {
    for (const auto& [k, v] : logs) epoch_metric_.at({k}).set(v);
  }

 private:
  Gauge& running_;
  Gauge& epoch_;
  Counter& steps_;
  Counter& samples_;
  Histogram& step_seconds_;
  Counter& wait_;
  Gauge& loss_;
  Family<Gauge>& epoch_metric_;
  Clock::time_point begin_{}, last_end_{};
};

}  // namespace

CallbackPtr PrometheusMetrics(Metrics& metrics) { return std::make_shared<PrometheusCallback>(metrics); }

}  // namespace kiln::train::callbacks
