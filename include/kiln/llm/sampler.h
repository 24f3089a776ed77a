#pragma once
// Choosing the next token from logits: greedy, or seeded sampling with temperature,
// top-k, top-p (nucleus), min-p, repetition / presence / frequency penalties and logit
// bias; log-probabilities of the chosen token and of the N most likely ones.
//
// Order of the transformations: logit bias, penalties (over the last penalty_last_n
// tokens), then greedy if temperature == 0; else temperature, top-k, top-p, min-p, and a
// draw from what is left. Log-probabilities are the model's (log-softmax of the raw
// logits), as OpenAI's API reports them. A Sampler's draws depend on its seed and its
// own history only (never on other sequences in a batch).
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kiln/llm/tokenizer.h"

namespace kiln::llm {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax)
  int32_t top_k = 0;         // keep the k most likely; 0: all
  float top_p = 1.0f;        // keep the smallest set whose probability reaches p
  float min_p = 0.0f;        // drop tokens below min_p x the most likely one's probability
  float repetition_penalty = 1.0f;  // > 1 discourages recent tokens (llama.cpp / CTRL style)
  float presence_penalty = 0.0f;    // OpenAI: - penalty once for a token seen
  float frequency_penalty = 0.0f;   // OpenAI: - penalty per occurrence
  int32_t penalty_last_n = 64;      // how many recent tokens the penalties look at; -1: all
  std::vector<std::pair<TokenId, float>> logit_bias;  // added to the logits (-100: ban)
  uint64_t seed = 0;
  int32_t top_logprobs = 0;  // also report this many most likely tokens
  // InvalidArgumentError naming the field for values outside their ranges.
  void validate(int32_t vocab_size) const;
};

struct TokenLogprob {
  TokenId token;
  float logprob;
};

struct Sample {
  TokenId token;
  float logprob;                  // of the chosen token
  std::vector<TokenLogprob> top;  // the top_logprobs most likely, most likely first
};

class Sampler {
 public:
  Sampler(SamplingParams params, int32_t vocab_size);
  // Picks a token from n_vocab logits (overwritten) given the tokens so far.
  Sample sample(std::span<float> logits, std::span<const TokenId> history);
  const SamplingParams& params() const { return params_; }

 private:
  double uniform();  // [0, 1), from the seeded generator
  SamplingParams params_;
  int32_t vocab_;
  uint64_t state_;
};

}  // namespace kiln::llm
