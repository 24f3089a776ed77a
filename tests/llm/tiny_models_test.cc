// Tiny random-weight models of every GGUF tensor type (tests/llm/tiny_model.h: F32, F16,
// BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; llama, llama with Llama 3's rope
// frequency factors, qwen2, qwen3, phi3, gemma2, gemma3; SentencePiece and
// byte-level BPE tokenizers; tied and separate heads) against llama.cpp on the same
// files (fixtures from `bench/peers/make_llm_fixtures.py tiny`): the prompts' token ids
// exactly; the first-step logits against llama.cpp's and against a float64 NumPy forward
// pass over the gguf package's dequantised weights (exact); 16-token greedy
// continuations identical to llama.cpp's, except where llama.cpp's own top two logits at
// the step where they part are within 0.1, or within the two implementations' distances
// from the exact logits added (two approximations that far from the truth may rank two
// tokens that close either way; the random q6_K model's logits are 0.3-0.5 from exact in
// llama.cpp, 0.15-0.4 in kiln).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include "kiln/core/npy.h"
#include "kiln/llm/gguf.h"
#include "kiln/llm/model.h"
#include "llm/llm_test_util.h"
#include "llm/tiny_model.h"
#include "test_util.h"

namespace kiln::llm {
namespace testing {
void PrintTo(const TinyModel& m, std::ostream* os) { *os << m.name; }  // (gtest's name for a failing case)
}  // namespace testing
namespace {

class TinyModels : public ::testing::TestWithParam<testing::TinyModel> {};

TEST_P(TinyModels, MatchLlamaCpp) {
  const testing::TinyModel& tm = GetParam();
  const std::shared_ptr<const Model> model = testing::load_tiny_model(tm);
  const Model& m = *model;
  EXPECT_EQ(m.config().architecture, tm.arch);
  EXPECT_EQ(m.config().tied_output, tm.tied);
  const std::vector<testing::OracleCase> cases =
      testing::oracle_cases("llm/tiny/prompts.inp", "llm/tiny/" + tm.name + ".greedy.txt");
  const Tensor llama = read_npy(kiln::testing::fixture("llm/tiny/" + tm.name + ".logits.npy"));
  const Tensor exact = read_npy(kiln::testing::fixture("llm/tiny/" + tm.name + ".reference_logits.npy"));
  ASSERT_EQ(llama.numel(), static_cast<int64_t>(cases.size()) * m.config().n_vocab);
  ASSERT_EQ(exact.numel(), llama.numel());
  int identical = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "prompt " << i);
    const testing::OracleCase& c = cases[i];
    const std::vector<TokenId> ids = m.tokenizer().encode(c.prompt, true, true);
    ASSERT_EQ(ids, c.prompt_ids);
    const int64_t row = static_cast<int64_t>(i);
    const std::vector<float> got = testing::prompt_logits(m, ids);
    std::vector<float> llama_row(got.size());
    for (size_t v = 0; v < got.size(); ++v) llama_row[v] = static_cast<float>(llama.get_double(row * m.config().n_vocab + v));
    const double c_exact = testing::cosine(got, exact, row), c_llama = testing::cosine(got, llama, row);
    const double c_llama_exact = testing::cosine(llama_row, exact, row);
    const double llama_error = testing::max_abs_diff(llama_row, exact, row);
    const double kiln_error = testing::max_abs_diff(got, exact, row);
    std::printf("%s prompt %zu (%zu tokens): kiln vs exact cosine %.6f max|diff| %.4f | kiln vs llama.cpp %.6f | "
                "llama.cpp vs exact %.6f max|diff| %.4f\n",
                tm.name.c_str(), i, ids.size(), c_exact, kiln_error, c_llama, c_llama_exact, llama_error);
    // As close to the exact logits as llama.cpp (both quantise activations to 8 bits for
    // the integer types), and close to llama.cpp's.
    EXPECT_GE(c_exact, std::min(0.9999, c_llama_exact) - 2e-4);
    EXPECT_GE(c_llama, 0.995);
    const testing::GreedyComparison g = testing::compare_greedy(m, c);
    ASSERT_EQ(g.tokens.size(), c.greedy.size());
    const size_t step = g.diverges_at;
    if (step == c.greedy.size()) {
      ++identical;
      continue;
    }
    std::printf("%s prompt %zu diverges at step %zu: kiln %d, llama.cpp %d (llama.cpp's top-2 gap %.4f)\n",
                tm.name.c_str(), i, step, g.tokens[step], c.greedy[step], c.gaps[step]);
    EXPECT_LT(c.gaps[step], std::max(0.1, llama_error + kiln_error))
        << "kiln left llama.cpp's greedy path at step " << step << " where llama.cpp was sure";
  }
  std::printf("%s: %d of %zu continuations identical\n", tm.name.c_str(), identical, cases.size());
}

// A GGUF file's bytes, written to a temporary file and loaded for `context` positions.
std::shared_ptr<const Model> load_bytes(const std::string& bytes, int64_t context = 0) {
  const kiln::testing::TempDir dir("tiny_file");
  const std::string path = dir.path() + "/m.gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  ModelLoadOptions o;
  o.context_length = context;
  return Model::load(path, o);
}

testing::TinyModel find(const std::string& name) {
  const std::vector<testing::TinyModel> all = testing::tiny_models();
  return *std::find_if(all.begin(), all.end(), [&](const testing::TinyModel& m) { return m.name == name; });
}

// The file with each of `values` as its f32 metadata `key` (the value follows the key and
// its 4-byte type) is a DataLossError naming the key.
void expect_bad_f32_named(const std::string& bytes, const std::string& key, std::initializer_list<float> values) {
  for (const float bad : values) {
    std::string changed = bytes;
    const size_t at = changed.find(key);
    ASSERT_NE(at, std::string::npos) << key;
    std::memcpy(changed.data() + at + key.size() + 4, &bad, 4);
    try {
      load_bytes(changed);
      ADD_FAILURE() << key << " = " << bad << " was taken";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// Files kiln cannot run right: typed errors naming what is wrong (a bad RoPE factor, a
// mixture of experts, an unknown architecture).
TEST(TinyModelFiles, BadFactorsAndUnknownArchitecturesAreNamed) {
  // rope_freqs.weight is the file's last tensor: its last factor is the last 4 bytes.
  std::string llama3 = testing::tiny_model_gguf(find("f16-llama3-spm"));
  ASSERT_NO_THROW(load_bytes(llama3));
  for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    std::memcpy(llama3.data() + llama3.size() - 4, &bad, 4);
    try {
      load_bytes(llama3);
      ADD_FAILURE() << "a factor of " << bad << " was taken";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find("rope_freqs.weight"), std::string::npos) << e.what();
    }
  }
  // A mixture of experts (Mixtral's layout: a "llama" file with llama.expert_count): named
  // before any tensor is looked for.
  testing::GgufBuilder kv;
  kv.kv_string("general.architecture", "llama");
  kv.kv_u32("llama.expert_count", 8);
  testing::GgufBuilder moe;
  moe.header(0, kv.n_kv);
  moe.bytes += kv.bytes;
  try {
    load_bytes(moe.bytes);
    ADD_FAILURE() << "a mixture of experts was loaded";
  } catch (const UnimplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("mixture-of-experts model (8 experts)"), std::string::npos) << e.what();
  }
  // An architecture kiln does not run (every "qwen3" of the file, its keys included, made
  // "qwen9"): named, with the ones it runs.
  std::string other = testing::tiny_model_gguf(find("f32-qwen3-bpe"));
  for (size_t at = other.find("qwen3"); at != std::string::npos; at = other.find("qwen3", at)) other[at + 4] = '9';
  try {
    load_bytes(other);
    ADD_FAILURE() << "qwen9 was loaded";
  } catch (const UnimplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("architecture 'qwen9' is not supported"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen3"), std::string::npos) << e.what();
  }
}

// Phi-3: the context to be served picks the LongRoPE factors (long past the original
// context of 64 positions, capped at the trained 256), the attention factor is read and
// checked, and its special tokens swallow the whitespace after them as in llama.cpp (the
// ids below are llama-tokenize's on the same files: `build/default/tests/kiln_tiny_gguf
// DIR; llama-tokenize -m DIR/q4_0-phi3-spm.gguf -p "$TEXT" --ids`).
TEST(TinyModelFiles, Phi3PicksItsRopeFactorsByContextAndStripsAfterItsTokens) {
  const std::string long_bytes = testing::tiny_model_gguf(find("q4_0-phi3-spm"));  // original context 64
  const auto factors = [](const Model& m, const char* name) { return m.file().dequantize(*m.file().find_tensor(name)); };
  for (const int64_t context : {int64_t{0}, int64_t{65}, int64_t{256}, int64_t{100000}}) {
    const auto m = load_bytes(long_bytes, context);
    EXPECT_EQ(m->config().rope_freq_factors, factors(*m, "rope_factors_long.weight")) << context;
    EXPECT_EQ(m->config().rope_freq_factors.size(), 16u);  // n_rot 32 of the 64 dimensions
    EXPECT_FLOAT_EQ(m->config().rope_attn_factor, 1.19f);
  }
  for (const int64_t context : {int64_t{16}, int64_t{64}}) {
    const auto m = load_bytes(long_bytes, context);
    EXPECT_EQ(m->config().rope_freq_factors, factors(*m, "rope_factors_short.weight")) << context;
    EXPECT_NE(factors(*m, "rope_factors_short.weight"), factors(*m, "rope_factors_long.weight"));
  }
  const auto short_model = load_bytes(testing::tiny_model_gguf(find("q8_0-phi3-bpe")));  // original context 4096
  EXPECT_EQ(short_model->config().rope_freq_factors, factors(*short_model, "rope_factors_short.weight"));

  expect_bad_f32_named(long_bytes, "phi3.rope.scaling.attn_factor", {0.0f, -1.0f, std::numeric_limits<float>::infinity()});

  const std::string text = "<|user|>\n the cat<|end|>\n<|assistant|>\n  hat</s> \n<s>  x";
  const auto m = load_bytes(long_bytes);
  EXPECT_EQ(m->tokenizer().encode(text, true, true), (std::vector<TokenId>{1, 337, 303, 309, 339, 338, 311, 2, 1, 259, 259, 259, 283}));
  EXPECT_EQ(short_model->tokenizer().encode(text, true, true),
            (std::vector<TokenId>{295, 116, 257, 264, 297, 296, 104, 262, 294, 293, 32, 32, 120}));
  // Only Phi-3 files (by general.name, as llama.cpp tells them): renamed, the whitespace stays.
  std::string renamed = long_bytes;
  const size_t name_at = renamed.find("kiln tiny q4_0-phi3-spm");
  ASSERT_NE(name_at, std::string::npos);
  renamed[name_at + std::string("kiln tiny q4_0-phi").size()] = 'X';
  const std::vector<TokenId> kept = load_bytes(renamed)->tokenizer().encode(text, true, true);
  EXPECT_GT(kept.size(), 13u);
  const std::string back = load_bytes(renamed)->tokenizer().decode(kept, true);
  EXPECT_NE(back.find("\n the cat"), std::string::npos) << back;
  EXPECT_NE(back.find("\n  hat"), std::string::npos) << back;
}

// Gemma's hyperparameters as llama.cpp reads them: the sliding-window layers from a
// pattern or a per-layer array, the logit caps (checked; Gemma 2's defaults), scaled
// embeddings, the local layers' RoPE base.
TEST(TinyModelFiles, GemmaReadsItsWindowsAndCaps) {
  const std::string spm = testing::tiny_model_gguf(find("q5_0-gemma3-spm"));  // pattern 2, cap 3
  for (const std::string& bytes : {spm, testing::tiny_model_gguf(find("f16-gemma3-bpe"))}) {  // flags {1, 0}
    const auto m = load_bytes(bytes);
    const ModelConfig& c = m->config();
    EXPECT_EQ(c.swa_window, 8);
    EXPECT_EQ(c.swa_layers, (std::vector<bool>{true, false}));
    EXPECT_TRUE(c.is_swa(0));
    EXPECT_FALSE(c.is_swa(1));
    EXPECT_FLOAT_EQ(c.rope_base_swa, 10000.0f);
    EXPECT_FLOAT_EQ(c.rope_base, 1000000.0f);
    EXPECT_FLOAT_EQ(c.embed_scale, 16.0f);  // sqrt(256)
    EXPECT_FLOAT_EQ(c.attn_scale, 0.125f);  // 1 / sqrt(64)
    EXPECT_TRUE(c.qk_norm && c.post_norms && c.gelu && c.rope_neox);
  }
  EXPECT_FLOAT_EQ(load_bytes(spm)->config().final_logit_softcap, 3.0f);
  EXPECT_FLOAT_EQ(load_bytes(spm)->config().attn_softcap, 0.0f);
  const auto g2 = load_bytes(testing::tiny_model_gguf(find("q4_1-gemma2-spm")));  // window 8, score cap 0.5, no other keys
  EXPECT_EQ(g2->config().swa_layers, (std::vector<bool>{true, false}));  // every other layer
  EXPECT_EQ(g2->config().swa_window, 8);
  EXPECT_FLOAT_EQ(g2->config().attn_softcap, 0.5f);
  EXPECT_FLOAT_EQ(g2->config().final_logit_softcap, 30.0f);
  EXPECT_FLOAT_EQ(g2->config().rope_base_swa, g2->config().rope_base);
  EXPECT_FALSE(g2->config().qk_norm);
  expect_bad_f32_named(spm, "gemma3.final_logit_softcapping", {-1.0f, std::numeric_limits<float>::quiet_NaN()});
}

// Sliding windows on the CPU kernels, whose attention starts each query at its window's
// first block: a 45-token prompt (the window of 8 starting inside blocks and whole blocks
// behind it) gives the same logits, bit for bit, for every block size (16; 8, 24, 5: padded
// lanes, half-empty lane groups, odd), and three sequences in one batch, then a decode
// step of all three, give each one's logits alone.
TEST(TinyModelFiles, SlidingWindowsHoldAcrossBlockSizesAndBatches) {
  const auto m = load_bytes(testing::tiny_model_gguf(find("q4_1-gemma2-spm")));
  ASSERT_TRUE(m->config().is_swa(0));
  const int64_t V = m->config().n_vocab;
  std::vector<std::vector<TokenId>> prompts(3);
  for (int i = 0; i < 45; ++i) prompts[0].push_back((i * 37 + 11) % 300 + 3);
  prompts[1].assign(prompts[0].begin(), prompts[0].begin() + 20);
  prompts[2] = {5, 17, 99};
  const auto run = [&](const std::vector<std::vector<TokenId>>& seqs, int64_t block_tokens, bool decode) {
    KvCache cache = m->make_cache({128, block_tokens});
    std::vector<BatchToken> batch, step;
    for (const std::vector<TokenId>& ids : seqs) {
      const KvCache::SeqId s = cache.add_sequence();
      for (size_t p = 0; p < ids.size(); ++p) batch.push_back({s, ids[p], static_cast<int64_t>(p), p + 1 == ids.size()});
      step.push_back({s, 42, static_cast<int64_t>(ids.size()), true});
    }
    std::vector<float> out(seqs.size() * static_cast<size_t>(V));
    m->forward(batch, cache, out.data());
    if (decode) m->forward(step, cache, out.data());
    return out;
  };
  const std::vector<float> base = run({prompts[0]}, 16, false);
  for (const int64_t bs : {8, 24, 5}) EXPECT_EQ(base, run({prompts[0]}, bs, false)) << bs;
  const std::vector<float> together = run(prompts, 16, true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<TokenId> ids = prompts[i];
    ids.push_back(42);
    const std::vector<float> alone = run({ids}, 16, false);
    EXPECT_EQ(alone, std::vector<float>(together.begin() + static_cast<int64_t>(i) * V, together.begin() + static_cast<int64_t>(i + 1) * V))
        << "sequence " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTensorType, TinyModels, ::testing::ValuesIn(testing::tiny_models()),
                         [](const ::testing::TestParamInfo<testing::TinyModel>& p) {
                           std::string n = p.param.name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace kiln::llm
