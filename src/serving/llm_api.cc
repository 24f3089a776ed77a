#include "llm_api.h"

#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "kiln/core/device_config.h"
#include "kiln/core/error.h"
#include "kiln/core/json_string.h"
#include "kiln/core/version.h"
#include "kiln/llm/chat_template.h"
#include "kiln/llm/gguf.h"
#include "kiln/serving/status.h"
#include "kiln/llm/model.h"
#include "llm_request.h"
#include "llm_tools.h"
#include "log.h"

namespace kiln::serving {

using kiln::detail::str_cat;
using Clock = std::chrono::steady_clock;

namespace {

// Where a model runs: `device` "" is the CPU kernels; else kiln's ops on it, with weights
// of `dtype` (f32, f16, bf16). And its KV cache's bytes, against that device's memory.
void place(LlmModelSpec& s, const std::string& device, const std::string& dtype, const std::string& kv_cache_memory,
           std::string_view kv_what) {
  if (!device.empty()) s.device = parse_device(device);
  s.dtype = dtype_from_name(dtype);
  if (s.dtype != DType::kF32 && s.dtype != DType::kF16 && s.dtype != DType::kBF16)
    throw InvalidArgumentError("a language model's weights are f32, f16 or bf16, not " + dtype);
  s.engine.kv_cache_bytes = llm_kv_cache_bytes(kv_cache_memory, kv_what, s.device.value_or(Device::cpu()));
}

}  // namespace

LlmModelSpec parse_llm_model_flag(const std::string& flag, const LlmDefaults& defaults) {
  const size_t eq = flag.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == flag.size())
    throw InvalidArgumentError("--llm_model takes NAME=PATH (a GGUF file), got '" + flag + "'");
  LlmModelSpec s;
  s.name = flag.substr(0, eq);
  s.path = flag.substr(eq + 1);
  s.engine = defaults.engine;
  place(s, defaults.device, defaults.dtype, defaults.kv_cache_memory, "--llm_kv_cache_memory");
  return s;
}

int64_t llm_kv_cache_bytes(const std::string& text, std::string_view what, Device device) {
  const config::MemoryAmount m = config::parse_memory_amount(text, what);
  if (m.fraction == 0 && m.bytes <= 0) throw InvalidArgumentError(std::string(what) + ": the KV cache needs a positive size");
  if (m.fraction == 0) return m.resolve(0);
  backend_for(device);  // NotFoundError for a device this process does not have
  int64_t memory = config::memory_stats(device).bytes_limit;
  if (memory <= 0) memory = config::list_physical_devices(device.type).at(static_cast<size_t>(device.index)).properties.memory_bytes;
  return m.resolve(memory);
}

std::vector<LlmModelSpec> llm_models_from_config(const tensorflow::serving::ModelServerConfig& config,
                                                 const LlmDefaults& defaults) {
  std::vector<LlmModelSpec> out;
  for (const auto& c : config.model_config_list().llm()) {
    const std::string what = "model config: llm '" + c.name() + "': ";
    if (c.name().empty() || c.path().empty()) throw InvalidArgumentError(what + "name and path are required");
    if (c.context_size() < 0 || c.max_running() < 0 || c.step_tokens() < 0 || c.max_waiting() < 0)
      throw InvalidArgumentError(what + "context_size, max_running, step_tokens and max_waiting must be >= 0");
    LlmModelSpec s;
    s.name = c.name();
    s.path = c.path();
    s.engine = defaults.engine;
    if (c.context_size()) s.engine.context_length = c.context_size();
    try {
      place(s, c.device().empty() ? defaults.device : c.device(), c.dtype().empty() ? defaults.dtype : c.dtype(),
            c.kv_cache_memory().empty() ? defaults.kv_cache_memory : c.kv_cache_memory(),
            c.kv_cache_memory().empty() ? "--llm_kv_cache_memory" : "kv_cache_memory");
    } catch (const Error& e) {
      throw_error(e.code(), what + e.message());
    }
    if (c.max_running()) s.engine.max_running = c.max_running();
    if (c.step_tokens()) s.engine.step_tokens = c.step_tokens();
    if (c.max_waiting()) s.engine.max_waiting = c.max_waiting();
    if (c.has_prefix_caching()) s.engine.prefix_caching = c.prefix_caching();
    if (c.has_temperature()) s.temperature = c.temperature();
    if (c.has_top_p()) s.top_p = c.top_p();
    if (c.has_top_k()) s.top_k = c.top_k();
    if (c.has_min_p()) s.min_p = c.min_p();
    if (c.has_max_tokens()) {
      if (c.max_tokens() < 1) throw InvalidArgumentError(what + "max_tokens must be >= 1");
      s.max_tokens = c.max_tokens();
    }
    llm::SamplingParams check;
    check.temperature = s.temperature.value_or(check.temperature);
    check.top_p = s.top_p.value_or(check.top_p);
    check.top_k = s.top_k.value_or(check.top_k);
    check.min_p = s.min_p.value_or(check.min_p);
    try {
      check.validate(1);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(what + e.message());
    }
    out.push_back(std::move(s));
  }
  return out;
}

struct LlmService::Entry {
  LlmModelSpec spec;
  std::string name;
  std::shared_ptr<const llm::Model> model;
  std::unique_ptr<llm::ChatTemplate> tmpl;
  std::string bos, eos;
  int64_t created = 0;
  std::unique_ptr<llm::Engine> engine;
  Histogram *ttft = nullptr, *itl = nullptr, *e2e = nullptr, *batch = nullptr;
  Counter *prompt_tokens = nullptr, *generated_tokens = nullptr;
  Family<Counter>* requests = nullptr;
};

namespace {

void append_double(std::string& out, double v) {
  if (!std::isfinite(v)) v = v > 0 ? 3.4e38 : -3.4e38;  // JSON has no infinities
  char buf[32];
  const int n = std::snprintf(buf, sizeof buf, "%.7g", v);
  out.append(buf, static_cast<size_t>(n));
}

HttpResponse openai_error(int status, std::string_view message, std::string_view param = {}, std::string_view code = {}) {
  const char* type = status == 404 || status == 400 || status == 413 ? "invalid_request_error"
                     : status == 429                                  ? "rate_limit_exceeded"
                     : status == 504                                  ? "timeout"
                                                                      : "server_error";
  std::string body = "{\"error\": {\"message\": ";
  append_json_string(body, message);
  body += ", \"type\": \"";
  body += type;
  body += "\", \"param\": ";
  if (param.empty()) body += "null";
  else append_json_string(body, param);
  body += ", \"code\": ";
  if (code.empty()) body += "null";
  else append_json_string(body, code);
  body += "}}";
  HttpResponse r(status, "application/json", std::move(body));
  if (status == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

HttpResponse error_from_exception() {
  try {
    throw;
  } catch (const RequestFieldError& e) {
    return openai_error(400, e.message(), e.param());
  } catch (...) {
    const Status st = status_of_current_exception();
    return openai_error(http_status(st.code), st.message);
  }
}

uint64_t random_seed() {
  thread_local std::mt19937_64 gen(std::random_device{}());
  return gen();
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, static_cast<unsigned long long>(random_seed()),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffffffu));
  return buf;
}

// A tool call's id: "call_" and 24 letters and digits, as OpenAI's.
std::string call_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  uint64_t r = random_seed();
  for (int i = 0; i < 24; ++i) {
    if (i == 12) r = random_seed();
    id += kAlphabet[r % 62];
    r /= 62;
  }
  return id;
}

int64_t unix_time() { return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// One API call: n engine requests (choices) answered together or streamed.
struct Call : std::enable_shared_from_this<Call> {
  std::shared_ptr<LlmService::Entry> entry;
  LlmRequest req;
  std::string id;
  int64_t created = 0;
  Clock::time_point start, last_token;
  bool any_token = false;
  std::shared_ptr<std::atomic<bool>> cancelled;
  std::shared_ptr<HttpStream> stream;
  Responder respond;
  struct Choice {
    std::string text;
    std::vector<llm::Sample> samples;
    std::string finish_reason;
    int64_t completion_tokens = 0;
    bool done = false;
    std::vector<ToolCall> calls;  // the tool calls answered (text is then empty), or streamed so far
    AnswerStreamer answer;        // streams under tools: the response's characters, the calls' pieces
  };
  std::vector<Choice> choices;
  int remaining = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  bool abandoned = false;  // a submit failed: the error was answered, events are ignored
  bool tools = false;      // tools shape the answer: read when whole; a text response streams as written
  bool response_is_json = false;
  std::mutex mu;

  const char* object() const { return req.chat ? "chat.completion" : "text_completion"; }

  std::string piece(llm::TokenId t) const { return entry->model->tokenizer().token_to_piece(t); }

  void append_bytes(std::string& out, const std::string& p) const {
    out += "[";
    for (size_t i = 0; i < p.size(); ++i) out += (i ? ", " : "") + std::to_string(static_cast<unsigned char>(p[i]));
    out += "]";
  }

  // Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
  // Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
  void append_logprobs(std::string& out, const std::vector<llm::Sample>& samples, size_t text_offset) const {
    if (req.chat) {
      out += "{\"content\": [";
      for (size_t i = 0; i < samples.size(); ++i) {
        const std::string p = piece(samples[i].token);
        out += i ? ", {\"token\": " : "{\"token\": ";
        append_json_string(out, p);
        out += ", \"logprob\": ";
        append_double(out, samples[i].logprob);
        out += ", \"bytes\": ";
        append_bytes(out, p);
        out += ", \"top_logprobs\": [";
        for (size_t k = 0; k < samples[i].top.size(); ++k) {
          const std::string tp = piece(samples[i].top[k].token);
          out += k ? ", {\"token\": " : "{\"token\": ";
          append_json_string(out, tp);
          out += ", \"logprob\": ";
          append_double(out, samples[i].top[k].logprob);
          out += ", \"bytes\": ";
          append_bytes(out, tp);
          out += "}";
        }
        out += "]}";
      }
      out += "]}";
      return;
    }
    std::string tokens, lps, tops, offsets;
    size_t off = text_offset;
    for (size_t i = 0; i < samples.size(); ++i) {
      const std::string p = piece(samples[i].token);
      const char* sep = i ? ", " : "";
      tokens += sep;
      append_json_string(tokens, p);
      lps += sep;
      append_double(lps, samples[i].logprob);
      tops += sep;
      tops += "{";
      for (size_t k = 0; k < samples[i].top.size(); ++k) {
        if (k) tops += ", ";
        append_json_string(tops, piece(samples[i].top[k].token));
        tops += ": ";
        append_double(tops, samples[i].top[k].logprob);
      }
      tops += "}";
      offsets += sep + std::to_string(off);
      off += p.size();
    }
    out += "{\"tokens\": [" + tokens + "], \"token_logprobs\": [" + lps + "], \"top_logprobs\": [" + tops +
           "], \"text_offset\": [" + offsets + "]}";
  }

  std::string head(const char* obj) const {
    std::string out = "{\"id\": \"" + id + "\", \"object\": \"" + obj + "\", \"created\": " + std::to_string(created) +
                      ", \"model\": ";
    append_json_string(out, entry->name);
    out += ", \"system_fingerprint\": \"kiln-" KILN_VERSION_STRING "\"";
    return out;
  }

  std::string usage() const {
    int64_t completion = 0;
    for (const Choice& c : choices) completion += c.completion_tokens;
    return "{\"prompt_tokens\": " + std::to_string(prompt_tokens) + ", \"completion_tokens\": " + std::to_string(completion) +
           ", \"total_tokens\": " + std::to_string(prompt_tokens + completion) +
           ", \"prompt_tokens_details\": {\"cached_tokens\": " + std::to_string(cached_tokens) + "}}";
  }

  // One call of "tool_calls": {"index" (streamed deltas), "id", "type", "function": {"name",
  // "arguments"}}; a streamed call's later deltas (no id) carry its index and more arguments.
  static void append_call(std::string& out, std::optional<size_t> index, const std::string& id, const std::string& name,
                          const std::string& arguments) {
    out += "{";
    if (index) out += "\"index\": " + std::to_string(*index) + ", ";
    if (!id.empty()) {
      out += "\"id\": \"" + id + "\", \"type\": \"function\", \"function\": {\"name\": ";
      append_json_string(out, name);
      out += ", ";
    } else {
      out += "\"function\": {";
    }
    out += "\"arguments\": ";
    append_json_string(out, arguments);
    out += "}}";
  }

  void append_tool_calls(std::string& out, const Choice& c, bool indexed) const {
    out += "\"tool_calls\": [";
    for (size_t k = 0; k < c.calls.size(); ++k) {
      if (k) out += ", ";
      append_call(out, indexed ? std::optional<size_t>(k) : std::nullopt, c.calls[k].id, c.calls[k].name, c.calls[k].arguments);
    }
    out += "]";
  }

  // Tools: the whole answer of choice i, as one delta (content or tool calls).
  void send_answer(size_t i) {
    const Choice& c = choices[i];
    std::string out = "data: " + head("chat.completion.chunk") + ", \"choices\": [{\"index\": " + std::to_string(i) + ", \"delta\": {";
    if (c.calls.empty()) {
      out += "\"content\": ";
      append_json_string(out, c.text);
    } else {
      append_tool_calls(out, c, true);
    }
    out += "}, \"logprobs\": ";
    if (req.logprobs) append_logprobs(out, c.samples, 0);
    else out += "null";
    out += ", \"finish_reason\": null}]}\n\n";
    if (!stream->write(std::move(out))) cancelled->store(true);
  }

  // Tools: the answer read as tool calls or content (a text cut short stays as it is).
  // Streamed calls keep the ids they were sent with.
  void read_answer(Choice& c) {
    ToolAnswer a = parse_tool_answer(c.text, response_is_json);
    if (!a.parsed) return;
    for (size_t k = 0; k < a.calls.size(); ++k) a.calls[k].id = k < c.calls.size() ? c.calls[k].id : call_id();
    c.text = std::move(a.content);
    c.calls = std::move(a.calls);
    if (!c.calls.empty() && c.finish_reason == "stop") c.finish_reason = "tool_calls";
  }

  // Tools, streamed: what the answer's new text gives. The response's characters as
  // content; a call as OpenAI streams one: its first delta names it (with its id), the
  // next ones add to its arguments.
  void stream_answer(size_t i, const std::string& text) {
    Choice& c = choices[i];
    AnswerStreamer::Delta d = c.answer.feed(text);
    if (!d.content.empty() && !response_is_json) send_chunk(i, d.content, nullptr, "", false);
    for (AnswerStreamer::CallPiece& p : d.calls) {
      if (p.begins) {
        if (c.calls.size() <= p.index) c.calls.resize(p.index + 1);
        c.calls[p.index].id = call_id();
      }
      std::string out = "data: " + head("chat.completion.chunk") + ", \"choices\": [{\"index\": " + std::to_string(i) +
                        ", \"delta\": {\"tool_calls\": [";
      append_call(out, p.index, p.begins ? c.calls[p.index].id : std::string(), p.name, p.arguments);
      out += "]}, \"logprobs\": null, \"finish_reason\": null}]}\n\n";
      if (!stream->write(std::move(out))) cancelled->store(true);
    }
  }

  // A streamed chunk of choice i.
  void send_chunk(size_t i, const std::string& text, const llm::Sample* sample, const std::string& finish, bool role) {
    std::string out = "data: " + head(req.chat ? "chat.completion.chunk" : "text_completion") + ", \"choices\": [{\"index\": " +
                      std::to_string(i) + ", ";
    if (req.chat) {
      out += "\"delta\": {";
      if (role) out += "\"role\": \"assistant\", \"content\": \"\"";
      else if (finish.empty()) {
        out += "\"content\": ";
        append_json_string(out, text);
      }
      out += "}, ";
    } else {
      out += "\"text\": ";
      append_json_string(out, text);
      out += ", ";
    }
    out += "\"logprobs\": ";
    if (sample && req.logprobs) append_logprobs(out, {*sample}, choices[i].text.size() - text.size());
    else out += "null";
    out += ", \"finish_reason\": ";
    out += finish.empty() ? "null" : "\"" + finish + "\"";
    out += "}]}\n\n";
    if (!stream->write(std::move(out))) cancelled->store(true);
  }

  void on_event(size_t i, const llm::CompletionEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (abandoned) return;
    Choice& c = choices[i];
    const auto now = Clock::now();
    if (e.sample) {
      if (!any_token) entry->ttft->observe(std::chrono::duration<double>(now - start).count());
      else entry->itl->observe(std::chrono::duration<double>(now - last_token).count());
      any_token = true;
      last_token = now;
      entry->generated_tokens->inc();
      if (req.logprobs) c.samples.push_back(*e.sample);
    }
    c.text += e.text;
    if (stream && !tools && (!e.text.empty() || (e.sample && req.logprobs)) && e.finish_reason != "cancelled")
      send_chunk(i, e.text, req.logprobs ? e.sample : nullptr, "", false);
    // Under tools, a text response and tool calls stream as they are written (a JSON
    // response and answers with log-probabilities come whole at the end).
    if (stream && tools && !req.logprobs && !e.text.empty() && e.finish_reason != "cancelled") stream_answer(i, e.text);
    if (!e.done) return;
    c.done = true;
    c.finish_reason = e.finish_reason;
    c.completion_tokens = e.completion_tokens;
    prompt_tokens = e.prompt_tokens;
    cached_tokens = std::max(cached_tokens, e.cached_tokens);
    const bool answered = e.finish_reason == "stop" || e.finish_reason == "length";
    if (tools && answered) read_answer(c);
    if (stream && answered) {
      const bool streamed = (c.answer.streams_response() && !response_is_json) || c.answer.streams_calls();
      if (tools && !streamed && (!c.text.empty() || !c.calls.empty())) send_answer(i);
      send_chunk(i, "", nullptr, c.finish_reason, false);
    }
    if (--remaining == 0) complete();
  }

  // Every choice is done: answer (or end the stream) and record.
  void complete() {
    std::string reason = "stop";
    for (const Choice& c : choices)
      if (c.finish_reason != "stop" && c.finish_reason != "length" && c.finish_reason != "tool_calls") reason = c.finish_reason;
    if (reason == "stop" && !choices.empty()) reason = choices[0].finish_reason;
    entry->requests->at({entry->name, reason}).inc();
    entry->e2e->observe(std::chrono::duration<double>(Clock::now() - start).count());
    entry->prompt_tokens->inc(static_cast<double>(prompt_tokens));
    if (stream) {
      if (reason == "timeout" || reason == "error") {
        std::string err = openai_error(reason == "timeout" ? 504 : 500,
                                       reason == "timeout" ? "the request deadline passed" : "generation failed").body;
        stream->write("data: " + err + "\n\n");
      } else if (req.include_usage) {
        stream->write("data: " + head(req.chat ? "chat.completion.chunk" : "text_completion") + ", \"choices\": [], \"usage\": " +
                      usage() + "}\n\n");
      }
      stream->write("data: [DONE]\n\n");
      stream->end();
      stream.reset();
      return;
    }
    if (reason == "timeout") return respond(openai_error(504, "the request deadline passed before generation finished"));
    if (reason == "cancelled") return respond(openai_error(499, "the request was cancelled"));
    if (reason == "error") return respond(openai_error(500, "generation failed"));
    std::string out = head(object()) + ", \"choices\": [";
    for (size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      out += (i ? ", {\"index\": " : "{\"index\": ") + std::to_string(i);
      if (req.chat) {
        out += ", \"message\": {\"role\": \"assistant\", \"content\": ";
        if (c.calls.empty()) {
          append_json_string(out, c.text);
        } else {
          out += "null, ";
          append_tool_calls(out, c, false);
        }
        out += "}";
      } else {
        out += ", \"text\": ";
        append_json_string(out, c.text);
      }
      out += ", \"logprobs\": ";
      if (req.logprobs) append_logprobs(out, c.samples, 0);
      else out += "null";
      out += ", \"finish_reason\": \"" + c.finish_reason + "\"}";
    }
    out += "], \"usage\": " + usage() + "}";
    respond(HttpResponse(200, "application/json", std::move(out)));
  }
};

std::string_view path_of(const std::string& target) {
  std::string_view t = target;
  return t.substr(0, t.find('?'));
}

}  // namespace

// The metric families every model's entry writes to, and the collector's state (shared
// with the collector, which may outlive the service in a Metrics registry).
struct LlmService::Shared {
  Family<Histogram> *ttft, *itl, *e2e, *batch;
  Family<Counter> *prompt, *gen, *requests;
  std::mutex mu;
  std::vector<std::shared_ptr<Entry>> models;   // what requests find (under mu)
  std::vector<std::shared_ptr<Entry>> retired;  // replaced or removed, still answering (under mu)
  std::condition_variable wake;                 // the reaper's (under mu)
  bool stop = false;
};

LlmService::LlmService(const std::vector<LlmModelSpec>& models, Metrics& metrics) : shared_(std::make_shared<Shared>()) {
  Shared& sh = *shared_;
  sh.ttft = &metrics.histogram("kiln_llm_time_to_first_token_seconds", "Time from request to first generated token", {"model"},
                               latency_buckets());
  sh.itl = &metrics.histogram("kiln_llm_inter_token_latency_seconds", "Time between consecutive tokens of a request", {"model"},
                              latency_buckets());
  sh.e2e = &metrics.histogram("kiln_llm_request_duration_seconds", "Time from request to its last token", {"model"},
                              latency_buckets());
  sh.batch = &metrics.histogram("kiln_llm_batch_sequences", "Sequences in one engine step", {"model"},
                                {1, 2, 4, 8, 16, 32, 64, 128, 256});
  sh.prompt = &metrics.counter("kiln_llm_prompt_tokens_total", "Prompt tokens of finished requests", {"model"});
  sh.gen = &metrics.counter("kiln_llm_generated_tokens_total", "Tokens generated", {"model"});
  sh.requests = &metrics.counter("kiln_llm_requests_total", "Finished LLM requests by finish reason", {"model", "finish_reason"});
  apply(models);
  auto& running = metrics.gauge("kiln_llm_requests_running", "Sequences in the engine's running batch", {"model"});
  auto& waiting = metrics.gauge("kiln_llm_requests_waiting", "Requests queued for the engine", {"model"});
  auto& usage = metrics.gauge("kiln_llm_kv_cache_usage_ratio", "Fraction of KV cache blocks held by sequences", {"model"});
  auto& blocks = metrics.gauge("kiln_llm_kv_cache_blocks", "KV cache blocks: total, used (by sequences), cached (reusable prefixes)",
                               {"model", "state"});
  auto& hit = metrics.gauge("kiln_llm_prefix_cache_hit_ratio", "Prompt tokens found in the prefix cache / prompt tokens looked up",
                            {"model"});
  auto& hit_tokens = metrics.gauge("kiln_llm_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache (cumulative)", {"model"});
  auto& preempt = metrics.gauge("kiln_llm_preemptions", "Sequences preempted for KV cache room (cumulative; they resume by recompute)",
                                {"model"});
  std::weak_ptr<Shared> weak = shared_;
  metrics.on_collect([weak, &running, &waiting, &usage, &blocks, &hit, &hit_tokens, &preempt] {
    const std::shared_ptr<Shared> sh = weak.lock();
    if (!sh) return;
    std::vector<std::shared_ptr<Entry>> models;
    {
      std::lock_guard<std::mutex> lock(sh->mu);
      models = sh->models;
    }
    for (const auto& e : models) {
      const llm::EngineStats s = e->engine->stats();
      running.at({e->name}).set(double(s.running));
      waiting.at({e->name}).set(double(s.waiting));
      usage.at({e->name}).set(s.kv_blocks_total ? double(s.kv_blocks_used) / double(s.kv_blocks_total) : 0);
      blocks.at({e->name, "total"}).set(double(s.kv_blocks_total));
      blocks.at({e->name, "used"}).set(double(s.kv_blocks_used));
      blocks.at({e->name, "cached"}).set(double(s.kv_blocks_cached));
      hit.at({e->name}).set(s.prefix_query_tokens ? double(s.prefix_hit_tokens) / double(s.prefix_query_tokens) : 0);
      hit_tokens.at({e->name}).set(double(s.prefix_hit_tokens));
      preempt.at({e->name}).set(double(s.preemptions));
    }
  });
  // Retired models are stopped by this thread once idle (every 0.2 s while there are some).
  reaper_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(shared_->mu);
    while (!shared_->stop) {
      shared_->wake.wait_for(lock, std::chrono::milliseconds(200), [this] { return shared_->stop; });
      if (shared_->stop || shared_->retired.empty()) continue;
      lock.unlock();
      reap();
      lock.lock();
    }
  });
}

namespace {
// What makes two specs the same model: everything but the engine's step callback.
std::string spec_key(const LlmModelSpec& s) {
  const llm::EngineOptions& e = s.engine;
  auto opt = [](const auto& o) { return o ? std::to_string(*o) : std::string("-"); };
  return str_cat(s.path, "|", s.device ? s.device->str() : "kernels", "|", dtype_name(s.dtype), "|", e.kv_cache_tokens, "|",
                 e.kv_cache_bytes, "|", e.context_length, "|", e.max_running, "|", e.step_tokens, "|", e.max_waiting, "|",
                 e.prefix_caching, "|", opt(s.temperature), "|", opt(s.top_p), "|", opt(s.min_p), "|", opt(s.top_k), "|",
                 opt(s.max_tokens));
}
}  // namespace

std::shared_ptr<LlmService::Entry> LlmService::load(const LlmModelSpec& spec) const {
  Shared& sh = *shared_;
  auto e = std::make_shared<Entry>();
  e->spec = spec;
  e->name = spec.name;
  try {
    llm::ModelLoadOptions o;
    o.device = spec.device;
    o.dtype = spec.dtype;
    o.context_length = spec.engine.context_length;
    e->model = llm::Model::load(spec.path, o);
  } catch (const Error& err) {
    throw_error(err.code(), "language model '" + spec.name + "' (" + spec.path + "): " + err.message());
  }
  const llm::Tokenizer& tok = e->model->tokenizer();
  const std::string_view source = e->model->file().get_string("tokenizer.chat_template", "");
  e->tmpl = std::make_unique<llm::ChatTemplate>(source.empty() ? llm::kChatMlTemplate : source);
  if (tok.bos()) e->bos = std::string(tok.token_text(*tok.bos()));
  if (tok.eos()) e->eos = std::string(tok.token_text(*tok.eos()));
  e->created = unix_time();
  e->ttft = &sh.ttft->at({spec.name});
  e->itl = &sh.itl->at({spec.name});
  e->e2e = &sh.e2e->at({spec.name});
  e->batch = &sh.batch->at({spec.name});
  e->prompt_tokens = &sh.prompt->at({spec.name});
  e->generated_tokens = &sh.gen->at({spec.name});
  e->requests = sh.requests;
  llm::EngineOptions eo = spec.engine;
  Histogram* bh = e->batch;
  eo.on_step = [bh](int64_t seqs, int64_t) { bh->observe(static_cast<double>(seqs)); };
  try {
    e->engine = std::make_unique<llm::Engine>(e->model, eo);
  } catch (const Error& err) {
    throw_error(err.code(), "language model '" + spec.name + "': " + err.message());
  }
  return e;
}

void LlmService::apply(const std::vector<LlmModelSpec>& models) {
  Shared& sh = *shared_;
  for (size_t i = 0; i < models.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (models[j].name == models[i].name)
        throw InvalidArgumentError("language models: the name '" + models[i].name + "' is given twice");
  std::vector<std::shared_ptr<Entry>> current;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    current = sh.models;
  }
  // Every new or changed model loads before anything changes: a model that fails to
  // load leaves the service as it was.
  std::vector<std::shared_ptr<Entry>> next, loaded;
  for (const LlmModelSpec& spec : models) {
    std::shared_ptr<Entry> keep;
    for (const auto& e : current)
      if (e->name == spec.name && spec_key(e->spec) == spec_key(spec)) keep = e;
    if (keep) {
      next.push_back(keep);
      continue;
    }
    next.push_back(load(spec));
    loaded.push_back(next.back());
  }
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    for (const auto& e : sh.models)
      if (std::find(next.begin(), next.end(), e) == next.end()) {
        sh.retired.push_back(e);  // requests already running on it finish there
        gone.push_back(e->name);
      }
    sh.models = std::move(next);
  }
  for (const auto& e : loaded)
    log_event(LogLevel::kInfo, "llm_loaded",
              {{"model", e->name}, {"path", e->spec.path}, {"context", std::to_string(e->engine->context_length())},
               {"kv_blocks", std::to_string(e->engine->stats().kv_blocks_total)}});
  for (const std::string& name : gone)
    if (std::none_of(loaded.begin(), loaded.end(), [&](const auto& e) { return e->name == name; }))
      log_event(LogLevel::kInfo, "llm_unloading", {{"model", name}, {"reason", "not in the configuration any more"}});
  reap();
}

bool LlmService::empty() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->models.empty();
}

std::vector<std::shared_ptr<LlmService::Entry>> LlmService::models() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->models;
}

void LlmService::reap() {
  // A retired model goes once no request holds it and its engine is idle; its engine is
  // stopped here, on the reaper's or apply's thread (never on the engine's own, where a
  // request's last event may drop the last other reference).
  std::vector<std::shared_ptr<Entry>> done;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto& r = shared_->retired;
    for (auto it = r.begin(); it != r.end();) {
      const llm::EngineStats st = (*it)->engine->stats();
      if (it->use_count() == 1 && st.running == 0 && st.waiting == 0) {
        done.push_back(std::move(*it));
        it = r.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& e : done) {
    e->engine.reset();
    log_event(LogLevel::kInfo, "llm_unloaded", {{"model", e->name}});
  }
}

LlmService::~LlmService() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop = true;
  }
  shared_->wake.notify_all();
  if (reaper_.joinable()) reaper_.join();
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (auto& e : shared_->models) e->engine.reset();
  for (auto& e : shared_->retired) e->engine.reset();
}

std::vector<std::string> LlmService::names() const {
  std::vector<std::string> out;
  for (const auto& e : models()) out.push_back(e->name);
  return out;
}

std::string LlmService::status_json() const {
  const std::vector<std::shared_ptr<Entry>> ms = models();
  std::string out = "[";
  for (size_t i = 0; i < ms.size(); ++i) {
    const Entry& e = *ms[i];
    const llm::EngineStats st = e.engine->stats();
    out += i ? ", {\"name\": " : "{\"name\": ";
    append_json_string(out, e.name);
    out += ", \"state\": \"AVAILABLE\", \"running\": " + std::to_string(st.running) +
           ", \"waiting\": " + std::to_string(st.waiting) + ", \"kv_cache_blocks_used\": " + std::to_string(st.kv_blocks_used) +
           ", \"kv_cache_blocks_total\": " + std::to_string(st.kv_blocks_total) + "}";
  }
  return out + "]";
}

namespace {

std::string model_json(const LlmService::Entry& e) {
  std::string out = "{\"id\": ";
  append_json_string(out, e.name);
  out += ", \"object\": \"model\", \"created\": " + std::to_string(e.created) + ", \"owned_by\": \"kiln\", \"meta\": {\"context_length\": " +
         std::to_string(e.engine->context_length()) + ", \"n_vocab\": " + std::to_string(e.model->config().n_vocab) +
         ", \"architecture\": ";
  append_json_string(out, e.model->config().architecture);
  out += "}}";
  return out;
}

simdjson::dom::object parse_object(simdjson::dom::parser& parser, const std::string& body) {
  simdjson::dom::element doc;
  if (auto err = parser.parse(body).get(doc); err != simdjson::SUCCESS)
    throw InvalidArgumentError(str_cat("the body is not valid JSON: ", simdjson::error_message(err)));
  simdjson::dom::object o;
  if (doc.get_object().get(o) != simdjson::SUCCESS) throw InvalidArgumentError("the body must be a JSON object");
  return o;
}

}  // namespace

bool LlmService::handle(HttpRequest& http, Responder& respond) {
  const std::vector<std::shared_ptr<Entry>> models_ = models();  // this request's view
  const std::string_view path = path_of(http.target);
  const bool chat = path == "/v1/chat/completions", completion = path == "/v1/completions";
  const bool list = path == "/v1/models", tokenize = path == "/tokenize", detokenize = path == "/detokenize";
  std::shared_ptr<Entry> one;
  if (path.substr(0, 11) == "/v1/models/")
    for (const auto& e : models_)
      if (e->name == path.substr(11)) one = e;
  if (!chat && !completion && !list && !tokenize && !detokenize && !one) return false;
  auto find = [&](const std::string& name) -> std::shared_ptr<Entry> {
    if (name.empty() && models_.size() == 1) return models_[0];
    for (const auto& e : models_)
      if (e->name == name) return e;
    throw RequestFieldError("model", "The model '" + name + "' does not exist (GET /v1/models lists them)");
  };
  auto unknown_model = [&](const RequestFieldError& e) { respond(openai_error(404, e.message(), "model", "model_not_found")); };
  try {
    if (list || one) {
      if (http.method != "GET") return respond(openai_error(405, "use GET")), true;
      if (one) return respond(HttpResponse(200, "application/json", model_json(*one))), true;
      std::string out = "{\"object\": \"list\", \"data\": [";
      for (size_t i = 0; i < models_.size(); ++i) out += (i ? ", " : "") + model_json(*models_[i]);
      out += "]}";
      respond(HttpResponse(200, "application/json", std::move(out)));
      return true;
    }
    if (http.method != "POST") return respond(openai_error(405, "use POST")), true;
    if (tokenize || detokenize) {
      simdjson::dom::parser parser;
      simdjson::dom::object o = parse_object(parser, http.body);
      std::string model;
      std::string_view sv;
      if (o["model"].get(sv) == simdjson::SUCCESS) model = std::string(sv);
      std::shared_ptr<Entry> e;
      try {
        e = find(model);
      } catch (const RequestFieldError& err) {
        return unknown_model(err), true;
      }
      const llm::Tokenizer& tok = e->model->tokenizer();
      if (tokenize) {
        if (o["content"].get(sv) != simdjson::SUCCESS) throw RequestFieldError("content", "'content' (a string) is required");
        bool add_special = false, with_pieces = false;
        if (o["add_special"].get(add_special) != simdjson::SUCCESS) add_special = false;
        if (o["with_pieces"].get(with_pieces) != simdjson::SUCCESS) with_pieces = false;
        const std::vector<llm::TokenId> ids = tok.encode(sv, add_special, true);
        std::string out = "{\"tokens\": [";
        for (size_t i = 0; i < ids.size(); ++i) {
          if (i) out += ", ";
          if (with_pieces) {
            out += "{\"id\": " + std::to_string(ids[i]) + ", \"piece\": ";
            append_json_string(out, tok.token_to_piece(ids[i], true));
            out += "}";
          } else {
            out += std::to_string(ids[i]);
          }
        }
        out += "]}";
        return respond(HttpResponse(200, "application/json", std::move(out))), true;
      }
      simdjson::dom::array arr;
      if (o["tokens"].get(arr) != simdjson::SUCCESS) throw RequestFieldError("tokens", "'tokens' (a list of token ids) is required");
      std::vector<llm::TokenId> ids;
      for (auto v : arr) {
        int64_t id = -1;
        if (v.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id >= tok.vocab_size())
          throw RequestFieldError("tokens", str_cat("'tokens' must hold token ids in [0, ", tok.vocab_size(), ")"));
        ids.push_back(static_cast<llm::TokenId>(id));
      }
      std::string out = "{\"content\": ";
      append_json_string(out, tok.decode(ids));
      out += "}";
      return respond(HttpResponse(200, "application/json", std::move(out))), true;
    }

    // Completions.
    auto call = std::make_shared<Call>();
    call->start = Clock::now();
    call->req = parse_llm_request(http.body, chat);
    try {
      call->entry = find(call->req.model);
    } catch (const RequestFieldError& err) {
      return unknown_model(err), true;
    }
    Entry& e = *call->entry;
    LlmRequest& rq = call->req;
    if (!rq.temperature_given && e.spec.temperature) rq.sampling.temperature = *e.spec.temperature;
    if (!rq.top_p_given && e.spec.top_p) rq.sampling.top_p = *e.spec.top_p;
    if (!rq.top_k_given && e.spec.top_k) rq.sampling.top_k = *e.spec.top_k;
    if (!rq.min_p_given && e.spec.min_p) rq.sampling.min_p = *e.spec.min_p;
    if (!rq.max_tokens && e.spec.max_tokens) rq.max_tokens = *e.spec.max_tokens;
    const llm::Tokenizer& tok = e.model->tokenizer();
    std::vector<llm::TokenId> prompt;
    call->tools = rq.tools.active();
    call->response_is_json = rq.json_object || rq.json_schema;
    // Under tools, the answer's schema: tool calls (or a response, with tool_choice "auto").
    const std::shared_ptr<const llm::JsonSchema> schema = call->tools ? rq.tool_schema : rq.json_schema;
    if (chat) {
      std::vector<llm::ChatMessage> msgs = rq.messages;
      if (call->tools) msgs = with_tool_instructions(std::move(msgs), rq.tools, call->response_is_json);
      prompt = tok.encode(render_chat(*e.tmpl, std::move(msgs), e.bos, e.eos), false, true);
    } else if (call->req.prompt_is_tokens) {
      prompt = call->req.prompt_tokens;
      for (llm::TokenId t : prompt)
        if (t >= tok.vocab_size()) throw RequestFieldError("prompt", str_cat("token id ", t, " is outside the vocabulary of ", tok.vocab_size()));
    } else {
      prompt = tok.encode(call->req.prompt, true, true);
    }
    if (prompt.empty()) throw RequestFieldError(chat ? "messages" : "prompt", "the prompt has no tokens");
    const int64_t ctx = e.engine->context_length(), n_prompt = static_cast<int64_t>(prompt.size());
    const int64_t max_tokens = call->req.max_tokens ? *call->req.max_tokens : chat ? ctx - n_prompt : std::min<int64_t>(16, ctx - n_prompt);
    if (max_tokens < 1 || n_prompt + max_tokens > ctx)
      return respond(openai_error(400,
                                  str_cat("This model's context is ", ctx, " tokens; the request needs ", n_prompt, " for the prompt + ",
                                          std::max<int64_t>(max_tokens, 1), " to generate. Shorten the prompt or lower max_tokens."),
                                  chat ? "messages" : "prompt", "context_length_exceeded")),
             true;
    const auto deadline = request_deadline(http, call->start);
    call->id = new_id(chat ? "chatcmpl" : "cmpl");
    call->created = unix_time();
    call->cancelled = http.cancelled ? http.cancelled : std::make_shared<std::atomic<bool>>(false);
    call->respond = respond;
    call->choices.resize(static_cast<size_t>(call->req.n));
    call->remaining = call->req.n;
    const uint64_t seed = call->req.seeded ? call->req.sampling.seed : random_seed();

    std::lock_guard<std::mutex> lock(call->mu);  // events wait until every choice is queued
    for (int i = 0; i < call->req.n; ++i) {
      llm::CompletionRequest cr;
      cr.prompt = prompt;
      cr.max_tokens = max_tokens;
      cr.stop = call->req.stop;
      cr.sampling = call->req.sampling;
      cr.sampling.seed = seed + static_cast<uint64_t>(i);
      cr.ignore_eos = call->req.ignore_eos;
      cr.json_object = call->req.json_object && !call->tools;
      cr.json_schema = schema;
      cr.deadline = deadline;
      cr.cancelled = call->cancelled;
      cr.on_event = [call, i](const llm::CompletionEvent& ev) { call->on_event(static_cast<size_t>(i), ev); };
      try {
        e.engine->submit(std::move(cr));
      } catch (...) {
        call->abandoned = true;
        call->cancelled->store(true);  // the choices already queued end at the next step
        respond(error_from_exception());
        return true;
      }
    }
    if (call->req.stream) {
      call->stream = http.open_stream(200, "text/event-stream");
      if (!call->stream) {
        call->cancelled->store(true);
        return true;
      }
      if (chat)
        for (int i = 0; i < call->req.n; ++i) call->send_chunk(static_cast<size_t>(i), "", nullptr, "", true);
    }
    return true;
  } catch (...) {
    respond(error_from_exception());
    return true;
  }
}

}  // namespace kiln::serving
