// The llama-family runtime against llama.cpp on the real SmolLM2-135M-Instruct (Q4_1 +
// Q8_0): first-step logits, 64-token greedy continuations (fixtures from
// bench/peers/make_llm_fixtures.py), batch independence, the ISA paths, bad input.
#include "kiln/llm/model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/npy.h"
#include "kiln/core/tensor.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/perplexity.h"
#include "llm/llm_test_util.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

using testing::cosine;
using testing::max_abs_diff;
using testing::OracleCase;
using testing::prompt_logits;

std::vector<OracleCase> oracle_cases() { return testing::oracle_cases("llm/smollm2.prompts.inp", "llm/smollm2.greedy.txt"); }

const Model& smollm2() {
  static const std::shared_ptr<const Model> m = Model::load(testing::smollm2_path());
  return *m;
}

// First-step logits against two references: a float64 NumPy forward pass over the gguf
// package's dequantised weights (exact), and llama.cpp. llama.cpp itself is only
// 0.984-0.99996 (cosine) from the exact logits on these prompts (it rounds queries and
// attention weights to f16; both quantise activations to 8 bits, where the difference
// from the exact logits comes from, and a short prompt's logits amplify it: compiler
// flags alone move kiln's prompt-5 cosine between 0.994 and 0.998). kiln must be as
// close to the exact logits as llama.cpp on average, and on every prompt at least
// min(0.997, llama.cpp's cosine) - 5e-4 to them and 0.98 to llama.cpp's.
TEST(LlmModel, FirstStepLogitsMatchReferenceAndLlamaCpp) {
  const Model& m = smollm2();
  const std::vector<OracleCase> cases = oracle_cases();
  ASSERT_GE(cases.size(), 10u);
  const Tensor llama = read_npy(kiln::testing::fixture("llm/smollm2.logits.npy"));
  const Tensor exact = read_npy(kiln::testing::fixture("llm/smollm2.reference_logits.npy"));
  ASSERT_EQ(llama.numel(), static_cast<int64_t>(cases.size()) * m.config().n_vocab);
  ASSERT_EQ(exact.numel(), llama.numel());
  double sum_kiln = 0, sum_llama = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<TokenId> ids = m.tokenizer().encode(cases[i].prompt, true, true);
    ASSERT_EQ(ids, cases[i].prompt_ids) << "prompt " << i;
    const std::vector<float> got = prompt_logits(m, ids);
    const int64_t row = static_cast<int64_t>(i);
    const double c_exact = cosine(got, exact, row), c_llama = cosine(got, llama, row);
    // llama.cpp against the exact logits, from the two fixtures.
    std::vector<float> llama_row(got.size());
    for (size_t v = 0; v < got.size(); ++v) llama_row[v] = static_cast<float>(llama.get_double(row * m.config().n_vocab + v));
    const double c_llama_exact = cosine(llama_row, exact, row);
    std::printf("prompt %2zu (%2zu tokens): kiln vs exact cosine %.6f max|diff| %.3f | kiln vs llama.cpp %.6f max|diff| %.3f | "
                "llama.cpp vs exact %.6f\n",
                i, ids.size(), c_exact, max_abs_diff(got, exact, row), c_llama, max_abs_diff(got, llama, row), c_llama_exact);
    EXPECT_GE(c_exact, std::min(0.997, c_llama_exact) - 5e-4) << "prompt " << i << ": kiln is further from the exact logits than llama.cpp";
    EXPECT_GE(c_llama, 0.98) << "prompt " << i;
    sum_kiln += c_exact, sum_llama += c_llama_exact;
  }
  std::printf("mean cosine to the exact logits: kiln %.6f, llama.cpp %.6f\n", sum_kiln / cases.size(), sum_llama / cases.size());
  EXPECT_GE(sum_kiln, sum_llama);
}

// Greedy continuations are llama.cpp's, except where llama.cpp's own top two logits were
// within 0.5 at the step where they part: llama.cpp's logits are up to 1.7 away from the
// exact ones on these prompts (test above), so it cannot rank two tokens that close.
TEST(LlmModel, GreedyContinuationsMatchLlamaCpp) {
  const Model& m = smollm2();
  int identical = 0, close_calls = 0;
  std::vector<OracleCase> cases = oracle_cases();
  if (kiln::testing::kSanitized) cases.resize(2);  // the same path per prompt: two under the sanitizers
  for (const OracleCase& c : cases) {
    const testing::GreedyComparison g = testing::compare_greedy(m, c);
    ASSERT_EQ(g.tokens.size(), c.greedy.size());
    const size_t i = g.diverges_at;
    if (i == c.greedy.size()) {
      ++identical;
      continue;
    }
    std::printf("diverges at step %zu of %zu: kiln %d, llama.cpp %d (llama.cpp's top-2 gap %.4f)\n", i, c.greedy.size(),
                g.tokens[i], c.greedy[i], c.gaps[i]);
    EXPECT_LT(c.gaps[i], 0.5f) << "kiln left llama.cpp's greedy path at step " << i << " where llama.cpp was sure";
    ++close_calls;
  }
  std::printf("%d of %d continuations identical for 64 tokens, %d part at a near tie\n", identical, identical + close_calls,
              close_calls);
}

// A sequence's logits do not depend on what else is in the batch: the same prompts run
// alone and together (at different positions) give bit-identical logits.
TEST(LlmModel, BatchedSequencesAreIndependent) {
  const Model& m = smollm2();
  const std::vector<OracleCase> cases = oracle_cases();
  const int64_t V = m.config().n_vocab;
  KvCache cache = m.make_cache({1024, 16});
  std::vector<KvCache::SeqId> seqs;
  std::vector<BatchToken> batch;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(cache.add_sequence());
    const std::vector<TokenId>& ids = cases[i].prompt_ids;
    for (size_t p = 0; p < ids.size(); ++p) batch.push_back({seqs[i], ids[p], static_cast<int64_t>(p), p + 1 == ids.size()});
  }
  std::vector<float> together(static_cast<size_t>(3 * V));
  m.forward(batch, cache, together.data());
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> alone = prompt_logits(m, cases[i].prompt_ids);
    EXPECT_EQ(0, std::memcmp(alone.data(), together.data() + i * V, V * sizeof(float))) << "sequence " << i;
  }
  // One decode step of all three together equals each alone.
  std::vector<BatchToken> step;
  for (int i = 0; i < 3; ++i) step.push_back({seqs[i], 42, cache.length(seqs[i]), true});
  m.forward(step, cache, together.data());
  for (int i = 0; i < 3; ++i) {
    std::vector<TokenId> ids = cases[i].prompt_ids;
    ids.push_back(42);
    const std::vector<float> alone = prompt_logits(m, ids);
    double max_abs = 0;
    for (int64_t v = 0; v < V; ++v) max_abs = std::max<double>(max_abs, std::fabs(alone[v] - together[i * V + v]));
    EXPECT_EQ(max_abs, 0.0) << "sequence " << i;
  }
}

// Attention reads the cache block by block, padded to 16 lanes: any block size gives the
// logits of 16-position blocks, bit for bit (8: padded blocks; 24: two lane groups, one
// half empty; 5: odd).
TEST(LlmModel, KvBlockSizesGiveIdenticalLogits) {
  const Model& m = smollm2();
  std::vector<TokenId> ids = oracle_cases()[1].prompt_ids;
  while (ids.size() < 40) ids.insert(ids.end(), ids.begin(), ids.end());
  const int64_t V = m.config().n_vocab;
  auto logits = [&](int64_t block_tokens) {
    KvCache cache = m.make_cache({static_cast<int64_t>(ids.size()) + 48, block_tokens});
    const KvCache::SeqId s = cache.add_sequence();
    std::vector<BatchToken> batch;
    for (size_t p = 0; p < ids.size(); ++p) batch.push_back({s, ids[p], static_cast<int64_t>(p), p + 1 == ids.size()});
    std::vector<float> out(static_cast<size_t>(V));
    m.forward(batch, cache, out.data());
    return out;
  };
  const std::vector<float> base = logits(16);
  for (int64_t bs : {8, 24, 5}) EXPECT_EQ(0, std::memcmp(base.data(), logits(bs).data(), V * sizeof(float))) << bs;
}

// The AVX2, AVX-512 VNNI and AMX integer kernels compute the same integer sums: identical
// logits (the prompt's 20+ tokens run on AMX's 16-token tiles where the CPU has them).
TEST(LlmModel, IsaPathsAgree) {
  const CpuIsa found = cpu_isa();
  if (found < CpuIsa::kAvx512Vnni)
    GTEST_SKIP() << "this CPU has no AVX-512 VNNI (" << cpu_isa_name(detected_cpu_isa()) << "): only the AVX2 path runs here";
  const Model& m = smollm2();
  std::vector<TokenId> ids = oracle_cases()[0].prompt_ids;
  while (ids.size() < 20) ids.insert(ids.end(), ids.begin(), ids.end());
  const std::vector<float> best = prompt_logits(m, ids);
  for (CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx512Vnni}) {
    set_cpu_isa_cap(level);
    const std::vector<float> got = prompt_logits(m, ids);
    set_cpu_isa_cap(found);
    EXPECT_EQ(0, std::memcmp(best.data(), got.data(), best.size() * sizeof(float))) << cpu_isa_name(level);
  }
  if (found < CpuIsa::kAmx) std::printf("AMX path not run: kiln runs %s here\n", cpu_isa_name(found));
}

// A conversation's second turn reuses the first turn's cache and gives what a fresh run
// of the whole prompt gives (greedy: identical tokens).
TEST(LlmModel, GenerateInReusesTheCachedPrefix) {
  const Model& m = smollm2();
  GenerateOptions o;
  o.max_tokens = 12;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  KvCache cache = m.make_cache({512, 16});
  const KvCache::SeqId s = cache.add_sequence();
  std::vector<TokenId> cached;
  const std::vector<TokenId> first = oracle_cases()[0].prompt_ids;
  const GenerateResult r1 = generate_in(m, cache, s, cached, first, o);
  EXPECT_EQ(r1.reused_tokens, 0);
  EXPECT_EQ(static_cast<int64_t>(cached.size()), cache.length(s));
  std::vector<TokenId> second = first;
  second.insert(second.end(), r1.tokens.begin(), r1.tokens.end());
  for (TokenId t : m.tokenizer().encode("<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n", false, true))
    second.push_back(t);
  const GenerateResult r2 = generate_in(m, cache, s, cached, second, o);
  EXPECT_GE(r2.reused_tokens, static_cast<int64_t>(first.size()));
  const GenerateResult fresh = generate_tokens(m, second, o);
  EXPECT_EQ(r2.tokens, fresh.tokens);
}

// Perplexity on Debian's GPL-3 text, 2 chunks of 512 tokens, as llama-perplexity computes
// it (its value in the fixture): within 2%. (The whole 23k-token five-licence text:
// kiln 14.999, llama.cpp 15.023; docs/benchmarks.md.)
TEST(LlmModel, PerplexityMatchesLlamaCpp) {
  const Model& m = smollm2();
  if (kiln::testing::kSanitized) {  // the path once, on one short chunk; the figure in the default preset
    const PerplexityResult r = perplexity(m, read_file("/usr/share/common-licenses/GPL-3"), 128, 1);
    EXPECT_EQ(r.chunks, 1);
    EXPECT_EQ(r.scored_tokens, 63);
    EXPECT_GT(r.perplexity, 1.0);
    EXPECT_LT(r.perplexity, 1000.0);
    return;
  }
  const double llama = std::stod(read_file(kiln::testing::fixture("llm/smollm2.perplexity.txt")));
  const PerplexityResult r = perplexity(m, read_file("/usr/share/common-licenses/GPL-3"), 512, 2);
  EXPECT_EQ(r.chunks, 2);
  EXPECT_EQ(r.scored_tokens, 2 * 255);
  EXPECT_GT(r.text_tokens, 7000);
  std::printf("perplexity: kiln %.4f, llama.cpp %.4f (%+.2f%%)\n", r.perplexity, llama, 100 * (r.perplexity / llama - 1));
  EXPECT_NEAR(r.perplexity, llama, 0.02 * llama);
  EXPECT_THROW(perplexity(m, "too short", 512), InvalidArgumentError);
}

TEST(LlmModel, BadBatchesAreTypedErrorsAndChangeNothing) {
  const Model& m = smollm2();
  KvCache cache = m.make_cache({32, 16});
  const KvCache::SeqId s = cache.add_sequence();
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  auto one = [&](TokenId tok, int64_t pos) {
    const BatchToken b{s, tok, pos, true};
    m.forward(std::span<const BatchToken>(&b, 1), cache, logits.data());
  };
  EXPECT_THROW(one(49152, 0), InvalidArgumentError);
  EXPECT_THROW(one(-3, 0), InvalidArgumentError);
  EXPECT_THROW(one(1, 5), InvalidArgumentError);  // the sequence has 0 positions
  EXPECT_EQ(cache.length(s), 0);
  std::vector<BatchToken> big;
  for (int64_t p = 0; p < 40; ++p) big.push_back({s, 1, p, false});
  EXPECT_THROW(m.forward(big, cache, logits.data()), ResourceExhaustedError);  // 40 > 32 positions
  EXPECT_EQ(cache.length(s), 0);
  EXPECT_EQ(cache.free_blocks(), cache.total_blocks());
  one(1, 0);
  EXPECT_EQ(cache.length(s), 1);
  const BatchToken unknown{77, 1, 0, false};
  EXPECT_THROW(m.forward(std::span<const BatchToken>(&unknown, 1), cache, logits.data()), NotFoundError);
  cache.remove_sequence(s);
  EXPECT_EQ(cache.free_blocks(), cache.total_blocks());
  EXPECT_THROW(Model::load("/nonexistent.gguf"), NotFoundError);
}

}  // namespace
}  // namespace kiln::llm
