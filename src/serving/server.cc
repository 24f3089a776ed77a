#include "kiln/serving/server.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <thread>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "config.h"
#include "grpc_server.h"
#include "http_server.h"
#include "llm_api.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/process_metrics.h"
#include "kiln/core/version.h"
#include "log.h"
#include "rest_api.h"
#include "service.h"
#include "warmup.h"
#include "core/work_pool.h"

namespace kiln::serving {

struct Server::Impl {
  ServerOptions opts;
  Metrics metrics;
  // Unbatched model calls run here, not on the REST I/O threads; stop() joins it after
  // the manager and before the HTTP server goes.
  std::unique_ptr<WorkPool> pool;
  std::unique_ptr<ModelManager> manager;
  std::unique_ptr<Service> service;
  std::unique_ptr<LlmService> llm;  // before http in destruction: its events write to streams
  LlmDefaults llm_defaults;  // the --llm_* flags

  // The language models to serve: --llm_model's, then the config's `llm` entries.
  std::vector<LlmModelSpec> llm_specs(const tensorflow::serving::ModelServerConfig& config) const {
    std::vector<LlmModelSpec> specs;
    for (const std::string& f : opts.llm_models) specs.push_back(parse_llm_model_flag(f, llm_defaults));
    for (LlmModelSpec& s : llm_models_from_config(config, llm_defaults)) specs.push_back(std::move(s));
    return specs;
  }
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<GrpcServer> grpc;
  MonitoringOptions monitoring;
  std::mutex reload_mu;
  bool stopped = false;
  // --model_config_file_poll_wait_seconds: a thread re-reads the file and applies a new
  // content (the content applied last, to tell).
  std::thread config_poller;
  std::mutex poll_mu;
  std::condition_variable poll_cv;
  bool poll_stop = false;
  std::string config_applied;

  void poll_config_file() {
    const auto every = std::chrono::milliseconds(static_cast<int64_t>(opts.model_config_file_poll_wait_seconds * 1000));
    std::unique_lock<std::mutex> lock(poll_mu);
    while (!poll_cv.wait_for(lock, every, [this] { return poll_stop; })) {
      std::string text;
      try {
        text = read_file(opts.model_config_file);
      } catch (const std::exception& e) {
        if (config_applied != "<unreadable>")
          log_event(LogLevel::kError, "config_poll_failed", {{"file", opts.model_config_file}, {"error", e.what()}});
        config_applied = "<unreadable>";
        continue;
      }
      if (text == config_applied) continue;
      config_applied = text;  // a broken content is reported once, not at every poll
      lock.unlock();
      try {
        (void)apply_config(read_model_server_config(opts.model_config_file));
      } catch (const std::exception& e) {
        log_event(LogLevel::kError, "config_reload_failed", {{"file", opts.model_config_file}, {"error", e.what()}});
      }
      lock.lock();
    }
  }

  std::vector<ModelConfig> initial_models() {
    if (!opts.model_config_file.empty()) return models_from_proto(read_model_server_config(opts.model_config_file));
    if (opts.model_base_path.empty()) {
      if (!opts.llm_models.empty()) return {};  // language models only
      throw InvalidArgumentError(
          "no model to serve: give --model_base_path (with --model_name), --model_config_file or --llm_model");
    }
    ModelConfig m;
    m.name = opts.model_name;
    m.base_path = opts.model_base_path;
    return {m};
  }

  Status apply_config(const tensorflow::serving::ModelServerConfig& config) {
    if (config.config_case() == tensorflow::serving::ModelServerConfig::CONFIG_NOT_SET) {
      // As TF Serving: an empty config is no request to unload everything.
      log_event(LogLevel::kWarning, "config_reload_empty", {{"action", "none"}});
      return {};
    }
    try {
      auto models = models_from_proto(config);
      std::vector<LlmModelSpec> llms = llm_specs(config);  // (InvalidArgumentError before anything changes)
      std::lock_guard<std::mutex> lock(reload_mu);
      if (llm) llm->apply(llms);  // new and changed language models load first; a failure changes nothing
      manager->set_config(std::move(models));
      manager->poll_now();
      log_event(LogLevel::kInfo, "config_reloaded", {{"models", std::to_string(manager->model_names().size())}});
      return {};
    } catch (...) {
      auto st = status_of_current_exception();
      log_event(LogLevel::kError, "config_reload_failed", {{"error", st.message}});
      return st;
    }
  }

  void process_metrics() {
    register_process_metrics(metrics);  // build, process, allocators, devices
    auto& in_flight = metrics.gauge("kiln_rest_requests_in_flight", "REST requests being answered", {});
    auto& queued = metrics.gauge("kiln_batch_queue_rows", "Rows waiting in the batching queues", {"model"});
    metrics.on_collect([this, &in_flight, &queued] {
      if (manager)
        for (auto& [model, rows] : manager->queued_rows()) queued.at({model}).set(double(rows));
      if (http) in_flight.at({}).set(double(http->in_flight()));
    });
  }
};

Server::Server(ServerOptions opts) : impl_(std::make_unique<Impl>()) { impl_->opts = std::move(opts); }

Server::~Server() { stop(); }

void Server::start() {
  auto& im = *impl_;
  set_log_enabled(!im.opts.quiet);
  if (!im.opts.monitoring_config_file.empty()) im.monitoring = read_monitoring_config(im.opts.monitoring_config_file);
  ManagerOptions mo;
  im.pool = std::make_unique<WorkPool>(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  mo.unbatched_runner = [pool = im.pool.get()](std::function<void()> job) { pool->submit(std::move(job)); };
  mo.poll_seconds = im.opts.file_system_poll_wait_seconds;
  mo.metrics = &im.metrics;
  if (const std::string& amp = im.opts.auto_mixed_precision; amp == "bf16")
    mo.load.passes.auto_mixed_precision = DType::kBF16;
  else if (amp == "f16")
    mo.load.passes.auto_mixed_precision = DType::kF16;
  else if (!amp.empty() && amp != "off")
    throw InvalidArgumentError("--auto_mixed_precision must be off, bf16 or f16, got '" + amp + "'");
  if (im.opts.enable_batching)
    mo.batching = im.opts.batching_parameters_file.empty() ? BatchingOptions{}
                                                           : read_batching_parameters(im.opts.batching_parameters_file);
  else if (!im.opts.batching_parameters_file.empty())
    throw InvalidArgumentError("--batching_parameters_file needs --enable_batching");
  if (im.opts.enable_warmup)
    mo.warmup = [](const Servable& s) {
      int n = run_warmup(s);
      if (n)
        log_event(LogLevel::kInfo, "warmup_done",
                  {{"model", s.model_name()}, {"version", std::to_string(s.version())}, {"requests", std::to_string(n)}});
    };
  im.manager = std::make_unique<ModelManager>(std::move(mo));
  im.manager->set_config(im.initial_models());
  im.service = std::make_unique<Service>(*im.manager, im.metrics);
  {
    llm_kv_cache_bytes(im.opts.llm_kv_cache_memory);  // its form, at start (each model's size is of its device's memory)
    im.llm_defaults.kv_cache_memory = im.opts.llm_kv_cache_memory;
    im.llm_defaults.device = im.opts.llm_device;
    im.llm_defaults.dtype = im.opts.llm_dtype;
    llm::EngineOptions& eo = im.llm_defaults.engine;
    eo.context_length = im.opts.llm_context_size;
    eo.max_running = im.opts.llm_max_running;
    eo.step_tokens = im.opts.llm_step_tokens;
    eo.max_waiting = im.opts.llm_max_waiting;
    eo.prefix_caching = im.opts.llm_prefix_caching;
    // With a model config file the service exists even without language models, so that
    // a reloaded file may add some (its routes answer only while it has models).
    std::vector<LlmModelSpec> specs = im.llm_specs(im.opts.model_config_file.empty()
                                                       ? tensorflow::serving::ModelServerConfig()
                                                       : read_model_server_config(im.opts.model_config_file));
    if (!specs.empty() || !im.opts.model_config_file.empty()) im.llm = std::make_unique<LlmService>(specs, im.metrics);
  }
  im.process_metrics();
  // First versions load before the ports open: a started server is ready unless a
  // model failed (its status says why; /readyz answers 503 until it has a version).
  // poll_now ends by releasing this thread's pool workers, the language models' loading
  // included (kiln/core/parallel.h: release_idle_workers).
  im.manager->poll_now();
  if (im.opts.rest_api_port >= 0) {
    HttpOptions ho;
    ho.host = im.opts.host;
    ho.port = im.opts.rest_api_port;
    ho.threads = im.opts.rest_api_num_threads;
    ho.max_body_bytes = im.opts.max_body_bytes;
    ho.header_timeout = ho.body_timeout = std::chrono::milliseconds(im.opts.rest_api_timeout_in_ms);
    RestOptions ro;
    ro.metrics_enabled = im.monitoring.enabled;
    ro.metrics_path = im.monitoring.path;
    HttpHandler rest = make_rest_handler(*im.service, ro);
    if (im.llm) {
      // OpenAI's routes first; the rest is TensorFlow Serving's. With language models
      // only, the server is ready once they loaded (they load before the port opens).
      // /healthz and /readyz list the language models ("llm_models") beside the status.
      // A service without models (a config file that may add some) answers nothing.
      const bool llm_only = im.manager->model_names().empty();
      rest = [rest, llm = im.llm.get(), llm_only](HttpRequest&& req, Responder respond) {
        if (llm->empty()) return rest(std::move(req), std::move(respond));
        const std::string_view path = std::string_view(req.target).substr(0, req.target.find('?'));
        auto with_llms = [llm](const char* status) {
          return HttpResponse(200, "application/json",
                              std::string("{\"status\": \"") + status + "\", \"llm_models\": " + llm->status_json() + "}");
        };
        if (path == "/healthz") return respond(with_llms("alive"));
        if (path == "/readyz") {
          if (llm_only) return respond(with_llms("ready"));
          // Ready when the TensorFlow models are (their 503 names those without a version).
          return rest(std::move(req), [respond = std::move(respond), with_llms](HttpResponse r) {
            respond(r.status == 200 ? with_llms("ready") : std::move(r));
          });
        }
        if (llm->handle(req, respond)) return;
        rest(std::move(req), std::move(respond));
      };
    }
    im.http = std::make_unique<HttpServer>(ho, std::move(rest));
    im.http->start();
  }
  if (im.opts.port >= 0) {
    GrpcOptions go;
    go.host = im.opts.host;
    go.port = im.opts.port;
    go.max_threads = im.opts.grpc_max_threads;
    go.max_message_bytes = im.opts.max_body_bytes;
    im.grpc = std::make_unique<GrpcServer>(*im.service, go, [&im](const tensorflow::serving::ModelServerConfig& c) {
      return im.apply_config(c);
    });
    im.grpc->start();
  }
  im.manager->start();
  if (!im.opts.model_config_file.empty() && im.opts.model_config_file_poll_wait_seconds > 0) {
    im.config_applied = read_file(im.opts.model_config_file);
    im.config_poller = std::thread([&im] { im.poll_config_file(); });
  }
  log_event(LogLevel::kInfo, "server_started",
            {{"version", KILN_VERSION_STRING},
             {"grpc", im.grpc ? im.opts.host + ":" + std::to_string(im.grpc->port()) : "off"},
             {"rest", im.http ? im.opts.host + ":" + std::to_string(im.http->port()) : "off"},
             {"batching", im.opts.enable_batching ? "on" : "off"},
             {"llm_models", std::to_string(im.llm ? im.llm->names().size() : 0)},
             {"ready", im.manager->ready() || (im.llm && !im.llm->empty() && im.manager->model_names().empty()) ? "true" : "false"}});
}

int Server::grpc_port() const { return impl_->grpc ? impl_->grpc->port() : -1; }
int Server::rest_port() const { return impl_->http ? impl_->http->port() : -1; }

void Server::reload_config_file() {
  auto& im = *impl_;
  if (im.opts.model_config_file.empty())
    throw FailedPreconditionError("no --model_config_file to reload (the server was started with --model_base_path)");
  auto st = im.apply_config(read_model_server_config(im.opts.model_config_file));
  throw_if_error(st);
}

void Server::stop() {
  auto& im = *impl_;
  if (im.stopped || !im.manager) return;
  im.stopped = true;
  if (im.config_poller.joinable()) {
    {
      std::lock_guard<std::mutex> lock(im.poll_mu);
      im.poll_stop = true;
    }
    im.poll_cv.notify_all();
    im.config_poller.join();
  }
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(im.opts.shutdown_grace_seconds * 1000));
  log_event(LogLevel::kInfo, "server_stopping", {{"in_flight", std::to_string(im.http ? im.http->in_flight() : 0)}});
  if (im.grpc) im.grpc->shutdown(grace);
  if (im.http) im.http->stop(grace);
  im.llm.reset();      // engines stop: generations still running end as cancelled
  im.manager.reset();  // unloads; batches still queued fail UNAVAILABLE
  // Jobs hold their connections (through the responder): they must finish and let go
  // while the HTTP server's io_context still exists.
  im.pool.reset();
  im.http.reset();
  im.grpc.reset();
  log_event(LogLevel::kInfo, "server_stopped");
}

void Server::run_until_signalled() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig == SIGHUP) {
      try {
        reload_config_file();
      } catch (const std::exception& e) {
        log_event(LogLevel::kError, "sighup_reload_failed", {{"error", e.what()}});
      }
      continue;
    }
    log_event(LogLevel::kInfo, "signal", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
    stop();
    return;
  }
}

int serve_main(int argc, char** argv) {
  ServerOptions o;
  CLI::App app{"kiln model server: TensorFlow Serving's REST and gRPC APIs for kiln model packages and TensorFlow SavedModels"};
  app.set_version_flag("--version", KILN_VERSION_STRING);
  app.add_option("--model_name", o.model_name, "Name of the model (with --model_base_path)")->capture_default_str();
  app.add_option("--model_base_path", o.model_base_path, "Directory with numeric version subdirectories");
  app.add_option("--model_config_file", o.model_config_file,
                 "ModelServerConfig text proto (model_config_list: several models, version policy, version_labels, "
                 "kiln's traffic_split); re-read on SIGHUP and by HandleReloadConfigRequest");
  app.add_option("--host", o.host, "Address both APIs bind (127.0.0.1: this machine only; 0.0.0.0: every interface)")
      ->capture_default_str();
  app.add_option("--port", o.port, "gRPC port (0: any free port, -1: no gRPC)")->capture_default_str();
  app.add_option("--rest_api_port", o.rest_api_port, "REST port (0: any free port, -1: no REST)")->capture_default_str();
  app.add_option("--rest_api_num_threads", o.rest_api_num_threads, "REST I/O threads (0: one per core)")
      ->capture_default_str();
  app.add_option("--rest_api_timeout_in_ms", o.rest_api_timeout_in_ms,
                 "Time a REST client has to send a request's header, and then its body")->capture_default_str();
  app.add_option("--max_body_bytes", o.max_body_bytes, "Largest REST body / gRPC message accepted (413 / RESOURCE_EXHAUSTED)")
      ->capture_default_str();
  app.add_option("--grpc_max_threads", o.grpc_max_threads, "gRPC handler threads (0: gRPC's default)")
      ->capture_default_str();
  app.add_flag("--enable_batching", o.enable_batching, "Batch requests together (per model version and signature)");
  app.add_option("--batching_parameters_file", o.batching_parameters_file,
                 "BatchingParameters text proto: max_batch_size, batch_timeout_micros, max_enqueued_batches, "
                 "num_batch_threads, allowed_batch_sizes, pad_variable_length_inputs");
  app.add_option("--file_system_poll_wait_seconds", o.file_system_poll_wait_seconds,
                 "Seconds between scans of the base paths for new versions (<= 0: scan at start only)")
      ->capture_default_str();
  app.add_option("--model_config_file_poll_wait_seconds", o.model_config_file_poll_wait_seconds,
                 "Seconds between re-reads of --model_config_file; a changed file is applied as on SIGHUP "
                 "(<= 0: read at start only)")
      ->capture_default_str();
  app.add_option("--monitoring_config_file", o.monitoring_config_file,
                 "MonitoringConfig text proto: prometheus_config { enable: true path: \"/metrics/path\" }");
  app.add_option("--enable_model_warmup", o.enable_warmup,
                 "Replay assets.extra/tf_serving_warmup_requests before a version serves")->capture_default_str();
  app.add_option("--shutdown_grace_seconds", o.shutdown_grace_seconds,
                 "On SIGTERM, how long requests in flight may take to finish")->capture_default_str();
  app.add_flag("--quiet", o.quiet, "No log lines");
  app.add_option("--auto_mixed_precision", o.auto_mixed_precision,
                 "off (default: each package computes as stored), bf16 or f16: matmuls, convolutions and the ops "
                 "between them run in 16 bits (graph pass at load)");
  app.add_option("--llm_model", o.llm_models,
                 "A language model to serve with OpenAI's API on the REST port: NAME=PATH to a GGUF file (repeatable)");
  app.add_option("--llm_context_size", o.llm_context_size, "Positions per sequence (0: the model's training context)")
      ->capture_default_str();
  app.add_option("--llm_kv_cache_memory", o.llm_kv_cache_memory,
                 "KV cache pool per language model, from its device's allocator: bytes (512MiB, 2G; binary units) "
                 "or a fraction of the device's memory (0.25, 25%: of its --memory-limit when given, else all of it)")
      ->capture_default_str();
  app.add_option("--llm_device", o.llm_device,
                 "Run the language models on this device with kiln's ops, e.g. cuda:0 (default: the CPU's kernels on "
                 "the quantised weights)");
  app.add_option("--llm_dtype", o.llm_dtype, "Weights of language models on --llm_device: bf16, f16 or f32")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--llm_max_running", o.llm_max_running, "Sequences batched together in one step")->capture_default_str();
  app.add_option("--llm_step_tokens", o.llm_step_tokens,
                 "Tokens per step: decoding tokens plus chunks of prompts being read (chunked prefill)")->capture_default_str();
  app.add_option("--llm_max_waiting", o.llm_max_waiting, "Queued requests beyond which the answer is 429")->capture_default_str();
  app.add_option("--llm_prefix_caching", o.llm_prefix_caching, "Share the KV cache of identical prompt prefixes")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Signals are taken by run_until_signalled() (sigwait): block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  try {
    Server server(o);
    server.start();
    server.run_until_signalled();
  } catch (const std::exception& e) {
    auto st = status_of(e);
    std::cerr << "kiln serve: " << code_name(st.code) << ": " << st.message << "\n";
    return 1;
  }
  return 0;
}

}  // namespace kiln::serving
