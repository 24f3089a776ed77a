#pragma once
// One generation from a prompt: prefill, then decode until a stop token, a stop string
// or max_tokens, streaming text as it comes (never half a UTF-8 character, never the
// start of a stop string that may still complete). The serving engine batches many of
// these on one KV cache; this is the single-sequence form (`kiln generate`, tests).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/llm/json_constraint.h"
#include "kiln/llm/model.h"
#include "kiln/llm/sampler.h"

namespace kiln::llm {

// The text of one generation as tokens arrive: whole UTF-8 characters only, stop strings
// cut (the text ends before the first one and nothing after it is passed on), text that
// may still become a stop string held back, end-of-generation tokens end it (unless
// ignored). One per sequence; generate() and the serving engine share it.
class TextOutput {
 public:
  TextOutput(const Tokenizer& tokenizer, std::vector<std::string> stop, bool ignore_eos);
  struct Step {
    std::string text;   // text that became final with this token
    bool stop = false;  // the generation ended (a stop string, or an end-of-generation token)
    bool eog = false;   // ... an end-of-generation token, which is not part of the output
  };
  Step push(TokenId token);
  // The text still held back, at the end of a generation that did not stop.
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  bool ignore_eos_;
  TextStream stream_;
  std::string pending_;
};

struct GenerateOptions {
  int64_t max_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not included in the text)
  SamplingParams sampling;
  bool add_special = true;        // BOS as the model's file asks
  bool parse_special = true;      // control tokens written in the prompt are tokens
  bool ignore_eos = false;        // keep going past end-of-generation tokens (benchmarks)
  int64_t prefill_chunk = 512;    // prompt tokens per forward step
  // Constrained decoding (kiln/llm/json_constraint.h): a value valid under this schema
  // (JsonSchema::any_object() for one JSON object); the generation stops ("stop") when
  // nothing but whitespace could follow.
  std::shared_ptr<const JsonSchema> json;
  KvCacheOptions cache;           // max_tokens is raised to fit prompt + max_tokens
};

struct GenerateResult {
  std::string text;
  std::vector<TokenId> prompt_tokens, tokens;
  std::vector<Sample> samples;     // one per generated token (logprobs)
  std::string finish_reason;       // "stop" (token or string), "length", "cancelled"
  int64_t reused_tokens = 0;       // prompt tokens found in the cache (generate_in)
  double prompt_seconds = 0, decode_seconds = 0;
};

// on_text gets each piece of text as it becomes final; returning false cancels.
GenerateResult generate(const Model& model, std::string_view prompt, const GenerateOptions& options,
                        const std::function<bool(std::string_view)>& on_text = nullptr);
// The same from token ids.
GenerateResult generate_tokens(const Model& model, std::vector<TokenId> prompt, const GenerateOptions& options,
                               const std::function<bool(std::string_view)>& on_text = nullptr);

// The same on a sequence of an existing cache whose tokens are `cached`: the prompt's
// longest cached prefix is not run again (a conversation's earlier turns). `cached` is
// updated to what the sequence holds afterwards. The cache must have room for the rest.
GenerateResult generate_in(const Model& model, KvCache& cache, KvCache::SeqId seq, std::vector<TokenId>& cached,
                           std::vector<TokenId> prompt, const GenerateOptions& options,
                           const std::function<bool(std::string_view)>& on_text = nullptr);

}  // namespace kiln::llm
