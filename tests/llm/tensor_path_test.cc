// The tensor path (ModelLoadOptions::device: the forward step from kiln ops, the way a
// language model runs on a GPU), on the CPU against the tiny models' exact float64
// logits and the CPU kernels, with batches that mix prompts, chunks and decode steps
// over several KV blocks, prefix sharing and copy-on-write; on CUDA (skipped without a
// GPU, with the reason) against the same references in bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/core/npy.h"
#include "kiln/llm/model.h"
#include "llm/llm_test_util.h"
#include "llm/tiny_model.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

ModelLoadOptions on(Device device, DType dtype) {
  ModelLoadOptions o;
  o.device = device;
  o.dtype = dtype;
  return o;
}

// The logits of every token asked for by `batch` steps run in order on one cache.
std::vector<float> run_steps(const Model& m, KvCache& cache, const std::vector<std::vector<BatchToken>>& steps) {
  const int64_t V = m.config().n_vocab;
  std::vector<float> all;
  for (const std::vector<BatchToken>& step : steps) {
    int64_t n = 0;
    for (const BatchToken& b : step) n += b.logits;
    std::vector<float> out(static_cast<size_t>(n * V));
    m.forward(step, cache, out.data());
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

// Every tiny model's first-step logits against the exact ones: closer than the CPU
// kernels (which quantise activations to 8 bits); only the f16 KV cache and float32
// rounding separate the tensor path from float64.
void expect_tiny_models_match(Device device, DType dtype, double min_cosine) {
  for (const testing::TinyModel& tm : testing::tiny_models()) {
    SCOPED_TRACE(tm.name + " on " + device.str());
    const std::shared_ptr<const Model> t = testing::load_tiny_model(tm, on(device, dtype));
    const std::shared_ptr<const Model> cpu = testing::load_tiny_model(tm);
    ASSERT_TRUE(t->tensor_path());
    ASSERT_EQ(t->device(), device);
    const std::vector<testing::OracleCase> cases = testing::oracle_cases("llm/tiny/prompts.inp", "llm/tiny/" + tm.name + ".greedy.txt");
    const Tensor exact = read_npy(kiln::testing::fixture("llm/tiny/" + tm.name + ".reference_logits.npy"));
    double worst = 1;
    for (size_t i = 0; i < cases.size(); ++i) {
      const int64_t row = static_cast<int64_t>(i);
      const std::vector<float> got = testing::prompt_logits(*t, cases[i].prompt_ids);
      const double c = testing::cosine(got, exact, row);
      const double c_cpu = testing::cosine(testing::prompt_logits(*cpu, cases[i].prompt_ids), exact, row);
      worst = std::min(worst, c);
      EXPECT_GE(c, min_cosine) << "prompt " << i << " max|diff| " << testing::max_abs_diff(got, exact, row);
      if (dtype == DType::kF32) {
        EXPECT_GE(c, c_cpu - 1e-6) << "prompt " << i << ": further from exact than the CPU kernels";
      }
    }
    std::printf("%s on %s (%s): worst cosine to the exact logits %.7f\n", tm.name.c_str(), device.str().c_str(),
                std::string(dtype_name(dtype)).c_str(), worst);
  }
}

TEST(LlmTensorPath, TinyModelsMatchTheExactLogitsOnTheCpu) {
  expect_tiny_models_match(Device::cpu(), DType::kF32, 0.99995);
}

// A step's batch mixes a prompt's second chunk that starts inside a block, a decode
// token and a new one-token prompt, over 4-position blocks: each sequence's logits are
// those of its tokens run alone in one go (float32 sums in another order: close, not
// bit-equal).
TEST(LlmTensorPath, MixedBatchesMatchEachSequenceAlone) {
  const testing::TinyModel tm = testing::tiny_models()[1];
  const std::shared_ptr<const Model> m = testing::load_tiny_model(tm, on(Device::cpu(), DType::kF32));
  const int64_t V = m->config().n_vocab;
  const std::vector<TokenId> a = {5, 17, 99, 3, 42, 7, 8, 61, 12, 30}, b = {9, 14, 2, 77, 6, 1, 33, 4, 18}, c = {23};
  KvCache cache = m->make_cache({64, 4});
  EXPECT_EQ(cache.layout(), KvLayout::kRows);
  const KvCache::SeqId sa = cache.add_sequence(), sb = cache.add_sequence(), sc = cache.add_sequence();
  auto tokens = [](KvCache::SeqId s, const std::vector<TokenId>& ids, int64_t from, int64_t to, bool last_logits) {
    std::vector<BatchToken> out;
    for (int64_t p = from; p < to; ++p) out.push_back({s, ids[static_cast<size_t>(p)], p, last_logits && p + 1 == to});
    return out;
  };
  std::vector<BatchToken> step2 = tokens(sa, a, 9, 10, true);                    // a: decode at 9
  for (const BatchToken& t : tokens(sb, b, 3, 9, true)) step2.push_back(t);      // b: positions 3..8 (blocks 0-2)
  for (const BatchToken& t : tokens(sc, c, 0, 1, true)) step2.push_back(t);      // c: a one-token prompt
  const std::vector<float> got = run_steps(*m, cache, {tokens(sa, a, 0, 6, false), [&] {
                                                         std::vector<BatchToken> s = tokens(sa, a, 6, 9, false);
                                                         for (const BatchToken& t : tokens(sb, b, 0, 3, false)) s.push_back(t);
                                                         return s;
                                                       }(),
                                                       step2});
  ASSERT_EQ(got.size(), static_cast<size_t>(3 * V));
  int k = 0;
  for (const std::vector<TokenId>* ids : {&a, &b, &c}) {
    const std::vector<float> alone = testing::prompt_logits(*m, *ids);
    const Tensor want = Tensor::from_vector(alone, {V});
    const Tensor have = Tensor::from_vector(std::vector<float>(got.begin() + k * V, got.begin() + (k + 1) * V), {V});
    EXPECT_TRUE(allclose(have, want, 1e-4, 1e-4)) << "sequence " << k << ": " << describe_mismatch(have, want, 1e-4, 1e-4);
    ++k;
  }
  for (KvCache::SeqId s : {sa, sb, sc}) cache.remove_sequence(s);
  EXPECT_EQ(cache.used_blocks(), 0);
}

// Prefix caching on the device's pool: a second sequence attaches the first one's
// published blocks and continues past them; cutting it inside a shared block copies the
// block (copy-on-write on the device); both give the logits of fresh runs.
TEST(LlmTensorPath, SharedPrefixesAndCopyOnWrite) {
  const std::shared_ptr<const Model> m = testing::load_tiny_model(testing::tiny_models()[4], on(Device::cpu(), DType::kF32));
  const int64_t V = m->config().n_vocab;
  std::vector<TokenId> first = {4, 8, 15, 16, 23, 42, 11, 9, 70, 3, 5, 6}, second = first;
  second.resize(8);
  for (TokenId t : {31, 32, 33}) second.push_back(t);
  KvCache cache = m->make_cache({64, 4});
  auto prompt = [](KvCache::SeqId s, const std::vector<TokenId>& ids, int64_t from) {
    std::vector<BatchToken> out;
    for (size_t p = static_cast<size_t>(from); p < ids.size(); ++p) out.push_back({s, ids[p], static_cast<int64_t>(p), p + 1 == ids.size()});
    return out;
  };
  const KvCache::SeqId s1 = cache.add_sequence();
  run_steps(*m, cache, {prompt(s1, first, 0)});
  cache.publish(s1, first);
  const KvCache::SeqId s2 = cache.add_sequence();
  ASSERT_EQ(cache.attach_prefix(s2, second), 8);  // two shared blocks of 4
  auto close_to_fresh = [&](const std::vector<float>& got, const std::vector<TokenId>& ids) {
    const Tensor have = Tensor::from_vector(got, {V}), want = Tensor::from_vector(testing::prompt_logits(*m, ids), {V});
    EXPECT_TRUE(allclose(have, want, 1e-4, 1e-4)) << describe_mismatch(have, want, 1e-4, 1e-4);
  };
  close_to_fresh(run_steps(*m, cache, {prompt(s2, second, 8)}), second);
  // Back to 6 positions: block 1 is shared with s1, so s2 gets a copy of it.
  cache.truncate(s2, 6);
  std::vector<TokenId> third(second.begin(), second.begin() + 6);
  for (TokenId t : {50, 51}) third.push_back(t);
  close_to_fresh(run_steps(*m, cache, {prompt(s2, third, 6)}), third);
  // s1's blocks were not touched.
  std::vector<TokenId> longer = first;
  longer.push_back(13);
  close_to_fresh(run_steps(*m, cache, {{BatchToken{s1, 13, 12, true}}}), longer);
}

TEST(LlmTensorPath, BadOptionsAndForeignCachesAreTypedErrors) {
  const testing::TinyModel tm = testing::tiny_models()[0];
  EXPECT_THROW(testing::load_tiny_model(tm, on(Device::cpu(), DType::kI32)), InvalidArgumentError);
  Backend* cuda = find_backend(DeviceType::kCUDA);
  if (cuda == nullptr || cuda->device_count() == 0) {
    EXPECT_THROW(testing::load_tiny_model(tm, on(Device{DeviceType::kCUDA, 0}, DType::kBF16)), NotFoundError);
  }
  const std::shared_ptr<const Model> t = testing::load_tiny_model(tm, on(Device::cpu(), DType::kF32));
  const std::shared_ptr<const Model> cpu = testing::load_tiny_model(tm);
  KvCache native = cpu->make_cache({16, 4}), rows = t->make_cache({16, 4});
  const BatchToken b0{native.add_sequence(), 1, 0, true}, b1{rows.add_sequence(), 1, 0, true};
  std::vector<float> logits(static_cast<size_t>(t->config().n_vocab));
  EXPECT_THROW(t->forward(std::span<const BatchToken>(&b0, 1), native, logits.data()), InvalidArgumentError);
  EXPECT_THROW(cpu->forward(std::span<const BatchToken>(&b1, 1), rows, logits.data()), InvalidArgumentError);
  EXPECT_EQ(native.length(b0.seq), 0);
  EXPECT_EQ(rows.length(b1.seq), 0);
  EXPECT_THROW(rows.store_key(b1.seq, 0, 0, logits.data()), InternalError);
  EXPECT_THROW(native.layer_rows(0, 0), InternalError);
}

// SmolLM2 on the tensor path: first-step logits close to the exact ones, greedy
// continuations equal to llama.cpp's but where its top two logits are within max_gap.
void expect_smollm2_matches(Device device, DType dtype, double min_cosine, float max_gap, size_t prompts) {
  const std::shared_ptr<const Model> m = Model::load(testing::smollm2_path(), on(device, dtype));
  std::vector<testing::OracleCase> cases = testing::oracle_cases("llm/smollm2.prompts.inp", "llm/smollm2.greedy.txt");
  const Tensor exact = read_npy(kiln::testing::fixture("llm/smollm2.reference_logits.npy"));
  cases.resize(std::min(cases.size(), prompts));
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<float> got = testing::prompt_logits(*m, cases[i].prompt_ids);
    const double c = testing::cosine(got, exact, static_cast<int64_t>(i));
    std::printf("smollm2 on %s (%s) prompt %zu: cosine to exact %.6f max|diff| %.4f\n", device.str().c_str(), std::string(dtype_name(dtype)).c_str(), i, c,
                testing::max_abs_diff(got, exact, static_cast<int64_t>(i)));
    EXPECT_GE(c, min_cosine) << "prompt " << i;
    const testing::GreedyComparison g = testing::compare_greedy(*m, cases[i]);
    if (g.diverges_at < cases[i].greedy.size()) {
      EXPECT_LT(cases[i].gaps[g.diverges_at], max_gap) << "prompt " << i << " leaves llama.cpp's path at step " << g.diverges_at;
    }
  }
}

TEST(LlmTensorPath, SmolLM2OnTheCpu) { expect_smollm2_matches(Device::cpu(), DType::kF32, 0.9995, 0.5f, kiln::testing::kSanitized ? 1 : 3); }

bool have_gpu() {
  Backend* b = find_backend(DeviceType::kCUDA);
  return b != nullptr && b->device_count() > 0;
}
std::string no_gpu_reason() {
  Backend* b = find_backend(DeviceType::kCUDA);
  return b == nullptr ? "no CUDA backend: " + backend_unavailable_reason(DeviceType::kCUDA) : "no CUDA device: " + b->no_device_reason();
}

TEST(LlmTensorPath, TinyModelsOnCuda) {
  if (!have_gpu()) GTEST_SKIP() << no_gpu_reason();
  expect_tiny_models_match(Device{DeviceType::kCUDA, 0}, DType::kF32, 0.9999);
  expect_tiny_models_match(Device{DeviceType::kCUDA, 0}, DType::kBF16, 0.999);
}

TEST(LlmTensorPath, SmolLM2OnCuda) {
  if (!have_gpu()) GTEST_SKIP() << no_gpu_reason();
  expect_smollm2_matches(Device{DeviceType::kCUDA, 0}, DType::kF16, 0.999, 0.5f, 10);
  // bf16 rounds every weight to 8 significant bits: further from exact, near ties wider.
  expect_smollm2_matches(Device{DeviceType::kCUDA, 0}, DType::kBF16, 0.995, 1.0f, 10);
}

}  // namespace
}  // namespace kiln::llm
