// The serving engine on the real SmolLM2-135M-Instruct: continuous batching gives every
// request what it gets alone (greedy and seeded), under preemption too; prefix caching
// shares blocks and changes no output; cancellation, deadlines and a full queue; the
// KV cache's reference counting, publishing, eviction and copy-on-write.
#include "kiln/llm/engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <map>

#include "kiln/core/device_config.h"
#include "kiln/core/error.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/json_constraint.h"
#include "llm/llm_test_util.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

// Under ThreadSanitizer a SmolLM2 step takes about half a second: the tests that run
// hundreds of steps are for the default and AddressSanitizer presets; the threading is
// covered here by ConcurrentSubmittersStatsAndCancellation, which runs everywhere.
#define SKIP_UNDER_TSAN() \
  if (kiln::testing::kTsan) GTEST_SKIP() << "hundreds of model steps: run in the default and asan presets, not under ThreadSanitizer"

ModelConfig tiny_config() {
  ModelConfig c;
  c.n_layer = 1;
  c.n_head_kv = 1;
  c.head_dim = 2;
  return c;
}

std::vector<TokenId> iota_tokens(int n, int from = 0) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(from + i);
  return t;
}

// The pool comes from the CPU device's allocator: it shows in the device's memory
// statistics while the cache lives (and a memory limit bounds it: tests/cli/llm.sh).
TEST(KvCachePool, ComesFromTheDeviceAllocator) {
  ModelConfig c = tiny_config();
  c.n_layer = 4;
  c.n_head_kv = 8;
  c.head_dim = 64;
  const int64_t before = config::memory_stats(Device::cpu()).bytes_in_use;
  {
    KvCache cache(c, {4096, 16});
    EXPECT_EQ(static_cast<int64_t>(cache.bytes()), 4096 * KvCache::bytes_per_token(c));
    EXPECT_GE(config::memory_stats(Device::cpu()).bytes_in_use - before, static_cast<int64_t>(cache.bytes()));
    KvCache moved = std::move(cache);  // (the engine moves its cache in)
    EXPECT_GE(config::memory_stats(Device::cpu()).bytes_in_use - before, static_cast<int64_t>(moved.bytes()));
    const KvCache::SeqId s = moved.add_sequence();
    moved.grow(s, 1);
    moved.value(s, 3, 0)[0] = half(1.5f);
    EXPECT_EQ(static_cast<float>(moved.block_values(moved.blocks(s)[0], 3)[0]), 1.5f);
  }
  EXPECT_EQ(config::memory_stats(Device::cpu()).bytes_in_use, before);
}

TEST(KvCachePrefix, PublishedBlocksAreSharedAndSurviveTheirSequence) {
  KvCache c(tiny_config(), {64, 4});  // 16 blocks of 4
  const auto toks = iota_tokens(10);
  const KvCache::SeqId a = c.add_sequence();
  EXPECT_EQ(c.attach_prefix(a, toks), 0);
  c.grow(a, 10);
  *c.value(a, 0, 5) = half(5.0f);
  c.publish(a, toks);  // blocks 0 and 1 (positions 0-7); the third is partial
  EXPECT_EQ(c.used_blocks(), 3);

  const KvCache::SeqId b = c.add_sequence();
  EXPECT_EQ(c.attach_prefix(b, toks), 8);
  EXPECT_EQ(c.blocks(b)[0], c.blocks(a)[0]);
  EXPECT_EQ(c.blocks(b)[1], c.blocks(a)[1]);
  EXPECT_EQ(static_cast<float>(*c.value(b, 0, 5)), 5.0f);
  EXPECT_EQ(c.used_blocks(), 3);  // shared, not copied

  // A different second block: only the first is shared.
  auto other = toks;
  other[6] = 99;
  const KvCache::SeqId d = c.add_sequence();
  EXPECT_EQ(c.attach_prefix(d, other), 4);
  EXPECT_THROW(c.attach_prefix(d, other), InvalidArgumentError);  // not empty any more

  c.remove_sequence(a);
  c.remove_sequence(b);
  c.remove_sequence(d);
  EXPECT_EQ(c.used_blocks(), 0);
  EXPECT_EQ(c.cached_blocks(), 2);
  // Cached blocks are found again after every user left.
  const KvCache::SeqId e = c.add_sequence();
  EXPECT_EQ(c.attach_prefix(e, toks), 8);
  EXPECT_EQ(c.cached_blocks(), 0);
  c.remove_sequence(e);
}

TEST(KvCachePrefix, CachedBlocksAreEvictedOnlyWhenNothingElseIsFree) {
  KvCache c(tiny_config(), {16, 4});  // 4 blocks
  const auto toks = iota_tokens(8);
  const KvCache::SeqId a = c.add_sequence();
  c.grow(a, 8);
  c.publish(a, toks);
  c.remove_sequence(a);
  EXPECT_EQ(c.free_blocks(), 4);
  const KvCache::SeqId b = c.add_sequence();
  c.grow(b, 8);  // takes the two never-published blocks
  const KvCache::SeqId probe = c.add_sequence();
  EXPECT_EQ(c.attach_prefix(probe, toks), 8);
  c.remove_sequence(probe);
  c.grow(b, 12);  // evicts the least recently released cached block: the chain's tail
  EXPECT_EQ(c.cached_blocks(), 1);
  const KvCache::SeqId p2 = c.add_sequence();
  EXPECT_EQ(c.attach_prefix(p2, toks), 4);  // its head is still there
  c.remove_sequence(p2);
  EXPECT_THROW(c.grow(b, 20), ResourceExhaustedError);
  EXPECT_EQ(c.length(b), 12);
}

TEST(KvCachePrefix, TruncatingIntoASharedBlockCopiesIt) {
  KvCache c(tiny_config(), {64, 4});
  const auto toks = iota_tokens(8);
  const KvCache::SeqId a = c.add_sequence();
  c.grow(a, 8);
  for (int p = 0; p < 8; ++p) *c.value(a, 0, p) = half(static_cast<float>(p));
  c.publish(a, toks);
  const KvCache::SeqId b = c.add_sequence();
  ASSERT_EQ(c.attach_prefix(b, toks), 8);
  c.truncate(b, 6);  // b will write position 6 of block 1: it gets a copy
  EXPECT_NE(c.blocks(b)[1], c.blocks(a)[1]);
  EXPECT_EQ(c.blocks(b)[0], c.blocks(a)[0]);
  EXPECT_EQ(static_cast<float>(*c.value(b, 0, 5)), 5.0f);
  c.grow(b, 7);
  *c.value(b, 0, 6) = half(-1.0f);
  EXPECT_EQ(static_cast<float>(*c.value(a, 0, 6)), 6.0f);
  // The block a still holds stays published: a third sequence finds a's data.
  const KvCache::SeqId d = c.add_sequence();
  EXPECT_EQ(c.attach_prefix(d, toks), 8);
  EXPECT_EQ(static_cast<float>(*c.value(d, 0, 6)), 6.0f);
}

const std::shared_ptr<const Model>& smollm2() {
  static const std::shared_ptr<const Model> m = Model::load(testing::smollm2_path());
  return m;
}

struct Outcome {
  std::vector<TokenId> tokens;
  std::string text;
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  int events = 0;
};

// Submits and returns a future of the outcome.
std::future<Outcome> submit(Engine& e, CompletionRequest r) {
  auto done = std::make_shared<std::promise<Outcome>>();
  auto out = std::make_shared<Outcome>();
  auto f = done->get_future();
  r.on_event = [done, out](const CompletionEvent& ev) {
    ++out->events;
    out->text += ev.text;
    if (ev.sample) out->tokens.push_back(ev.sample->token);
    if (ev.done) {
      out->finish_reason = ev.finish_reason;
      out->prompt_tokens = ev.prompt_tokens;
      out->completion_tokens = ev.completion_tokens;
      out->cached_tokens = ev.cached_tokens;
      done->set_value(*out);
    }
  };
  e.submit(std::move(r));
  return f;
}

std::vector<std::string> prompts() {
  return {"The capital of France is",
          "Write a haiku about the sea.",
          "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
          "Once upon a time, in a land far away, there lived a",
          "def fibonacci(n):",
          "List three colours:",
          "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. Again:",
          "Q: Why is the sky blue?\nA:"};
}

CompletionRequest request(const Model& m, int i, bool greedy) {
  const std::vector<std::string> ps = prompts();
  CompletionRequest r;
  r.prompt = m.tokenizer().encode(ps[i % ps.size()] + std::string(i / ps.size(), ' '), true, true);
  r.max_tokens = 8 + (i * 7) % 40;
  r.ignore_eos = i % 3 == 0;
  if (i % 5 == 1) r.stop = {"."};
  if (greedy) {
    r.sampling.temperature = 0;
  } else {
    r.sampling.temperature = 0.8f;
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 1000 + i;
  }
  return r;
}

GenerateResult solo(const Model& m, const CompletionRequest& r) {
  GenerateOptions o;
  o.max_tokens = r.max_tokens;
  o.stop = r.stop;
  o.sampling = r.sampling;
  o.ignore_eos = r.ignore_eos;
  return generate_tokens(m, r.prompt, o);
}

void expect_batch_equals_solo(EngineOptions eo, int n, bool expect_preemption,
                              const std::shared_ptr<const Model>& m = smollm2()) {
  Engine e(m, eo);
  std::vector<std::future<Outcome>> fs;
  for (int i = 0; i < n; ++i) fs.push_back(submit(e, request(*m, i, i % 4 != 3)));
  // Every request runs in the batch; under the sanitizers every fourth is compared with a
  // solo run (kSanitized, test_util.h).
  const int compare_every = kiln::testing::kSanitized ? 4 : 1;
  for (int i = 0; i < n; ++i) {
    const Outcome got = fs[i].get();
    EXPECT_EQ(got.completion_tokens, static_cast<int64_t>(got.tokens.size())) << "request " << i;
    if (i % compare_every != 0) continue;
    const GenerateResult want = solo(*m, request(*m, i, i % 4 != 3));
    EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
    EXPECT_EQ(got.text, want.text) << "request " << i;
    EXPECT_EQ(got.finish_reason, want.finish_reason) << "request " << i;
    EXPECT_EQ(got.prompt_tokens, static_cast<int64_t>(want.prompt_tokens.size()));
    EXPECT_EQ(got.completion_tokens, static_cast<int64_t>(want.tokens.size()));
  }
  // The engine publishes its statistics at the end of the step that delivered the last
  // event: wait for that step to end.
  EngineStats st = e.stats();
  for (int i = 0; i < 500 && st.running + st.waiting + st.kv_blocks_used > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = e.stats();
  }
  EXPECT_EQ(st.running + st.waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);  // every block back (published ones cached, unreferenced)
  if (expect_preemption) {
    EXPECT_GT(st.preemptions, 0);
  }
}

TEST(LlmEngine, ThirtyTwoConcurrentRequestsEqualTheirSoloRuns) {
  SKIP_UNDER_TSAN();
  EngineOptions eo;
  eo.max_running = 32;
  eo.step_tokens = 64;  // prompts are prefilled in chunks alongside decoding streams
  expect_batch_equals_solo(eo, 32, false);
}

// The tensor path (kiln's ops, the way the engine runs on a GPU; here on the CPU in f32)
// under the same engine: concurrent requests with chunked prefill and preemption equal
// their solo runs and give every block back.
TEST(LlmEngine, TensorPathRequestsEqualTheirSoloRuns) {
  SKIP_UNDER_TSAN();
  ModelLoadOptions o;
  o.device = Device::cpu();
  o.dtype = DType::kF32;
  const std::shared_ptr<const Model> m = Model::load(testing::smollm2_path(), o);
  EngineOptions eo;
  eo.kv_cache_tokens = 160;  // 10 blocks: 12 requests of up to ~70 positions cannot all fit
  eo.max_running = 12;
  eo.step_tokens = 48;
  eo.prefix_caching = false;
  expect_batch_equals_solo(eo, kiln::testing::kSanitized ? 4 : 12, !kiln::testing::kSanitized, m);
}

TEST(LlmEngine, PreemptedRequestsResumeWithTheSameOutput) {
  SKIP_UNDER_TSAN();
  EngineOptions eo;
  eo.kv_cache_tokens = 160;  // 10 blocks: 12 requests of up to ~70 positions cannot all fit
  eo.max_running = 12;
  eo.step_tokens = 48;
  eo.prefix_caching = false;
  expect_batch_equals_solo(eo, 12, true);
}

TEST(LlmEngine, SharedPrefixIsComputedOnceAndChangesNothing) {
  SKIP_UNDER_TSAN();
  const auto& m = smollm2();
  Engine e(m, {});
  std::string system = "<|im_start|>system\nYou are a helpful assistant. Answer briefly, in one sentence, and be precise.";
  for (int i = 0; i < 20; ++i) system += " Never repeat yourself.";
  system += "<|im_end|>\n";
  auto make = [&](const std::string& q) {
    CompletionRequest r;
    r.prompt = m->tokenizer().encode(system + "<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n", false, true);
    r.max_tokens = 12;
    r.sampling.temperature = 0;
    return r;
  };
  const Outcome first = submit(e, make("What is the capital of France?")).get();
  EXPECT_EQ(first.cached_tokens, 0);
  const CompletionRequest second_req = make("Name a colour.");
  const Outcome second = submit(e, second_req).get();
  EXPECT_GE(second.cached_tokens, 64);  // the system prompt's whole blocks
  EXPECT_EQ(second.tokens, solo(*m, second_req).tokens);
  const EngineStats st = e.stats();
  EXPECT_EQ(st.prefix_hit_tokens, second.cached_tokens);
  EXPECT_GT(st.kv_blocks_cached, 0);
}

TEST(LlmEngine, CancelledAndTimedOutRequestsFreeTheirBlocks) {
  SKIP_UNDER_TSAN();
  const auto& m = smollm2();
  Engine e(m, {});
  CompletionRequest r = request(*m, 0, true);
  r.max_tokens = 200;
  r.ignore_eos = true;
  r.cancelled = std::make_shared<std::atomic<bool>>(false);
  auto flag = r.cancelled;
  auto out = std::make_shared<std::promise<Outcome>>();
  auto tokens = std::make_shared<int>(0);
  r.on_event = [flag, out, tokens](const CompletionEvent& ev) {
    if (ev.sample && ++*tokens == 3) flag->store(true);
    if (ev.done) {
      Outcome o;
      o.finish_reason = ev.finish_reason;
      o.completion_tokens = ev.completion_tokens;
      out->set_value(o);
    }
  };
  auto f = out->get_future();
  e.submit(std::move(r));
  const Outcome got = f.get();
  EXPECT_EQ(got.finish_reason, "cancelled");
  EXPECT_LT(got.completion_tokens, 10);

  CompletionRequest late = request(*m, 1, true);
  late.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  EXPECT_EQ(submit(e, std::move(late)).get().finish_reason, "timeout");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

TEST(LlmEngine, AFullQueueRefusesAtOnceAndBadRequestsAreTyped) {
  SKIP_UNDER_TSAN();
  const auto& m = smollm2();
  EngineOptions eo;
  eo.max_running = 1;
  eo.max_waiting = 2;
  Engine e(m, eo);
  std::vector<std::future<Outcome>> accepted;
  int refused = 0;
  for (int i = 0; i < 10; ++i) {
    CompletionRequest r = request(*m, i, true);
    r.max_tokens = 30;
    r.ignore_eos = true;
    r.stop.clear();
    try {
      accepted.push_back(submit(e, std::move(r)));
    } catch (const ResourceExhaustedError&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  for (auto& f : accepted) EXPECT_EQ(f.get().finish_reason, "length");

  CompletionRequest empty;
  EXPECT_THROW(e.submit(empty), InvalidArgumentError);
  CompletionRequest big = request(*m, 0, true);
  big.max_tokens = e.context_length();
  EXPECT_THROW(e.submit(big), InvalidArgumentError);
  CompletionRequest bad = request(*m, 0, true);
  bad.sampling.top_p = 2;
  EXPECT_THROW(e.submit(bad), InvalidArgumentError);
  CompletionRequest stop = request(*m, 0, true);
  stop.stop = {""};
  EXPECT_THROW(e.submit(stop), InvalidArgumentError);
  CompletionRequest oov = request(*m, 0, true);
  oov.prompt.push_back(1 << 30);
  EXPECT_THROW(e.submit(oov), InvalidArgumentError);
}

// Submissions from several threads while another polls stats() and a third cancels:
// every request gets exactly one done event; equal requests give equal tokens.
TEST(LlmEngine, ConcurrentSubmittersStatsAndCancellation) {
  const auto& m = smollm2();
  EngineOptions eo;
  eo.max_running = 4;
  Engine e(m, eo);
  std::atomic<bool> stop_polling{false};
  std::thread poller([&] {
    while (!stop_polling) {
      const EngineStats st = e.stats();
      EXPECT_LE(st.kv_blocks_used, st.kv_blocks_total);
      std::this_thread::yield();
    }
  });
  auto make = [&] {
    CompletionRequest r;
    r.prompt = m->tokenizer().encode("The capital of France is", true, false);
    r.max_tokens = 4;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    return r;
  };
  std::vector<std::future<Outcome>> got(3);
  std::vector<std::thread> submitters;
  for (int i = 0; i < 3; ++i) submitters.emplace_back([&, i] { got[i] = submit(e, make()); });
  CompletionRequest victim = make();
  victim.max_tokens = 50;
  victim.cancelled = std::make_shared<std::atomic<bool>>(false);
  auto flag = victim.cancelled;
  auto cancelled = submit(e, std::move(victim));
  std::thread canceller([flag] { flag->store(true); });
  for (auto& t : submitters) t.join();
  canceller.join();
  const Outcome a = got[0].get(), b = got[1].get(), c = got[2].get();
  EXPECT_EQ(a.tokens.size(), 4u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens, c.tokens);
  EXPECT_EQ(a.finish_reason, "length");
  const Outcome v = cancelled.get();
  EXPECT_EQ(v.finish_reason, "cancelled");
  EXPECT_LT(v.completion_tokens, 50);
  stop_polling = true;
  poller.join();
}

// JSON requests submitted from several threads at once: the first of them makes the
// vocabulary (once, on a submitting thread), each gets its own constraint, and every
// answer is what it asked for (ThreadSanitizer runs this too).
TEST(LlmEngine, ConcurrentJsonRequestsEachFollowTheirSchema) {
  const auto& m = smollm2();
  Engine e(m, EngineOptions{});
  const auto schema = JsonSchema::compile(
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": false})");
  const int n = kiln::testing::kSanitized ? 2 : 4;
  std::vector<std::future<Outcome>> got(static_cast<size_t>(n));
  std::vector<std::thread> submitters;
  for (int i = 0; i < n; ++i)
    submitters.emplace_back([&, i] {
      CompletionRequest r;
      r.prompt = m->tokenizer().encode("<|im_start|>user\nDescribe a cat as JSON.<|im_end|>\n<|im_start|>assistant\n", true, true);
      r.max_tokens = 48;
      r.sampling.temperature = 0;
      if (i % 2) r.json_schema = schema;
      else r.json_object = true;
      got[static_cast<size_t>(i)] = submit(e, std::move(r));
    });
  for (auto& t : submitters) t.join();
  for (int i = 0; i < n; ++i) {
    const Outcome o = got[static_cast<size_t>(i)].get();
    JsonRecognizer r(i % 2 ? schema.get() : JsonSchema::any_object().get());
    EXPECT_TRUE(r.feed(o.text)) << i << ": " << o.text;  // a valid prefix at least (cut by max_tokens)
    if (o.finish_reason == "stop") {
      EXPECT_TRUE(r.complete()) << i << ": " << o.text;
    }
  }
}

}  // namespace
}  // namespace kiln::llm
