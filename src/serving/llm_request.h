#pragma once
// OpenAI's request bodies (POST /v1/chat/completions, /v1/completions) -> LlmRequest.
// Unknown fields are ignored, as OpenAI does; a field of the wrong type or out of its
// range is a RequestFieldError naming it (the API answers 400 with "param" set). The
// parser never reads past the body and takes any bytes (it is fuzzed:
// fuzz/llm_request_fuzzer.cc).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/llm/chat_template.h"
#include "kiln/llm/json_constraint.h"
#include "kiln/llm/sampler.h"
#include "llm_tools.h"

namespace kiln::serving {

class RequestFieldError : public InvalidArgumentError {
 public:
  RequestFieldError(std::string param, const std::string& message) : InvalidArgumentError(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

struct LlmRequest {
  bool chat = false;
  std::string model;
  std::vector<llm::ChatMessage> messages;     // chat
  std::string prompt;                         // completions, text
  std::vector<llm::TokenId> prompt_tokens;    // completions, token ids
  bool prompt_is_tokens = false;
  std::optional<int64_t> max_tokens;          // max_tokens or max_completion_tokens
  int n = 1;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  bool logprobs = false;                      // chat: logprobs; completions: logprobs >= 0
  llm::SamplingParams sampling;               // temperature, top_p, top_k, min_p, penalties, logit_bias, seed, top_logprobs
  bool seeded = false;                        // seed given (otherwise a random one)
  // Given in the body (else the model's configured default applies).
  bool temperature_given = false, top_p_given = false, top_k_given = false, min_p_given = false;
  bool ignore_eos = false;                    // kiln: generate max_tokens whatever the model says (benchmarks)
  bool json_object = false;                   // response_format {"type": "json_object"}
  // response_format {"type": "json_schema", "json_schema": {"schema": {...}}}, compiled.
  std::shared_ptr<const llm::JsonSchema> json_schema;
  std::string json_schema_text;               // its JSON text (compact)
  ToolRequest tools;                          // chat: tools, tool_choice, parallel_tool_calls
  std::shared_ptr<const llm::JsonSchema> tool_schema;  // the answer's schema when tools are active
  std::string user;
};

// Limits the parser enforces.
constexpr int kMaxChoices = 16;
constexpr int kMaxStopStrings = 16;
constexpr int kMaxTools = 128;  // OpenAI's limit

// `chat`: the body of /v1/chat/completions (messages) or /v1/completions (prompt).
// InvalidArgumentError for a body that is not a JSON object; RequestFieldError for a field.
LlmRequest parse_llm_request(std::string_view body, bool chat);

}  // namespace kiln::serving
