#pragma once
// The serving engine: many generations at once on one model and one paged KV cache,
// with continuous (iteration-level) batching. Each step runs one Model::forward over
// every running sequence: one token of each decoding sequence, then chunks of prompts
// being prefilled, up to a step token budget (chunked prefill: a long prompt never
// stalls the streams that are decoding). Requests join at the next step and leave as
// soon as they finish; their blocks go back to the pool at once.
//
// - Prefix caching (KvCache::attach_prefix / publish): a prompt whose leading blocks
//   another sequence computed (a system prompt, a conversation's earlier turns) starts
//   past them.
// - A full cache never fails a request: the most recently admitted running sequence is
//   preempted (its blocks released, published ones stay cached) and put back at the head
//   of the queue; it resumes by recomputing its prompt and the tokens it generated
//   (recompute, not swap), with its sampler state kept, so its output is unchanged.
// - Admission control: at most max_waiting requests wait; submit() beyond that throws
//   ResourceExhaustedError (HTTP 429) at once.
// - A request's output depends on its own prompt and parameters only, never on the
//   rest of the batch (the kernels' results do not depend on the batch; each request has
//   its own seeded sampler).
// - Cancellation and deadlines are checked at every step: the sequence and its blocks
//   are freed before the next forward.
//
// Thread-safety: submit(), stats() and the destructor may be called from any thread.
// Events are delivered on the engine's own thread, in order per request; a callback
// must not block and must not call back into the engine.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/llm/json_constraint.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/model.h"
#include "kiln/llm/sampler.h"

namespace kiln::llm {

struct EngineOptions {
  int64_t kv_cache_tokens = 0;    // positions in the pool; 0: from kv_cache_bytes
  int64_t kv_cache_bytes = 256 << 20;
  int64_t context_length = 0;     // most positions one sequence may use; 0: the model's, capped by the pool
  int32_t max_running = 16;       // sequences per step
  int64_t step_tokens = 128;      // token budget of a step (decode tokens + prefill chunks)
  int64_t max_waiting = 256;      // queued requests beyond which submit() refuses
  bool prefix_caching = true;
  // Called on the engine thread after each forward: sequences and tokens in the step.
  std::function<void(int64_t seqs, int64_t tokens)> on_step;
};

struct CompletionEvent {
  std::string text;                 // text that became final (may be empty)
  const Sample* sample = nullptr;   // the token generated in this event, if any
  bool done = false;
  // When done: "stop", "length", "cancelled", "timeout" or "error" (then `error`).
  std::string finish_reason;
  std::string error;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

struct CompletionRequest {
  std::vector<TokenId> prompt;
  int64_t max_tokens = 256;
  std::vector<std::string> stop;
  SamplingParams sampling;
  bool ignore_eos = false;
  // Generate one JSON object (kiln/llm/json_constraint.h): tokens that cannot continue it
  // are masked before sampling (log-probabilities are then those of the tokens allowed),
  // and the request finishes ("stop") when the object closes.
  bool json_object = false;
  // Generate one value valid under this schema (json_schema; takes precedence over
  // json_object), masked the same way; finishes ("stop") when nothing but whitespace can
  // follow, or when the model ends a value that could go on (a top-level number).
  std::shared_ptr<const JsonSchema> json_schema;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::shared_ptr<std::atomic<bool>> cancelled;  // set by the caller to stop it
  std::function<void(const CompletionEvent&)> on_event;  // on the engine thread
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0, kv_blocks_cached = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;  // prompt tokens looked up / found
  int64_t preemptions = 0, steps = 0;
};

class Engine {
 public:
  // Sizes the pool (InvalidArgumentError when it cannot hold one context) and starts
  // the engine thread.
  Engine(std::shared_ptr<const Model> model, EngineOptions options);
  ~Engine();  // cancels what is left (finish_reason "cancelled") and joins

  // Queues a request. InvalidArgumentError for an empty prompt, bad sampling parameters
  // or stop strings, or prompt + max_tokens over context_length(); ResourceExhaustedError
  // when max_waiting requests already wait. Every accepted request gets exactly one
  // event with done set.
  void submit(CompletionRequest request);
  int64_t context_length() const { return context_; }
  const Model& model() const { return *model_; }
  EngineStats stats() const;

 private:
  struct Seq;
  void run();
  void step();
  void admit();
  void finish(Seq& s, const std::string& reason, const std::string& error = {});
  void preempt(Seq& s);

  std::shared_ptr<const Model> model_;
  EngineOptions opts_;
  int64_t context_ = 0;
  KvCache cache_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Seq>> incoming_;  // submitted, not yet seen by the engine (mu_)
  bool stopping_ = false;
  // Made by the first submit() of a JSON request (json_vocab_once_), read-only after.
  std::once_flag json_vocab_once_;
  std::shared_ptr<const JsonVocabulary> json_vocab_;
  // Engine thread only.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  std::vector<float> logits_;
  uint64_t admitted_ = 0;
  // Published for stats() (mu_).
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace kiln::llm
