#include "llm_cmds.h"

#include <algorithm>
#include <chrono>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <fstream>
#include <map>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/json_string.h"
#include "kiln/core/parallel.h"
#include "kiln/llm/chat_template.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/gguf.h"
#include "kiln/llm/model.h"
#include "kiln/llm/perplexity.h"
#include "kiln/serving/llm_client.h"

namespace kiln::tools {

namespace {

void add_device_options(CLI::App* c, LlmDeviceArgs& a) {
  c->add_option("--device", a.device,
                "Run on this device with kiln's ops, e.g. cuda:0 (default: the CPU's kernels on the quantised weights)");
  c->add_option("--dtype", a.dtype, "Weights on --device: f32, f16 or bf16")->check(CLI::IsMember({"f32", "f16", "bf16"}));
}

// context: the positions the command will use (0: the model's own), for the models whose
// weights depend on it (Phi-3's RoPE factors).
std::shared_ptr<const llm::Model> load_model(const std::string& path, const LlmDeviceArgs& a, int64_t context = 0) {
  llm::ModelLoadOptions o;
  o.context_length = context;
  if (!a.device.empty()) {
    o.device = parse_device(a.device);
    o.dtype = dtype_from_name(a.dtype);
  }
  return llm::Model::load(path, o);
}

// The request fields a GenerateArgs sets (model, sampling, stop; streamed, with usage).
// --json-schema: the schema's text (given inline when it starts with '{', else a file).
std::string json_schema_text(const GenerateArgs& a) {
  const size_t first = a.json_schema.find_first_not_of(" \t\r\n");
  return first != std::string::npos && a.json_schema[first] == '{' ? a.json_schema : read_file(a.json_schema);
}

// --json / --json-schema, checked before anything runs (a schema kiln cannot enforce is
// an InvalidArgumentError naming the keyword); null when neither is given.
std::shared_ptr<const llm::JsonSchema> json_constraint(const GenerateArgs& a) {
  if (a.json && !a.json_schema.empty()) throw InvalidArgumentError("give --json or --json-schema, not both");
  if (a.json) return llm::JsonSchema::any_object();
  if (a.json_schema.empty()) return nullptr;
  return llm::JsonSchema::compile(json_schema_text(a));
}

std::string server_request_fields(const GenerateArgs& a) {
  std::string b = "\"model\": " + json_string(a.model) + ", \"max_tokens\": " + std::to_string(a.max_tokens) +
                  ", \"temperature\": " + std::to_string(a.temperature) + ", \"top_k\": " + std::to_string(a.top_k) +
                  ", \"top_p\": " + std::to_string(a.top_p > 0 ? a.top_p : 1.0f) + ", \"min_p\": " + std::to_string(a.min_p) +
                  ", \"repetition_penalty\": " + std::to_string(a.repeat_penalty) + ", \"seed\": " + std::to_string(a.seed) +
                  ", \"ignore_eos\": " + (a.ignore_eos ? "true" : "false") +
                  ", \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"stop\": [";
  for (size_t i = 0; i < a.stop.size(); ++i) b += (i ? ", " : "") + json_string(a.stop[i]);
  b += "]";
  if (a.json) b += ", \"response_format\": {\"type\": \"json_object\"}";
  if (!a.json_schema.empty())
    b += ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"kiln-generate\", \"schema\": " +
         json_schema_text(a) + "}}";
  return b;
}

void print_piece(std::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

int run_generate_on_server(const GenerateArgs& a, const std::string& prompt) {
  if (a.raw) throw InvalidArgumentError("--raw is for local generation (the server parses special tokens)");
  json_constraint(a);  // a schema kiln cannot enforce fails here, before the request
  std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  const serving::LlmClientResult r = serving::llm_stream(
      a.server, "/v1/completions", "{\"prompt\": " + json_string(prompt) + ", " + server_request_fields(a) + "}", print_piece);
  std::fprintf(stdout, "\n");
  std::fprintf(stderr,
               "kiln generate: server %s | prompt %lld tokens (%lld cached) | generated %lld tokens, first text after %.0f ms, "
               "%.1f tokens/s | finish: %s\n",
               a.server.c_str(), static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.cached_tokens),
               static_cast<long long>(r.completion_tokens), r.first_text_seconds * 1e3,
               r.completion_tokens > 1 ? (r.completion_tokens - 1) / std::max(r.seconds - r.first_text_seconds, 1e-9) : 0.0,
               r.finish_reason.c_str());
  return 0;
}

int run_chat_on_server(const ChatArgs& a) {
  const bool interactive = isatty(0) && isatty(1);
  std::string messages;  // the conversation as JSON objects, comma-separated
  auto add = [&](const char* role, const std::string& content) {
    messages += (messages.empty() ? "" : ", ") + std::string("{\"role\": \"") + role + "\", \"content\": " + json_string(content) + "}";
  };
  if (!a.system.empty()) add("system", a.system);
  const std::string start = messages;
  if (interactive) std::printf("kiln chat: %s (/reset starts over, /exit or Ctrl-D ends)\n", a.gen.server.c_str());
  std::string line;
  for (;;) {
    if (interactive) {
      std::printf("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = start;
      continue;
    }
    if (line.empty()) continue;
    const std::string before = messages;
    add("user", line);
    serving::LlmClientResult r;
    try {
      r = serving::llm_stream(a.gen.server, "/v1/chat/completions",
                              "{\"messages\": [" + messages + "], " + server_request_fields(a.gen) + "}", print_piece);
    } catch (const InvalidArgumentError& e) {  // e.g. the conversation outgrew the context
      std::fprintf(stderr, "\nkiln chat: %s\n", e.message().c_str());
      messages = before;
      continue;
    }
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[prompt %lld tokens (%lld cached), reply %lld tokens, %s]\n", static_cast<long long>(r.prompt_tokens),
                 static_cast<long long>(r.cached_tokens), static_cast<long long>(r.completion_tokens), r.finish_reason.c_str());
    add("assistant", r.text);
  }
  return 0;
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateArgs& a) {
  auto* c = app.add_subcommand("generate", "Generate text with a GGUF language model, streamed to stdout");
  c->add_option("-m,--model", a.model, "The GGUF file (with --server: the model's name there; default: its only one)");
  c->add_option("--server", a.server, "Ask a running kiln serve at http://HOST:PORT instead of loading the model here");
  c->add_option("-p,--prompt", a.prompt, "The prompt (special tokens such as <|im_start|> are parsed)");
  c->add_option("-f,--prompt-file", a.prompt_file, "Read the prompt from this file");
  c->add_option("-n,--max-tokens", a.max_tokens, "Tokens to generate at most")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  c->add_option("--temperature,--temp", a.temperature, "0: greedy")->check(CLI::Range(0.0f, 100.0f));
  c->add_option("--top-k", a.top_k, "0: off")->check(CLI::Range(0, 1 << 30));
  c->add_option("--top-p", a.top_p)->check(CLI::Range(0.0f, 1.0f));
  c->add_option("--min-p", a.min_p)->check(CLI::Range(0.0f, 1.0f));
  c->add_option("--repeat-penalty", a.repeat_penalty)->check(CLI::Range(0.0f, 100.0f));
  c->add_option("-s,--seed", a.seed, "Sampling seed (same seed, same text)");
  c->add_option("-t,--threads", a.threads, "CPU threads (default: every core)")->check(CLI::Range(1, 1024));
  c->add_option("--stop", a.stop, "Stop when this text appears (repeatable)");
  c->add_flag("--ignore-eos", a.ignore_eos, "Do not stop at end-of-generation tokens (benchmarks)");
  c->add_flag("--raw", a.raw, "Tokenize special-token text as plain text");
  c->add_flag("--json", a.json, "Constrain the output to one JSON object");
  c->add_option("--json-schema", a.json_schema,
                "Constrain the output to a value valid under this JSON Schema: a file, or the schema's text ({...})");
  add_device_options(c, a.where);
  return c;
}

int run_generate(const GenerateArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  if (a.prompt.empty() == a.prompt_file.empty()) throw InvalidArgumentError("give exactly one of --prompt and --prompt-file");
  const std::string prompt = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
  if (!a.server.empty()) return run_generate_on_server(a, prompt);
  if (a.model.empty()) throw InvalidArgumentError("give --model (a GGUF file) or --server");
  llm::GenerateOptions o;
  o.json = json_constraint(a);
  const auto t0 = std::chrono::steady_clock::now();
  auto model = load_model(a.model, a.where);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.max_tokens = a.max_tokens;
  o.stop = a.stop;
  o.ignore_eos = a.ignore_eos;
  o.parse_special = !a.raw;
  o.sampling.temperature = a.temperature;
  o.sampling.top_k = a.top_k;
  o.sampling.top_p = a.top_p > 0 ? a.top_p : 1.0f;
  o.sampling.min_p = a.min_p;
  o.sampling.repetition_penalty = a.repeat_penalty;
  o.sampling.seed = a.seed;
  std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  const llm::GenerateResult r = llm::generate(*model, prompt, o, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fprintf(stdout, "\n");
  std::fprintf(stderr,
               "kiln generate: load %.0f ms | prompt %zu tokens, %.1f tokens/s | generated %zu tokens, %.1f tokens/s | finish: %s | "
               "%d threads\n",
               load_s * 1e3, r.prompt_tokens.size(), r.prompt_tokens.size() / std::max(r.prompt_seconds, 1e-9), r.tokens.size(),
               r.tokens.size() > 1 ? (r.tokens.size() - 1) / std::max(r.decode_seconds, 1e-9) : 0.0, r.finish_reason.c_str(),
               num_threads());
  return 0;
}

CLI::App* add_chat_command(CLI::App& app, ChatArgs& a) {
  auto* c = app.add_subcommand("chat", "Chat with a GGUF language model (its chat template; a terminal or a pipe)");
  c->add_option("-m,--model", a.gen.model, "The GGUF file (with --server: the model's name there; default: its only one)");
  c->add_option("--server", a.gen.server, "Talk to a running kiln serve at http://HOST:PORT instead of loading the model here");
  c->add_option("--system", a.system, "A system message");
  c->add_option("-n,--max-tokens", a.gen.max_tokens, "Tokens per reply at most")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("-c,--context", a.context, "Positions the conversation may use")->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  c->add_option("--temperature,--temp", a.gen.temperature, "0: greedy")->check(CLI::Range(0.0f, 100.0f));
  c->add_option("--top-k", a.gen.top_k)->check(CLI::Range(0, 1 << 30));
  c->add_option("--top-p", a.gen.top_p)->check(CLI::Range(0.0f, 1.0f));
  c->add_option("--min-p", a.gen.min_p)->check(CLI::Range(0.0f, 1.0f));
  c->add_option("-s,--seed", a.gen.seed, "Sampling seed");
  c->add_option("-t,--threads", a.gen.threads, "CPU threads (default: every core)")->check(CLI::Range(1, 1024));
  add_device_options(c, a.gen.where);
  a.gen.max_tokens = 512;
  return c;
}

int run_chat(const ChatArgs& a) {
  if (!a.gen.server.empty()) return run_chat_on_server(a);
  if (a.gen.model.empty()) throw InvalidArgumentError("give --model (a GGUF file) or --server");
  if (a.gen.threads > 0) set_num_threads(a.gen.threads);
  auto model = load_model(a.gen.model, a.gen.where, a.context);
  const llm::Tokenizer& tok = model->tokenizer();
  const std::string_view source = model->file().get_string("tokenizer.chat_template", "");
  const bool interactive = isatty(0) && isatty(1);
  if (source.empty()) std::fprintf(stderr, "kiln chat: the file has no chat template; using ChatML\n");
  const llm::ChatTemplate tmpl(source.empty() ? llm::kChatMlTemplate : source);
  llm::GenerateOptions o;
  o.max_tokens = a.gen.max_tokens;
  o.sampling.temperature = a.gen.temperature;
  o.sampling.top_k = a.gen.top_k;
  o.sampling.top_p = a.gen.top_p > 0 ? a.gen.top_p : 1.0f;
  o.sampling.min_p = a.gen.min_p;
  o.sampling.seed = a.gen.seed;
  llm::KvCache cache = model->make_cache({a.context, 16});
  const llm::KvCache::SeqId seq = cache.add_sequence();
  std::vector<llm::TokenId> cached;
  std::vector<llm::ChatMessage> history;
  if (!a.system.empty()) history.push_back({"system", a.system});
  const std::string bos = tok.bos() ? std::string(tok.token_text(*tok.bos())) : "";
  const std::string eos = tok.eos() ? std::string(tok.token_text(*tok.eos())) : "";
  if (interactive) std::printf("kiln chat: %s (/reset starts over, /exit or Ctrl-D ends)\n", model->config().name.c_str());
  std::string line;
  for (;;) {
    if (interactive) {
      std::printf("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.resize(a.system.empty() ? 0 : 1);
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    const std::string prompt = tmpl.apply(history, true, bos, eos);
    llm::GenerateResult r;
    try {
      r = llm::generate_in(*model, cache, seq, cached, tok.encode(prompt, false, true), o, [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      });
    } catch (const ResourceExhaustedError&) {
      std::printf("\n[the conversation fills the context of %lld positions: /reset, or a larger --context]\n",
                  static_cast<long long>(a.context));
      history.pop_back();
      cache.truncate(seq, 0);
      cached.clear();
      continue;
    }
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[prompt %zu tokens (%lld cached), reply %zu tokens at %.1f tokens/s, %s]\n", r.prompt_tokens.size(),
                 static_cast<long long>(r.reused_tokens), r.tokens.size(),
                 r.tokens.size() > 1 ? (r.tokens.size() - 1) / std::max(r.decode_seconds, 1e-9) : 0.0, r.finish_reason.c_str());
    history.push_back({"assistant", r.text});
  }
  return 0;
}

CLI::App* add_perplexity_command(CLI::App& app, PerplexityArgs& a) {
  auto* c = app.add_subcommand("perplexity", "Perplexity of a GGUF language model on a text file (as llama-perplexity)");
  c->add_option("-m,--model", a.model, "The GGUF file")->required();
  c->add_option("-f,--file", a.file, "The text")->required();
  c->add_option("-c,--context", a.context, "Tokens per chunk (the second half of each is scored)")->check(CLI::Range(int64_t{4}, int64_t{1} << 20));
  c->add_option("--chunks", a.chunks, "At most this many chunks (default: all)");
  c->add_option("-t,--threads", a.threads, "CPU threads (default: every core)")->check(CLI::Range(1, 1024));
  add_device_options(c, a.where);
  return c;
}

int run_perplexity(const PerplexityArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  auto model = load_model(a.model, a.where, a.context);
  const llm::PerplexityResult r = llm::perplexity(*model, read_file(a.file), a.context, a.chunks);
  for (size_t i = 0; i < r.running.size(); ++i) std::printf("[%zu]%.4f,", i + 1, r.running[i]);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f (%lld chunks of %lld, %lld tokens scored of %lld, %.1f s, %.0f tokens/s)\n",
              r.perplexity, r.perplexity * r.nll_stddev, static_cast<long long>(r.chunks), static_cast<long long>(a.context),
              static_cast<long long>(r.scored_tokens), static_cast<long long>(r.text_tokens), r.seconds,
              r.chunks * a.context / std::max(r.seconds, 1e-9));
  return 0;
}

int run_show_gguf(const std::string& path) {
  auto model = llm::Model::load(path);
  const llm::ModelConfig& c = model->config();
  const llm::GgufFile& f = model->file();
  const llm::Tokenizer& tok = model->tokenizer();
  std::printf("%s: GGUF v%u, %.1f MB\n", path.c_str(), f.version(), f.file_size() / 1e6);
  std::printf("model: %s%s%s\n", c.architecture.c_str(), c.name.empty() ? "" : ", ", c.name.c_str());
  std::printf("  blocks %lld, embedding %lld, feed-forward %lld, heads %lld (kv %lld, size %lld), rope dims %lld base %g%s%s\n",
              (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_ff, (long long)c.n_head, (long long)c.n_head_kv,
              (long long)c.head_dim, (long long)c.n_rot, c.rope_base, c.rope_neox ? " (neox)" : " (normal)",
              c.rope_freq_scale != 1.0f ? (" scale " + std::to_string(c.rope_freq_scale)).c_str() : "");
  std::printf("  context %lld, rms eps %g, vocabulary %lld, output head %s%s\n", (long long)c.n_ctx_train, c.rms_eps,
              (long long)c.n_vocab, c.tied_output ? "tied to the embedding" : "separate", c.qkv_bias ? ", q/k/v biases" : "");
  if (!c.rope_freq_factors.empty()) {
    const auto [lo, hi] = std::minmax_element(c.rope_freq_factors.begin(), c.rope_freq_factors.end());
    std::printf("  rope frequency factors: %zu, %g to %g\n", c.rope_freq_factors.size(), *lo, *hi);
  }
  if (c.rope_attn_factor != 1.0f) std::printf("  rope attention factor %g\n", c.rope_attn_factor);
  if (c.swa_window > 0)
    std::printf("  sliding window %lld on %lld of %lld blocks (rope base %g)\n", (long long)c.swa_window,
                (long long)std::count(c.swa_layers.begin(), c.swa_layers.end(), true), (long long)c.n_layer, c.rope_base_swa);
  if (c.attn_softcap > 0 || c.final_logit_softcap > 0)
    std::printf("  soft caps: attention scores %g, logits %g (0: none)\n", c.attn_softcap, c.final_logit_softcap);
  std::map<std::string, std::pair<int, size_t>> types;
  int64_t params = 0;
  for (const llm::GgufTensor& t : f.tensors()) {
    auto& e = types[llm::ggml_type_name(static_cast<uint32_t>(t.type))];
    ++e.first;
    e.second += t.nbytes;
    params += t.elements();
  }
  std::printf("tensors: %zu, %lld parameters, %.1f MB read per decoded token\n", f.tensors().size(), (long long)params,
              model->weight_bytes() / 1e6);
  for (const auto& [name, e] : types) std::printf("  %-6s %4d tensors %9.1f MB\n", name.c_str(), e.first, e.second / 1e6);
  std::printf("tokenizer: %s%s%s, %d tokens, bos %s, eos %s, adds bos: %s\n",
              tok.kind() == llm::Tokenizer::Kind::kBytePairGpt2 ? "byte-level BPE (gpt2)" : "SentencePiece BPE (llama)",
              tok.pre().empty() ? "" : ", pre-tokenizer ", tok.pre().c_str(), tok.vocab_size(),
              tok.bos() ? std::string(tok.token_text(*tok.bos())).c_str() : "-",
              tok.eos() ? std::string(tok.token_text(*tok.eos())).c_str() : "-", tok.add_bos() ? "yes" : "no");
  const std::string_view tmpl = f.get_string("tokenizer.chat_template", "");
  if (!tmpl.empty()) std::printf("chat template (%zu bytes):\n%.*s\n", tmpl.size(), static_cast<int>(tmpl.size()), tmpl.data());
  return 0;
}

}  // namespace kiln::tools
