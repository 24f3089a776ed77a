#include "train_cmd.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "kiln/core/file_io.h"
#include "kiln/core/flags.h"
#include "kiln/core/version.h"
#include "kiln/package/package.h"
#include "kiln/core/metrics.h"
#include "kiln/core/metrics_endpoint.h"
#include "kiln/core/process_metrics.h"
#include "kiln/core/parallel.h"
#include "kiln/core/random.h"
#include "kiln/core/device_config.h"
#include "kiln/data/idx.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/strategy.h"
#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "kiln/train/export.h"
#include "kiln/train/mlflow.h"
#include "kiln/train/model.h"
#include "train_records.h"

namespace kiln::tools {

using namespace kiln::train;

CLI::App* add_train_command(CLI::App& app, TrainArgs& a) {
  auto* c = app.add_subcommand("train", "Train a built-in model on Fashion-MNIST");
  c->add_option("--model", a.model, "mlp (784-256-128-10, ReLU) or cnn (conv32-pool-conv64-pool-dense128-dense10)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  c->add_option("--epochs", a.epochs, "Number of epochs")->check(CLI::Range(1, 100000));
  c->add_option("--batch-size", a.batch_size, "Batch size")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--learning-rate", a.learning_rate, "Adam learning rate")->check(CLI::PositiveNumber);
  c->add_option("--seed", a.seed, "Seed for weights and shuffling (same seed, same run)");
  c->add_option("--logdir", a.logdir, "Write TensorBoard event files here");
  c->add_option("--checkpoint-dir", a.checkpoint_dir,
                "Keep per-epoch checkpoints and crash-recovery backups here; rerunning the same command resumes");
  c->add_option("--metrics-json", a.metrics_json, "Write final train/test loss, accuracy and mean epoch time here");
  c->add_option("--data-dir", a.data_dir, "Fashion-MNIST IDX directory (default: Debian's dataset-fashion-mnist)");
  c->add_option("--tfrecords", a.tfrecords,
                 "Train on DIR/train-*.tfrecord, test on DIR/test-*.tfrecord (from `kiln records fashion-mnist`) "
                 "through the parallel input pipeline instead of the IDX files");
  c->add_option("--max-samples", a.max_samples, "Use only the first N training and test samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--backup-freq", a.backup_freq, "Batches between crash-recovery backups (with --checkpoint-dir)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--precision", a.precision,
                "Dtype policy: float32, mixed_bfloat16 or mixed_float16 (f16 adds dynamic loss scaling)")
      ->check(CLI::IsMember({"float32", "mixed_bfloat16", "mixed_float16"}));
  c->add_flag("--run-eagerly", a.run_eagerly,
              "Run every training step eagerly instead of the traced, optimised graph (debugging, comparisons)");
  c->add_option("--device", a.device,
                "Train on this device: cpu (default) or cuda[:N] (weights, batches and the traced step there)");
  c->add_option("--export", a.export_dir,
                "Export the trained model as a model package version under this directory (DIR/<version>/)");
  c->add_option("--metrics-port,--metrics_port", a.metrics_port,
                 "Serve the run's Prometheus metrics on this port while it trains (GET /metrics; 0: any free port)")
      ->check(CLI::Range(0, 65535));
  c->add_option("--metrics-host,--metrics_host", a.metrics_host, "Address of --metrics-port (default 127.0.0.1)");
  c->add_option("--mlflow-tracking-uri,--mlflow_tracking_uri", a.mlflow_tracking_uri,
                "Record the run (params, per-epoch metrics, tags, the exported package) in this MLflow file store "
                "(file:DIR; default: KILN_MLFLOW_TRACKING_URI)");
  c->add_option("--mlflow-experiment,--mlflow_experiment", a.mlflow_experiment, "MLflow experiment (default: Default)");
  c->add_option("--mlflow-run-name,--mlflow_run_name", a.mlflow_run_name, "MLflow run name (default: the model)");
  c->add_option("--verbose", a.verbose, "0 silent, 1 progress bar, 2 one line per epoch (default: 1 on a TTY, else 2)")
      ->check(CLI::Range(-1, 2));
  c->add_option("--strategy", a.strategy,
                "Data-parallel training: mirrored (one process, one replica per device of --devices) or multi_worker "
                "(several processes: mpirun, or TF_CONFIG / KILN_WORKERS + KILN_RANK; --devices per process); the "
                "global batch --batch-size is split across every replica")
      ->check(CLI::IsMember({"mirrored", "multi_worker"}));
  c->add_option("--worker-timeout,--worker_timeout", a.worker_timeout,
                "multi_worker: seconds to wait for the other workers (rendezvous, each collective) before failing")
      ->check(CLI::PositiveNumber);
  c->add_option("--collectives", a.collectives,
                "multi_worker: the collectives between the workers: gloo (TCP, failures end within --worker-timeout), "
                "mpi (under mpirun: shared memory on one host; a lost worker ends the whole job), auto "
                "(default: mpi under mpirun, else gloo)")
      ->check(CLI::IsMember({"auto", "gloo", "mpi"}));
  c->add_option("--bytes-per-pack,--bytes_per_pack", a.bytes_per_pack,
                "--strategy: the gradients are all-reduced in buckets of at least this many bytes, the last layer's "
                "first (0: one all-reduce of every gradient; default 1 MiB)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--overlap", a.overlap,
                "--strategy: on: each bucket's all-reduce starts as soon as the backward pass made it, while the "
                "pass goes on; off: after the pass; auto (default): on over Gloo (TCP), off in one process and over "
                "MPI (shared memory), where the all-reduce needs the cores that compute")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  c->add_option("--devices", a.strategy_devices,
                "The replicas' devices for --strategy, e.g. cpu:0,cpu:1 (default: one logical CPU device per core; "
                "the CPU is split into as many logical devices as the list needs unless --logical-devices says "
                "otherwise)");
  add_device_options(c, a.devices);
  return c;
}

namespace {

ModelPtr build_model(const std::string& kind) {
  namespace L = layers;
  if (kind == "mlp")
    return std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(256, "relu"), L::Dense(128, "relu"), L::Dense(10)},
                                        Shape{784}, "mlp");
  layers::Conv2DOptions same;
  same.padding = "same";
  same.activation = "relu";
  return std::make_shared<Sequential>(
      std::vector<LayerPtr>{L::Conv2D(32, {3, 3}, same), L::MaxPool2D(), L::Conv2D(64, {3, 3}, same), L::MaxPool2D(),
                            L::Flatten(), L::Dense(128, "relu"), L::Dense(10)},
      Shape{28, 28, 1}, "cnn");
}

// u8 images [N, 28, 28] -> f32 in [0, 1], flattened for the MLP or NHWC for the CNN.
Tensor prepare_images(const Tensor& u8, const std::string& kind, int64_t limit) {
  int64_t n = limit > 0 ? std::min(limit, u8.dim(0)) : u8.dim(0);
  Tensor x = n == u8.dim(0) ? u8 : ops::slice(u8, {0, 0, 0}, {n, 28, 28});
  x = ops::cast(x, DType::kF32) * (1.0 / 255.0);
  return kind == "mlp" ? ops::reshape(x, {n, 784}) : ops::reshape(x, {n, 28, 28, 1});
}

Tensor prepare_labels(const Tensor& u8, int64_t limit) {
  int64_t n = limit > 0 ? std::min(limit, u8.dim(0)) : u8.dim(0);
  Tensor y = n == u8.dim(0) ? u8 : ops::slice(u8, {0}, {n});
  return ops::cast(y, DType::kI32);
}

// Saves "<dir>/ckpt-<epoch>.ckpt" after every epoch (keeps the newest 3).
class EpochCheckpoint : public Callback {
 public:
  explicit EpochCheckpoint(const std::string& dir) : mgr_(dir, 3, "ckpt") {}
  void on_epoch_end(int epoch, Logs&) override { mgr_.save(model()->state(), epoch + 1); }

 private:
  CheckpointManager mgr_;
};

}  // namespace

namespace {
// --strategy/--devices: the strategy, splitting the CPU into the logical devices it names
// when nothing split it yet (before the first tensor).
std::shared_ptr<distribute::Strategy> make_strategy(const TrainArgs& a) {
  if (a.strategy.empty()) {
    if (!a.strategy_devices.empty()) throw InvalidArgumentError("kiln train: --devices needs --strategy");
    if (a.bytes_per_pack >= 0 || a.overlap != "auto")
      throw InvalidArgumentError("kiln train: --bytes-per-pack and --overlap need --strategy");
    return nullptr;
  }
  if (!a.device.empty()) throw InvalidArgumentError("kiln train: --device and --strategy exclude each other (use --devices)");
  const bool multi = a.strategy == "multi_worker";
  std::string list = a.strategy_devices;
  if (list.empty() && multi) list = "cpu:0";  // one replica per process, on all its cores
  if (list.empty())
    for (int i = 0; i < num_threads(); ++i) list += (i ? ",cpu:" : "cpu:") + std::to_string(i);
  std::vector<Device> devices;
  int cpus = 0;
  for (size_t b = 0; b <= list.size();) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    if (e > b) {
      devices.push_back(parse_device(list.substr(b, e - b)));  // InvalidArgumentError
      if (devices.back().type == DeviceType::kCPU) cpus = std::max(cpus, devices.back().index + 1);
    }
    b = e + 1;
  }
  if (devices.empty()) throw InvalidArgumentError("kiln train: no devices in --devices '" + list + "'");
  if (cpus > 1 && config::get_logical_device_configuration(Device::cpu()).empty())
    config::set_logical_device_configuration(Device::cpu(),
                                             std::vector<config::LogicalDeviceConfig>(static_cast<size_t>(cpus)));
  distribute::CommunicationOptions comm;
  if (a.bytes_per_pack >= 0) comm.bytes_per_pack = a.bytes_per_pack;
  using Overlap = distribute::CommunicationOptions::Overlap;
  comm.overlap = a.overlap == "on" ? Overlap::kOn : a.overlap == "off" ? Overlap::kOff : Overlap::kAuto;
  if (!multi) {
    auto s = distribute::MirroredStrategy::create(devices);
    s->set_communication_options(comm);
    return s;
  }
  const distribute::ClusterSpec cluster = distribute::ClusterSpec::from_environment();
  if (cluster.source.empty())
    throw InvalidArgumentError("kiln train --strategy multi_worker: no workers in the environment (run it under "
                               "mpirun, or set TF_CONFIG, or KILN_WORKERS and KILN_RANK)");
  const distribute::Collectives collectives = a.collectives == "gloo" ? distribute::Collectives::kGloo
                                              : a.collectives == "mpi" ? distribute::Collectives::kMpi
                                                                       : distribute::Collectives::kAuto;
  std::fprintf(stderr, "kiln train: worker %d of %d (%s), joining the others...\n", cluster.rank, cluster.size,
               cluster.source.c_str());
  auto s = distribute::MultiWorkerMirroredStrategy::create(cluster, devices, a.worker_timeout, collectives);
  s->set_communication_options(comm);
  std::fprintf(stderr, "kiln train: worker %d of %d: collectives over %s\n", cluster.rank, cluster.size,
               s->collectives().c_str());
  return s;
}
}  // namespace

int run_train(const TrainArgs& a) {
  apply_device_options(a.devices);  // before the first tensor
  const std::shared_ptr<distribute::Strategy> strategy = make_strategy(a);
  set_seed(a.seed);
  // Either tensors from the IDX files or Datasets over TFRecord shards.
  Tensor x, y, tx, ty;
  std::optional<data::Dataset> train_ds, test_ds;
  if (a.tfrecords.empty()) {
    data::FashionMnist ds = data::load_fashion_mnist(a.data_dir);
    x = prepare_images(ds.train_images, a.model, a.max_samples);
    y = prepare_labels(ds.train_labels, a.max_samples);
    tx = prepare_images(ds.test_images, a.model, a.max_samples);
    ty = prepare_labels(ds.test_labels, a.max_samples);
  } else {
    RecordsPipeline p{a.tfrecords + "/train-*.tfrecord", a.model, a.batch_size, a.max_samples, true, a.seed};
    train_ds = fashion_mnist_records(p);
    p.pattern = a.tfrecords + "/test-*.tfrecord";
    p.shuffle = false;
    p.batch_size = 256;
    test_ds = fashion_mnist_records(p);
  }
  const int verbose = a.verbose >= 0 ? a.verbose : (isatty(STDOUT_FILENO) ? 1 : 2);

  set_global_policy(a.precision);
  ModelPtr model = build_model(a.model);
  if (verbose > 0) model->summary(std::cout);
  if (verbose > 0 && a.precision != "float32")
    std::cout << "Precision: " << a.precision << " (variables f32, output layer and loss f32)\n";
  CompileOptions co{optimizers::Adam({a.learning_rate}), {losses::SparseCategoricalCrossentropy(/*from_logits=*/true)},
                    {"accuracy"}};
  co.run_eagerly = a.run_eagerly;
  co.device = a.device;
  co.strategy = strategy;
  model->compile(co);
  if (verbose > 0 && strategy) {
    std::cout << "Strategy: " << strategy->name() << ", " << strategy->num_replicas_in_sync() << " replicas (";
    if (strategy->num_workers() > 1)
      std::cout << strategy->num_workers() << " workers, this one " << strategy->worker_rank() << ": ";
    for (size_t i = 0; i < strategy->devices().size(); ++i) std::cout << (i ? ", " : "") << strategy->devices()[i].str();
    std::cout << "), " << a.batch_size / strategy->num_replicas_in_sync() << "+ samples per replica and step\n";
  }

  FitOptions fo;
  fo.epochs = a.epochs;
  fo.batch_size = a.batch_size;
  fo.shuffle_seed = a.seed;
  fo.verbose = verbose;
  // Under a multi-worker strategy only the chief writes checkpoints, logs, exports and
  // lineage; every worker restores from the chief's backups (a directory they share).
  const bool chief = !strategy || strategy->is_chief();
  if (!a.checkpoint_dir.empty()) {
    std::filesystem::create_directories(a.checkpoint_dir);
    fo.callbacks.push_back(
        callbacks::BackupAndRestore((std::filesystem::path(a.checkpoint_dir) / "backup").string(), a.backup_freq));
    if (chief) fo.callbacks.push_back(std::make_shared<EpochCheckpoint>(a.checkpoint_dir));
  }
  if (!a.logdir.empty() && chief) fo.callbacks.push_back(callbacks::TensorBoard(a.logdir));
  // Prometheus metrics while it trains: progress, process, allocators, devices.
  Metrics metrics;
  std::unique_ptr<MetricsEndpoint> endpoint;
  if (a.metrics_port >= 0) {
    register_process_metrics(metrics);
    fo.callbacks.push_back(callbacks::PrometheusMetrics(metrics));
    endpoint = std::make_unique<MetricsEndpoint>(metrics, a.metrics_host, a.metrics_port);
    std::fprintf(stderr, "kiln train: metrics on http://%s:%d/metrics\n", a.metrics_host.c_str(), endpoint->port());
  }
  // Lineage: the run in MLflow's file store.
  std::shared_ptr<MlflowRun> run;
  const std::string mlflow_uri = !a.mlflow_tracking_uri.empty() ? a.mlflow_tracking_uri : flags().mlflow_tracking_uri;
  if (!mlflow_uri.empty() && chief) {
    run = MlflowRun::start({mlflow_uri, a.mlflow_experiment, a.mlflow_run_name.empty() ? a.model : a.mlflow_run_name});
    for (const auto& [k, v] : std::map<std::string, std::string>{
             {"model", a.model}, {"epochs", std::to_string(a.epochs)}, {"batch_size", std::to_string(a.batch_size)},
             {"learning_rate", std::to_string(a.learning_rate)}, {"optimizer", "adam"}, {"seed", std::to_string(a.seed)},
             {"precision", a.precision}, {"max_samples", std::to_string(a.max_samples)},
             {"device", a.device.empty() ? "cpu" : a.device},
             {"strategy", strategy ? strategy->name() : "none"},
             {"replicas", std::to_string(strategy ? strategy->num_replicas_in_sync() : 1)}})
      run->log_param(k, v);
    run->set_tag("kiln.version", KILN_VERSION_STRING);
    run->set_tag("kiln.command", "kiln train");
    // The data: the bytes of the training tensors (or the TFRecord directory's files).
    std::string fingerprint;
    if (!train_ds) {
      fingerprint = package::sha256_hex(x.raw_data(), x.nbytes()) + package::sha256_hex(y.raw_data(), y.nbytes());
      fingerprint = package::sha256_hex(fingerprint.data(), fingerprint.size());
    } else {
      std::string listing;
      for (const auto& e : std::filesystem::directory_iterator(a.tfrecords))
        if (e.is_regular_file()) listing += e.path().filename().string() + ":" + package::sha256_file(e.path().string()) + "\n";
      fingerprint = package::sha256_hex(listing.data(), listing.size());
    }
    run->set_tag("kiln.data_fingerprint", "sha256:" + fingerprint);
    run->set_tag("kiln.data", train_ds ? "Fashion-MNIST TFRecords " + a.tfrecords
                                       : "Fashion-MNIST, " + std::to_string(x.dim(0)) + " training images");
    // The source's commit, when the command runs inside a git checkout (as MLflow records it).
    if (FILE* g = ::popen("git rev-parse HEAD 2>/dev/null", "r")) {
      char buf[64] = {};
      const bool got = std::fgets(buf, sizeof buf, g) != nullptr;
      if (::pclose(g) == 0 && got) {
        std::string commit(buf);
        while (!commit.empty() && (commit.back() == '\n' || commit.back() == '\r')) commit.pop_back();
        if (commit.size() == 40) run->set_tag("mlflow.source.git.commit", commit);
      }
    }
    fo.callbacks.push_back(callbacks::MlflowLogger(run));
    std::fprintf(stderr, "kiln train: MLflow run %s in %s (experiment %s)\n", run->id().c_str(), mlflow_uri.c_str(),
                 run->experiment_id().c_str());
  }
  if (verbose > 0 && train_ds)
    std::cout << "Training " << a.model << " on " << a.tfrecords << "/train-*.tfrecord (" << num_threads()
              << " threads)\n" << train_ds->describe();
  else if (verbose > 0)
    std::cout << "Training " << a.model << " on " << x.dim(0) << " samples, testing on " << tx.dim(0) << " ("
              << num_threads() << " threads)\n";
  History h = train_ds ? model->fit(*train_ds, fo) : model->fit(x, y, fo);

  Logs test = test_ds ? model->evaluate(*test_ds) : model->evaluate(tx, ty, {256});
  std::printf("test loss: %.4f - test accuracy: %.4f\n", test["loss"], test["accuracy"]);
  if (run) {
    run->log_metric("test_loss", test["loss"], a.epochs);
    run->log_metric("test_accuracy", test["accuracy"], a.epochs);
  }
  if (!a.metrics_json.empty()) {
    nlohmann::json j;
    j["model"] = a.model;
    j["epochs"] = a.epochs;
    j["batch_size"] = a.batch_size;
    j["threads"] = num_threads();
    j["precision"] = a.precision;
    j["replicas"] = strategy ? strategy->num_replicas_in_sync() : 1;
    if (auto* lso = dynamic_cast<LossScaleOptimizer*>(model->optimizer().get())) {
      j["loss_scale"] = lso->loss_scale();
      j["skipped_steps"] = lso->skipped_steps();
    }
    if (!train_ds) j["train_samples"] = x.dim(0);
    if (h.history.count("input_wait")) j["input_wait"] = h.at("input_wait").back();
    auto last = [&](const char* k) { return h.history.count(k) && !h.at(k).empty() ? h.at(k).back() : 0.0; };
    j["train_loss"] = last("loss");
    j["train_accuracy"] = last("accuracy");
    j["test_loss"] = test["loss"];
    j["test_accuracy"] = test["accuracy"];
    double total = 0;
    const auto& times = h.history.count("epoch_time") ? h.at("epoch_time") : std::vector<double>{};
    for (double t : times) total += t;
    j["mean_epoch_seconds"] = times.empty() ? 0 : total / static_cast<double>(times.size());
    j["epochs_run"] = times.size();
    std::string s = j.dump(2) + "\n";
    write_file_atomic(a.metrics_json, s);
  }
  if (!a.export_dir.empty() && chief) {
    ModelExportOptions eo;
    eo.softmax_outputs = true;  // the built-in models output logits; serve probabilities
    eo.classify_signature = true;
    eo.metadata.description = "Fashion-MNIST " + a.model + " classifier (kiln train)";
    eo.metadata.training_data =
        train_ds ? "Fashion-MNIST TFRecords " + a.tfrecords : "Fashion-MNIST (" + std::to_string(x.dim(0)) + " training images)";
    eo.metadata.metrics["test_loss"] = test["loss"];
    eo.metadata.metrics["test_accuracy"] = test["accuracy"];
    eo.metadata.hyperparameters["seed"] = std::to_string(a.seed);
    eo.metadata.tags["model"] = a.model;
    if (run) {  // lineage both ways: the package names its run, the run holds the package
      eo.metadata.tags["mlflow_run_id"] = run->id();
      eo.metadata.tags["mlflow_tracking_uri"] = mlflow_uri;
    }
    const auto tmp = std::filesystem::temp_directory_path() / ("kiln-export-" + std::to_string(::getpid()));
    std::filesystem::create_directories(tmp);
    const auto labels = tmp / "labels.txt";
    write_file_atomic(labels.string(), "T-shirt/top\nTrouser\nPullover\nDress\nCoat\nSandal\nShirt\nSneaker\nBag\nAnkle boot\n");
    eo.assets = {labels.string()};
    std::string dir;
    try {
      dir = export_model(*model, a.export_dir, eo);
    } catch (...) {
      std::filesystem::remove_all(tmp);
      throw;
    }
    std::filesystem::remove_all(tmp);
    std::printf("exported: %s\n", dir.c_str());
    if (run) run->log_artifacts(dir, "model");
  }
  return 0;
}

}  // namespace kiln::tools
