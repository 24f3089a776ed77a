#pragma once
// Perplexity of a model on a text, computed as llama.cpp's llama-perplexity does (so
// the two compare): the text is tokenized (BOS as the model asks), cut into chunks of
// n_ctx tokens (a trailing partial chunk is dropped; with BOS, each chunk's first token
// becomes BOS), each chunk runs from an empty cache, and only the second half of each
// chunk is scored (every scored token has n_ctx/2 tokens of context).
#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/llm/model.h"

namespace kiln::llm {

struct PerplexityResult {
  double perplexity = 0;       // exp(mean negative log-likelihood)
  double nll_stddev = 0;       // standard error of the mean NLL (llama.cpp's +/- is ppl x this)
  int64_t chunks = 0, scored_tokens = 0, text_tokens = 0;
  std::vector<double> running;  // perplexity after each chunk (llama.cpp's [1]..., [2]...)
  double seconds = 0;
};

// InvalidArgumentError when n_ctx < 4 or the text has fewer than n_ctx tokens.
// max_chunks < 0: every whole chunk.
PerplexityResult perplexity(const Model& model, std::string_view text, int64_t n_ctx = 512, int64_t max_chunks = -1);

}  // namespace kiln::llm
