#pragma once
// The kiln model server: TensorFlow Serving's flags, REST + gRPC front ends, the model
// manager and batching, wired together, and language models behind OpenAI's API on the
// same REST port (docs/serving-api.md).
//
//   kiln serve --model_name=mnist --model_base_path=/models/mnist --rest_api_port=8501
//
// Thread-safety: start(), reload_config_file() and stop() are called from one thread
// (the owner); everything else the server does runs on its own threads.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::serving {

struct ServerOptions {
  // One model (--model_name/--model_base_path) or a config file in TF Serving's
  // model_config_list text format (several models, version policy, labels, kiln's
  // traffic_split).
  std::string model_name = "default";
  std::string model_base_path;
  std::string model_config_file;
  std::string host = "127.0.0.1";  // both front ends bind here
  int port = 8500;                 // gRPC; 0: any free port; -1: no gRPC
  int rest_api_port = 8501;        // REST; 0: any free port; -1: no REST
  int rest_api_num_threads = 0;    // 0: the number of cores
  int64_t rest_api_timeout_in_ms = 30000;  // header/body read timeout of a connection
  int64_t max_body_bytes = 64 << 20;
  int grpc_max_threads = 0;
  bool enable_batching = false;
  std::string batching_parameters_file;  // TF Serving's BatchingParameters text proto
  double file_system_poll_wait_seconds = 1;
  // Re-read --model_config_file this often and apply it when its content changed (as
  // SIGHUP does; a Kubernetes ConfigMap update needs no signal). <= 0: read at start only.
  double model_config_file_poll_wait_seconds = 0;
  std::string monitoring_config_file;    // TF Serving's MonitoringConfig text proto
  bool enable_warmup = true;             // assets.extra/tf_serving_warmup_requests
  double shutdown_grace_seconds = 10;
  bool quiet = false;                    // no structured log lines (tests, benchmarks)
  // Automatic mixed precision at load: "" or "off" (default: the packages' own numerics),
  // "bf16" or "f16" (graph::PassOptions::auto_mixed_precision). Only this option changes
  // what a package computes in; the environment never does.
  std::string auto_mixed_precision;
  // Language models (GGUF), served with OpenAI's API on the REST port: "NAME=PATH" each.
  std::vector<std::string> llm_models;
  int64_t llm_context_size = 0;             // positions per sequence; 0: the model's
  std::string llm_kv_cache_memory = "512MiB";  // KV cache pool per model: bytes or a fraction of its device's memory
  std::string llm_device;                   // "": the CPU kernels; "cuda:0": kiln's ops on that device
  std::string llm_dtype = "bf16";           // weights on llm_device
  int llm_max_running = 16;                 // sequences batched per step
  int64_t llm_step_tokens = 128;            // tokens per step (decode + prefill chunks)
  int64_t llm_max_waiting = 256;            // queued requests beyond which the answer is 429
  bool llm_prefix_caching = true;
};

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();
  // Reads the config files (InvalidArgumentError naming the file and line), loads the
  // first versions (so that a server that starts is ready at once when its models
  // load), binds the ports (UNAVAILABLE when taken) and starts polling.
  void start();
  int grpc_port() const;
  int rest_port() const;
  // Re-reads --model_config_file (SIGHUP); an invalid file changes nothing and throws.
  void reload_config_file();
  // Stops accepting, drains requests in flight (up to the grace period), unloads.
  void stop();
  // Blocks until SIGTERM or SIGINT (then stop()), reloading the config on SIGHUP.
  void run_until_signalled();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `kiln serve ...` / kiln_model_server: parses the flags (--help lists them), runs the
// server until SIGTERM; returns the exit code.
int serve_main(int argc, char** argv);

}  // namespace kiln::serving
