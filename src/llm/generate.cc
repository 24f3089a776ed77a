#include "kiln/llm/generate.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "kiln/core/error.h"

namespace kiln::llm {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Text held back while it may be the start of a stop string.
size_t stop_prefix_len(std::string_view text, const std::vector<std::string>& stop) {
  size_t keep = 0;
  for (const std::string& s : stop)
    for (size_t n = std::min(s.size() - 1, text.size()); n > keep; --n)
      if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
        keep = n;
        break;
      }
  return keep;
}
}  // namespace

TextOutput::TextOutput(const Tokenizer& tokenizer, std::vector<std::string> stop, bool ignore_eos)
    : tokenizer_(tokenizer), stop_(std::move(stop)), ignore_eos_(ignore_eos), stream_(tokenizer) {
  for (const std::string& s : stop_)
    if (s.empty()) throw InvalidArgumentError("stop strings must not be empty");
}

TextOutput::Step TextOutput::push(TokenId token) {
  Step r;
  if (!ignore_eos_ && tokenizer_.is_end_of_generation(token)) {
    r.stop = r.eog = true;
    return r;
  }
  pending_ += stream_.push(token);
  size_t hit = std::string::npos;
  for (const std::string& st : stop_) hit = std::min(hit, pending_.find(st));
  if (hit != std::string::npos) {
    r.text = pending_.substr(0, hit);
    pending_.clear();
    r.stop = true;
    return r;
  }
  const size_t n = pending_.size() - stop_prefix_len(pending_, stop_);
  r.text = pending_.substr(0, n);
  pending_.erase(0, n);
  return r;
}

std::string TextOutput::finish() {
  pending_ += stream_.finish();
  return std::move(pending_);
}

GenerateResult generate(const Model& model, std::string_view prompt, const GenerateOptions& options,
                        const std::function<bool(std::string_view)>& on_text) {
  return generate_tokens(model, model.tokenizer().encode(prompt, options.add_special, options.parse_special), options, on_text);
}

GenerateResult generate_tokens(const Model& model, std::vector<TokenId> prompt, const GenerateOptions& options,
                               const std::function<bool(std::string_view)>& on_text) {
  KvCacheOptions cache_options = options.cache;
  cache_options.max_tokens = std::max<int64_t>(cache_options.max_tokens, static_cast<int64_t>(prompt.size()) + options.max_tokens);
  KvCache cache = model.make_cache(cache_options);
  const KvCache::SeqId seq = cache.add_sequence();
  std::vector<TokenId> cached;
  return generate_in(model, cache, seq, cached, std::move(prompt), options, on_text);
}

GenerateResult generate_in(const Model& model, KvCache& cache, KvCache::SeqId seq, std::vector<TokenId>& cached,
                           std::vector<TokenId> prompt, const GenerateOptions& options,
                           const std::function<bool(std::string_view)>& on_text) {
  const ModelConfig& c = model.config();
  const Tokenizer& tok = model.tokenizer();
  if (prompt.empty()) throw InvalidArgumentError("the prompt has no tokens");
  if (options.max_tokens < 0) throw InvalidArgumentError("max_tokens must be >= 0");
  if (static_cast<int64_t>(cached.size()) != cache.length(seq))
    throw InvalidArgumentError("generate_in: `cached` must list the tokens the sequence holds");
  Sampler sampler(options.sampling, c.n_vocab);
  TextOutput out(tok, options.stop, options.ignore_eos);
  std::optional<JsonConstraint> json;
  if (options.json) json.emplace(std::make_shared<const JsonVocabulary>(tok), options.json);

  // Reuse the cached prefix the prompt shares (at least the last prompt token runs again,
  // for its logits).
  size_t reuse = 0;
  while (reuse < cached.size() && reuse + 1 < prompt.size() && cached[reuse] == prompt[reuse]) ++reuse;
  cache.truncate(seq, static_cast<int64_t>(reuse));
  cached.resize(reuse);

  GenerateResult r;
  r.prompt_tokens = prompt;
  r.reused_tokens = static_cast<int64_t>(reuse);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  auto t0 = Clock::now();
  const int64_t chunk = std::max<int64_t>(1, options.prefill_chunk);
  for (size_t at = reuse; at < prompt.size(); at += static_cast<size_t>(chunk)) {
    const size_t end = std::min(prompt.size(), at + static_cast<size_t>(chunk));
    std::vector<BatchToken> batch;
    for (size_t i = at; i < end; ++i) batch.push_back({seq, prompt[i], static_cast<int64_t>(i), i + 1 == prompt.size()});
    model.forward(batch, cache, logits.data());
    for (size_t i = at; i < end; ++i) cached.push_back(prompt[i]);
  }
  r.prompt_seconds = seconds_since(t0);

  std::vector<TokenId> history = prompt;
  bool cancelled = false;
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    r.text += piece;
    if (on_text && !on_text(piece)) cancelled = true;
  };
  t0 = Clock::now();
  r.finish_reason = "length";
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    if (json) json->mask(logits);
    Sample s = sampler.sample(logits, history);
    if (json) json->accept(s.token);
    TextOutput::Step step = out.push(s.token);
    if (!step.eog) {
      r.tokens.push_back(s.token);
      r.samples.push_back(s);
      history.push_back(s.token);
    }
    emit(step.text);
    if (step.stop) {
      r.finish_reason = "stop";
      break;
    }
    if (json && json->closed()) {  // the value closed: the text held back is final
      emit(out.finish());
      r.finish_reason = "stop";
      break;
    }
    if (cancelled) {
      r.finish_reason = "cancelled";
      break;
    }
    if (i + 1 == options.max_tokens) break;
    const BatchToken next{seq, s.token, cache.length(seq), true};
    model.forward(std::span<const BatchToken>(&next, 1), cache, logits.data());
    cached.push_back(s.token);
  }
  if (r.finish_reason == "length") emit(out.finish());
  r.decode_seconds = seconds_since(t0);
  return r;
}

}  // namespace kiln::llm
