#include "kiln/llm/perplexity.h"

#include <chrono>
#include <cmath>

#include "kiln/core/error.h"

namespace kiln::llm {

PerplexityResult perplexity(const Model& model, std::string_view text, int64_t n_ctx, int64_t max_chunks) {
  if (n_ctx < 4) throw InvalidArgumentError(detail::str_cat("perplexity: n_ctx must be >= 4, got ", n_ctx));
  const Tokenizer& tok = model.tokenizer();
  const std::vector<TokenId> tokens = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
  PerplexityResult r;
  r.text_tokens = static_cast<int64_t>(tokens.size());
  int64_t n_chunk = r.text_tokens / n_ctx;
  if (max_chunks >= 0) n_chunk = std::min(n_chunk, max_chunks);
  if (n_chunk < 1)
    throw InvalidArgumentError(detail::str_cat("perplexity: the text has ", tokens.size(), " tokens, fewer than one chunk of ", n_ctx));
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t first = n_ctx / 2, V = model.config().n_vocab;
  KvCache cache = model.make_cache({n_ctx, 16});
  std::vector<float> logits(static_cast<size_t>((n_ctx - first - 1) * V));
  double nll = 0, nll2 = 0;
  for (int64_t c = 0; c < n_chunk; ++c) {
    const KvCache::SeqId seq = cache.add_sequence();
    std::vector<BatchToken> batch;
    for (int64_t j = 0; j < n_ctx; ++j) {
      TokenId t = tokens[static_cast<size_t>(c * n_ctx + j)];
      if (j == 0 && tok.add_bos()) t = *tok.bos();
      batch.push_back({seq, t, j, j >= first && j < n_ctx - 1});
    }
    model.forward(batch, cache, logits.data());
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const float* l = logits.data() + (j - first) * V;
      float mx = l[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, l[v]);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(l[v] - mx));
      const TokenId next = tokens[static_cast<size_t>(c * n_ctx + j + 1)];
      const double lp = static_cast<double>(l[next] - mx) - std::log(z);
      nll -= lp;
      nll2 += lp * lp;
      ++r.scored_tokens;
    }
    cache.remove_sequence(seq);
    r.running.push_back(std::exp(nll / static_cast<double>(r.scored_tokens)));
  }
  r.chunks = n_chunk;
  const double n = static_cast<double>(r.scored_tokens), mean = nll / n;
  const double var = nll2 / n - mean * mean;
  r.nll_stddev = var > 0 && n > 1 ? std::sqrt(var / (n - 1)) : 0;
  r.perplexity = std::exp(mean);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kiln::llm
