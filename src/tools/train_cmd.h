#pragma once
// `kiln train`: trains the built-in Fashion-MNIST models.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "device_options.h"

namespace kiln::tools {

struct TrainArgs {
  std::string model = "mlp";
  int epochs = 5;
  int64_t batch_size = 128;
  double learning_rate = 1e-3;
  uint64_t seed = 42;
  std::string logdir;
  std::string checkpoint_dir;
  std::string metrics_json;
  std::string data_dir;
  std::string tfrecords;  // DIR with train-*.tfrecord / test-*.tfrecord: use the input pipeline
  int64_t max_samples = 0;
  int64_t backup_freq = 100;
  int verbose = -1;
  std::string export_dir;  // base directory: writes <export_dir>/<version>/
  std::string precision = "float32";  // dtype policy: float32, mixed_bfloat16, mixed_float16
  bool run_eagerly = false;            // no traced training step
  std::string device;                  // --device: where to train ("" = the CPU)
  DeviceArgs devices;                  // --memory-limit, --memory-growth, --logical-devices, --visible-devices
  int metrics_port = -1;               // --metrics-port: serve Prometheus metrics (0: any free port)
  std::string mlflow_tracking_uri;     // --mlflow-tracking-uri (default KILN_MLFLOW_TRACKING_URI): record the run
  std::string mlflow_experiment = "Default";
  std::string mlflow_run_name;
  std::string metrics_host = "127.0.0.1";
  std::string strategy;                // --strategy mirrored: data-parallel over --devices
  std::string strategy_devices;        // --devices cpu:0,cpu:1 (default: one CPU logical device per core)
  double worker_timeout = 60;          // --worker-timeout: seconds to wait for the other workers
  std::string collectives = "auto";    // --collectives auto|gloo|mpi (multi_worker)
  int64_t bytes_per_pack = -1;         // --bytes-per-pack: gradient bucket size (-1: the strategy's default)
  std::string overlap = "auto";        // --overlap auto|on|off: all-reduce buckets during the backward pass
};

// Adds the subcommand and its options (bound to `args`) to `app`.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args);
int run_train(const TrainArgs& args);

}  // namespace kiln::tools
