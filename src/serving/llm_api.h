#pragma once
// Language models in the model server: GGUF files served by kiln's LLM engine
// (kiln/llm/engine.h: continuous batching on a paged KV cache with prefix caching)
// behind OpenAI's API, on the REST port next to TensorFlow Serving's (docs/serving-api.md):
//   POST /v1/chat/completions, POST /v1/completions   (stream: Server-Sent Events)
//   GET  /v1/models
//   POST /tokenize, POST /detokenize                   (llama-server's shapes)
// Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}}: unknown
// model 404 (model_not_found), prompt + max_tokens over the context 400
// (context_length_exceeded), malformed JSON or a bad field 400 naming it, a full queue
// 429 with Retry-After, a request deadline (X-Request-Timeout-Ms) 504.
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http_server.h"
#include "kiln/llm/engine.h"
#include "kiln/core/metrics.h"
#include "tensorflow_serving/config/model_server_config.pb.h"

namespace kiln::serving {

struct LlmModelSpec {
  std::string name;
  std::string path;  // a GGUF file
  // Where it runs: unset, the CPU kernels; else kiln's ops on this device (the tensor
  // path) with weights of `dtype`.
  std::optional<Device> device;
  DType dtype = DType::kBF16;
  llm::EngineOptions engine;
  // Sampling defaults for requests that leave the field out (the model config file's).
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<int64_t> max_tokens;
};

// The flags' defaults for every language model: engine options, --llm_device, --llm_dtype.
struct LlmDefaults {
  llm::EngineOptions engine;
  std::string kv_cache_memory = "512MiB";  // resolved per model, against its device's memory
  std::string device, dtype = "bf16";      // "": the CPU kernels
};

// "NAME=PATH" (--llm_model) with the flags' options; InvalidArgumentError otherwise.
LlmModelSpec parse_llm_model_flag(const std::string& flag, const LlmDefaults& defaults);
// The `llm` entries of a model config file (kiln's extension of ModelConfigList); unset
// fields take the flags'. InvalidArgumentError naming the entry.
std::vector<LlmModelSpec> llm_models_from_config(const tensorflow::serving::ModelServerConfig& config,
                                                 const LlmDefaults& defaults);
// --llm_kv_cache_memory (or an entry's kv_cache_memory, named by `what`): bytes in binary
// units as --memory-limit takes them ("268435456", "256MiB", "2G") or a fraction of the
// memory of the device the model runs on ("0.25", "25%": of its memory limit when one is
// set, else of the device's); the pool is taken from that device's allocator.
// InvalidArgumentError otherwise.
int64_t llm_kv_cache_bytes(const std::string& text, std::string_view what = "--llm_kv_cache_memory",
                           Device device = Device::cpu());

class LlmService {
 public:
  // Loads every model and starts its engine; errors name the model and file.
  LlmService(const std::vector<LlmModelSpec>& models, Metrics& metrics);
  ~LlmService();  // stops the engines: requests still running finish as cancelled

  // Serves these models from now on (a reloaded model config file): a model whose spec
  // (path, engine options, sampling defaults) is unchanged keeps its engine, its cache
  // and its requests; a new or changed one is loaded first (a failure throws, naming it,
  // and changes nothing); a removed or replaced one takes no new request and is stopped
  // once the requests running on it have finished (a thread of the service's looks every
  // 0.2 s).
  void apply(const std::vector<LlmModelSpec>& models);
  bool empty() const;  // (asked on every REST request: no copy of the list)
  // Answers the request when its path is one of the LLM routes; false otherwise.
  bool handle(HttpRequest& req, Responder& respond);
  std::vector<std::string> names() const;
  // A JSON array with each model's name, state (AVAILABLE: a language model is loaded
  // before the server opens its ports), running and waiting requests and KV cache
  // blocks used / total: what /healthz and /readyz add as "llm_models".
  std::string status_json() const;

  struct Entry;

 private:
  struct Shared;
  std::shared_ptr<Entry> load(const LlmModelSpec& spec) const;
  std::vector<std::shared_ptr<Entry>> models() const;
  void reap();  // stops the retired models nothing uses any more
  std::shared_ptr<Shared> shared_;
  std::thread reaper_;
};

}  // namespace kiln::serving
