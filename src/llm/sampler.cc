#include "kiln/llm/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "backends/cpu/vecmath.h"  // libmvec declarations: vector expf in omp simd loops
#include "kiln/core/error.h"

namespace kiln::llm {

using detail::str_cat;

namespace {

// The largest of x[0..n) (-inf for n = 0), 32 lanes at a time: std::max_element's
// compare-and-move chain cost ~70 us over a 49k vocabulary.
float max_of(const float* x, int32_t n) {
  __m256 m[4];
  for (__m256& v : m) v = _mm256_set1_ps(-INFINITY);
  int32_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) m[j] = _mm256_max_ps(m[j], _mm256_loadu_ps(x + i + 8 * j));
  const __m256 v = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
  float lanes[8];
  _mm256_storeu_ps(lanes, v);
  float r = -INFINITY;
  for (float l : lanes) r = std::max(r, l);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

}  // namespace

void SamplingParams::validate(int32_t vocab_size) const {
  auto bad = [](const char* field, double v, const char* want) {
    throw InvalidArgumentError(str_cat(field, " must be ", want, ", got ", v));
  };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) bad("temperature", temperature, ">= 0");
  if (top_k < 0) bad("top_k", top_k, ">= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", top_p, "in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", min_p, "in [0, 1]");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) bad("repetition_penalty", repetition_penalty, "> 0");
  if (!std::isfinite(presence_penalty)) bad("presence_penalty", presence_penalty, "finite");
  if (!std::isfinite(frequency_penalty)) bad("frequency_penalty", frequency_penalty, "finite");
  if (penalty_last_n < -1) bad("penalty_last_n", penalty_last_n, ">= -1");
  if (top_logprobs < 0 || top_logprobs > 20) bad("top_logprobs", top_logprobs, "in [0, 20]");
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size) throw InvalidArgumentError(str_cat("logit_bias: token id ", id, " is outside the vocabulary of ", vocab_size));
    if (!std::isfinite(bias)) throw InvalidArgumentError(str_cat("logit_bias of token ", id, " must be finite"));
  }
}

Sampler::Sampler(SamplingParams params, int32_t vocab_size) : params_(std::move(params)), vocab_(vocab_size) {
  params_.validate(vocab_size);
  state_ = params_.seed ^ 0x9E3779B97F4A7C15ULL;
}

// splitmix64: a portable, seedable stream (same draws on every platform and compiler).
double Sampler::uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

Sample Sampler::sample(std::span<float> logits, std::span<const TokenId> history) {
  if (static_cast<int32_t>(logits.size()) != vocab_)
    throw InvalidArgumentError(str_cat("sampler: ", logits.size(), " logits for a vocabulary of ", vocab_));
  const int32_t n = vocab_;
  // The model's log-probabilities, before any transformation: the normaliser from
  // libmvec's vector expf, summed in double (a scalar double exp per vocabulary entry
  // cost ~1 ms a token at 49k entries, on the serving engine's one thread).
  const float* lp = logits.data();
  const float mx = max_of(lp, n);
  double z = 0;
#pragma omp simd reduction(+ : z)
  for (int32_t i = 0; i < n; ++i) z += static_cast<double>(expf(lp[i] - mx));
  const float log_z = mx + static_cast<float>(std::log(z));
  auto logprob = [&](TokenId id, const std::vector<float>& raw) { return raw[id] - log_z; };
  const std::vector<float> raw(logits.begin(), logits.end());

  for (const auto& [id, bias] : params_.logit_bias) logits[id] += bias;
  const bool penalties = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (penalties && !history.empty()) {
    const size_t from = params_.penalty_last_n < 0 ? 0
                        : history.size() > static_cast<size_t>(params_.penalty_last_n) ? history.size() - params_.penalty_last_n
                                                                                        : 0;
    std::unordered_map<TokenId, int> count;
    for (size_t i = from; i < history.size(); ++i)
      if (history[i] >= 0 && history[i] < n) ++count[history[i]];
    for (const auto& [id, c] : count) {
      float& l = logits[id];
      if (params_.repetition_penalty != 1.0f) l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
      l -= static_cast<float>(c) * params_.frequency_penalty + params_.presence_penalty;
    }
  }

  Sample out{};
  if (params_.temperature == 0.0f) {
    // The first largest logit, as std::max_element; a NaN maximum falls back to it.
    const auto at = std::find(logits.begin(), logits.end(), max_of(logits.data(), n));
    out.token = static_cast<TokenId>((at != logits.end() ? at : std::max_element(logits.begin(), logits.end())) - logits.begin());
  } else {
    // Candidates sorted by logit (partially: top_k or all).
    std::vector<TokenId> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = params_.top_k > 0 ? std::min<size_t>(static_cast<size_t>(params_.top_k), idx.size()) : idx.size();
    auto by_logit = [&](TokenId a, TokenId b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), by_logit);
    idx.resize(k);
    std::vector<double> p(k);
    const double top = logits[idx[0]] / params_.temperature;
    double sum = 0;
    for (size_t i = 0; i < k; ++i) sum += (p[i] = std::exp(logits[idx[i]] / params_.temperature - top));
    size_t keep = k;
    if (params_.top_p < 1.0f) {
      double acc = 0;
      for (size_t i = 0; i < k; ++i) {
        acc += p[i] / sum;
        if (acc >= params_.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (params_.min_p > 0.0f) {
      size_t m = 0;
      while (m < keep && p[m] >= params_.min_p * p[0]) ++m;  // p[0] is the largest
      keep = std::max<size_t>(1, m);
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += p[i];
    double r = uniform() * total;
    size_t pick = keep - 1;
    for (size_t i = 0; i < keep; ++i) {
      if (r < p[i]) {
        pick = i;
        break;
      }
      r -= p[i];
    }
    out.token = idx[pick];
  }
  out.logprob = logprob(out.token, raw);
  if (params_.top_logprobs > 0) {
    std::vector<TokenId> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min<size_t>(static_cast<size_t>(params_.top_logprobs), idx.size());
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                      [&](TokenId a, TokenId b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
    for (size_t i = 0; i < k; ++i) out.top.push_back({idx[i], logprob(idx[i], raw)});
  }
  return out;
}

}  // namespace kiln::llm
