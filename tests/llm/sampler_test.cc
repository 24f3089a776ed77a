// The sampler on hand-made logits: greedy, bans, penalties, truncations (top-k/top-p/
// min-p), seeded reproducibility, the sampled distribution, log-probabilities, bad input.
#include "kiln/llm/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kiln/core/error.h"

namespace kiln::llm {
namespace {

std::vector<float> logits4() { return {2.0f, 1.0f, 0.5f, -1.0f}; }

TokenId pick(SamplingParams p, std::vector<float> l, std::vector<TokenId> history = {}) {
  Sampler s(std::move(p), static_cast<int32_t>(l.size()));
  return s.sample(l, history).token;
}

TEST(Sampler, GreedyBiasAndPenalties) {
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(pick(greedy, logits4()), 0);
  SamplingParams ban = greedy;
  ban.logit_bias = {{0, -100.0f}};
  EXPECT_EQ(pick(ban, logits4()), 1);
  SamplingParams rep = greedy;
  rep.repetition_penalty = 2.5f;  // 2.0 / 2.5 = 0.8 < 1.0
  EXPECT_EQ(pick(rep, logits4(), {0}), 1);
  EXPECT_EQ(pick(rep, logits4(), {3}), 0);  // an unseen winner is untouched
  SamplingParams freq = greedy;
  freq.frequency_penalty = 0.6f;  // seen twice: 2.0 - 1.2 = 0.8
  EXPECT_EQ(pick(freq, logits4(), {0, 0}), 1);
  EXPECT_EQ(pick(freq, logits4(), {0}), 0);  // once: 1.4 > 1.0
  SamplingParams pres = greedy;
  pres.presence_penalty = 1.5f;  // once per seen token, whatever the count
  EXPECT_EQ(pick(pres, logits4(), {0, 0, 0}), 1);
  pres.penalty_last_n = 1;  // only the last token counts
  EXPECT_EQ(pick(pres, logits4(), {0, 2}), 0);
}

TEST(Sampler, TruncationsKeepOnlyTheLikelyTokens) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams k1;
    k1.top_k = 1;
    k1.seed = seed;
    EXPECT_EQ(pick(k1, logits4()), 0);
    SamplingParams p;
    p.top_p = 0.5f;  // token 0 alone has probability 0.61
    p.seed = seed;
    EXPECT_EQ(pick(p, logits4()), 0);
    SamplingParams m;
    m.min_p = 0.3f;  // keeps 0 (1.0) and 1 (0.37), drops 2 (0.22) and 3 (0.05)
    m.seed = seed;
    EXPECT_LE(pick(m, logits4()), 1);
  }
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  SamplingParams p;
  p.seed = 42;
  Sampler a(p, 4), b(p, 4);
  p.seed = 43;
  Sampler c(p, 4);
  int differ = 0;
  std::map<TokenId, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> la = logits4(), lb = logits4(), lc = logits4();
    const TokenId ta = a.sample(la, {}).token;
    EXPECT_EQ(ta, b.sample(lb, {}).token);
    differ += ta != c.sample(lc, {}).token;
    ++counts[ta];
  }
  EXPECT_GT(differ, n / 10);
  // Softmax of {2, 1, 0.5, -1}: 0.6103, 0.2245, 0.1362, 0.0304. 4 sigma of a binomial.
  const double expect[4] = {0.6103, 0.2245, 0.1362, 0.0304};
  for (TokenId t = 0; t < 4; ++t) {
    const double sd = std::sqrt(n * expect[t] * (1 - expect[t]));
    EXPECT_NEAR(counts[t], n * expect[t], 4 * sd) << "token " << t;
  }
  // Temperature 0.5 sharpens: token 0 far more often.
  SamplingParams cold;
  cold.temperature = 0.5f;
  Sampler s(cold, 4);
  int zeros = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> l = logits4();
    zeros += s.sample(l, {}).token == 0;
  }
  EXPECT_GT(zeros, 2000 * 0.75);  // p0 = e^4 / (e^4 + e^2 + e + e^-2) = 0.83
}

TEST(Sampler, LogprobsAreTheModels) {
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 3;
  p.logit_bias = {{1, 5.0f}};  // changes the choice, not the reported log-probabilities
  Sampler s(p, 4);
  std::vector<float> l = logits4();
  const Sample out = s.sample(l, {});
  EXPECT_EQ(out.token, 1);
  const double z = std::log(std::exp(2.0) + std::exp(1.0) + std::exp(0.5) + std::exp(-1.0));
  EXPECT_NEAR(out.logprob, 1.0 - z, 1e-5);
  ASSERT_EQ(out.top.size(), 3u);
  EXPECT_EQ(out.top[0].token, 0);
  EXPECT_NEAR(out.top[0].logprob, 2.0 - z, 1e-5);
  EXPECT_EQ(out.top[1].token, 1);
  EXPECT_EQ(out.top[2].token, 2);
}

TEST(Sampler, BadParametersAreTypedErrors) {
  auto bad = [](SamplingParams p) { EXPECT_THROW(Sampler(p, 4), InvalidArgumentError); };
  SamplingParams p;
  p.temperature = -1;
  bad(p);
  p = {};
  p.top_p = 0;
  bad(p);
  p = {};
  p.min_p = 1.5f;
  bad(p);
  p = {};
  p.top_k = -2;
  bad(p);
  p = {};
  p.logit_bias = {{4, 1.0f}};
  bad(p);
  p = {};
  p.top_logprobs = 50;
  bad(p);
  p = {};
  p.repetition_penalty = 0;
  bad(p);
  Sampler s(SamplingParams{}, 4);
  std::vector<float> three = {1, 2, 3};
  EXPECT_THROW(s.sample(three, {}), InvalidArgumentError);
}

}  // namespace
}  // namespace kiln::llm
