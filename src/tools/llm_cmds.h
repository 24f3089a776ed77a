#pragma once
// Language-model commands: `kiln generate` (text from a prompt, streamed) and
// `kiln show --model F.gguf` (what a GGUF file holds).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::tools {

// Where a command runs the model: empty device = the CPU kernels; else the tensor path
// on that device ("cuda:0", "cpu") with weights of `dtype`.
struct LlmDeviceArgs {
  std::string device;
  std::string dtype = "bf16";
};

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  int64_t max_tokens = 128;
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  uint64_t seed = 0;
  int threads = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool raw = false;  // no special-token parsing
  bool json = false;        // constrain the output to one JSON object
  std::string json_schema;  // ... to a value valid under this JSON Schema (a file, or the schema's text)
  std::string server;  // http://HOST:PORT of a kiln serve (or OpenAI-compatible) server; then model is its model name
  LlmDeviceArgs where;
};
CLI::App* add_generate_command(CLI::App& app, GenerateArgs& args);
int run_generate(const GenerateArgs& args);

struct ChatArgs {
  GenerateArgs gen;         // model, sampling, threads (prompt fields unused)
  std::string system;       // a system message (else the template's default, if any)
  int64_t context = 4096;   // KV cache positions for the whole conversation
};
CLI::App* add_chat_command(CLI::App& app, ChatArgs& args);
int run_chat(const ChatArgs& args);

struct PerplexityArgs {
  std::string model, file;
  int64_t context = 512;
  int64_t chunks = -1;
  int threads = 0;
  LlmDeviceArgs where;
};
CLI::App* add_perplexity_command(CLI::App& app, PerplexityArgs& args);
int run_perplexity(const PerplexityArgs& args);

int run_show_gguf(const std::string& path);

}  // namespace kiln::tools
