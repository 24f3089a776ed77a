#include "kiln/llm/engine.h"

#include <algorithm>
#include <optional>

#include "kiln/core/error.h"

namespace kiln::llm {

using detail::str_cat;
using Clock = std::chrono::steady_clock;

struct Engine::Seq {
  Seq(CompletionRequest r, const Model& m)
      : req(std::move(r)),
        sampler(req.sampling, static_cast<int32_t>(m.config().n_vocab)),
        out(m.tokenizer(), req.stop, req.ignore_eos),
        tokens(req.prompt),
        n_prompt(static_cast<int64_t>(req.prompt.size())) {}
  CompletionRequest req;
  Sampler sampler;
  TextOutput out;
  std::vector<TokenId> tokens;  // the prompt, then what was generated
  int64_t n_prompt;
  KvCache::SeqId kv = -1;
  int64_t computed = 0;       // leading tokens whose keys and values are in the cache
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache held at first admission
  bool seen = false;          // admitted at least once
  uint64_t order = 0;         // admission order (the latest is preempted first)
  bool finished = false;
  std::optional<JsonConstraint> json;  // json_object and json_schema requests
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
};

namespace {
int64_t pool_tokens(const Model& model, const EngineOptions& o) {
  if (o.kv_cache_tokens > 0) return o.kv_cache_tokens;
  if (o.kv_cache_bytes <= 0) throw InvalidArgumentError("engine: kv_cache_bytes or kv_cache_tokens must be > 0");
  return o.kv_cache_bytes / KvCache::bytes_per_token(model.config());
}
}  // namespace

Engine::Engine(std::shared_ptr<const Model> model, EngineOptions options)
    : model_(std::move(model)),
      opts_(std::move(options)),
      cache_(model_->make_cache(KvCacheOptions{std::max<int64_t>(1, pool_tokens(*model_, opts_)), 16})) {
  const int64_t pool = cache_.total_blocks() * cache_.block_tokens();
  const int64_t trained = model_->config().n_ctx_train > 0 ? model_->config().n_ctx_train : 4096;
  context_ = opts_.context_length > 0 ? std::min(opts_.context_length, trained) : trained;
  context_ = std::min(context_, pool);
  if (context_ < 64)
    throw InvalidArgumentError(str_cat("engine: the KV cache holds ", pool, " positions (", cache_.bytes(),
                                       " bytes), too few for a useful context; give it more memory"));
  if (opts_.max_running < 1) throw InvalidArgumentError("engine: max_running must be >= 1");
  if (opts_.max_waiting < 0) throw InvalidArgumentError("engine: max_waiting must be >= 0");
  opts_.step_tokens = std::max<int64_t>(opts_.step_tokens, opts_.max_running);
  stats_.kv_blocks_total = cache_.total_blocks();
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Engine::submit(CompletionRequest request) {
  const ModelConfig& c = model_->config();
  if (request.prompt.empty()) throw InvalidArgumentError("the prompt has no tokens");
  if (request.max_tokens < 1) throw InvalidArgumentError(str_cat("max_tokens must be >= 1, got ", request.max_tokens));
  for (TokenId t : request.prompt)
    if (t < 0 || t >= c.n_vocab) throw InvalidArgumentError(str_cat("prompt token id ", t, " is outside the vocabulary of ", c.n_vocab));
  const int64_t need = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (need > context_)
    throw InvalidArgumentError(str_cat("this model's context is ", context_, " tokens; the request needs ",
                                       request.prompt.size(), " in the prompt + ", request.max_tokens, " to generate = ", need));
  if (!request.cancelled) request.cancelled = std::make_shared<std::atomic<bool>>(false);
  auto seq = std::make_unique<Seq>(std::move(request), *model_);  // validates sampling and stop strings
  if (seq->req.json_object || seq->req.json_schema) {
    // Made here, on the caller's thread: the engine's steps never wait for the vocabulary
    // (the first JSON request's ~50 ms for SmolLM2) or the constraint's buffers.
    std::call_once(json_vocab_once_, [&] { json_vocab_ = std::make_shared<const JsonVocabulary>(model_->tokenizer()); });
    seq->json.emplace(json_vocab_, seq->req.json_schema);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw UnavailableError("the engine is shutting down");
    if (static_cast<int64_t>(incoming_.size()) + stats_.waiting >= opts_.max_waiting)
      throw ResourceExhaustedError(str_cat("the server is busy: ", opts_.max_waiting, " requests are already waiting"));
    incoming_.push_back(std::move(seq));
  }
  wake_.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.waiting += static_cast<int64_t>(incoming_.size());
  return s;
}

void Engine::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !running_.empty() || !waiting_.empty(); });
      if (stopping_) break;
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      stats_.waiting = static_cast<int64_t>(waiting_.size());
    }
    try {
      step();
    } catch (const std::exception& e) {
      // Nothing in a step should throw; if it does, fail what ran and keep serving.
      for (auto& s : running_) finish(*s, "error", e.what());
      running_.clear();
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    stats_.kv_blocks_used = cache_.used_blocks();
    stats_.kv_blocks_cached = cache_.cached_blocks();
  }
  std::deque<std::unique_ptr<Seq>> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(incoming_);
  }
  for (auto& s : running_) finish(*s, "cancelled");
  for (auto& s : waiting_) finish(*s, "cancelled");
  for (auto& s : rest) finish(*s, "cancelled");
}

void Engine::finish(Seq& s, const std::string& reason, const std::string& error) {
  if (s.finished) return;
  s.finished = true;
  CompletionEvent e;
  e.done = true;
  e.finish_reason = reason;
  e.error = error;
  if (reason == "length") e.text = s.out.finish();
  e.prompt_tokens = s.n_prompt;
  e.completion_tokens = s.generated();
  e.cached_tokens = s.cached_tokens;
  if (s.kv >= 0) {
    cache_.remove_sequence(s.kv);
    s.kv = -1;
  }
  if (s.req.on_event) s.req.on_event(e);
}

void Engine::preempt(Seq& s) {
  cache_.remove_sequence(s.kv);
  s.kv = -1;
  s.computed = 0;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.preemptions;
}

void Engine::admit() {
  while (static_cast<int32_t>(running_.size()) < opts_.max_running && !waiting_.empty()) {
    Seq& s = *waiting_.front();
    s.kv = cache_.add_sequence();
    const std::span<const TokenId> known(s.tokens);
    s.computed = opts_.prefix_caching ? cache_.attach_prefix(s.kv, known.first(known.size() - 1)) : 0;
    if (cache_.blocks_needed(s.kv, static_cast<int64_t>(s.tokens.size())) > cache_.free_blocks()) {
      cache_.remove_sequence(s.kv);  // wait for room (running sequences finish or are preempted)
      s.kv = -1;
      s.computed = 0;
      if (!running_.empty()) break;
      finish(s, "error", "the KV cache cannot hold this request");  // cannot happen: context <= pool
      waiting_.pop_front();
      continue;
    }
    if (!s.seen) {
      s.seen = true;
      s.cached_tokens = std::min(s.computed, s.n_prompt);
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prefix_query_tokens += s.n_prompt;
      stats_.prefix_hit_tokens += s.cached_tokens;
    }
    s.order = ++admitted_;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Engine::step() {
  const auto now = Clock::now();
  auto drop_stopped = [&](auto& list) {
    for (auto& s : list) {
      if (s->req.cancelled->load()) finish(*s, "cancelled");
      else if (now > s->req.deadline) finish(*s, "timeout");
    }
    list.erase(std::remove_if(list.begin(), list.end(), [](const auto& s) { return s->finished; }), list.end());
  };
  drop_stopped(waiting_);
  drop_stopped(running_);
  admit();
  if (running_.empty()) return;

  // Plan: one token of every decoding sequence, then prefill chunks within the budget.
  struct Part {
    Seq* seq;
    int64_t n;
  };
  std::vector<Part> plan;
  int64_t budget = opts_.step_tokens;
  for (auto& s : running_)
    if (static_cast<int64_t>(s->tokens.size()) - s->computed == 1) {
      plan.push_back({s.get(), 1});
      --budget;
    }
  for (auto& s : running_) {
    const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->computed;
    if (pending > 1 && budget > 0) {
      const int64_t n = std::min(pending, budget);
      plan.push_back({s.get(), n});
      budget -= n;
    }
  }
  // Room for the step: preempt the latest admitted sequences until it fits.
  for (;;) {
    int64_t need = 0;
    for (const Part& p : plan) need += cache_.blocks_needed(p.seq->kv, p.seq->computed + p.n);
    if (need <= cache_.free_blocks() || running_.size() <= 1) break;
    auto victim = std::max_element(running_.begin(), running_.end(), [](const auto& a, const auto& b) { return a->order < b->order; });
    Seq* v = victim->get();
    preempt(*v);
    plan.erase(std::remove_if(plan.begin(), plan.end(), [v](const Part& p) { return p.seq == v; }), plan.end());
    waiting_.push_front(std::move(*victim));
    running_.erase(victim);
  }
  if (plan.empty()) return;

  std::vector<BatchToken> batch;
  int64_t n_logits = 0;
  for (const Part& p : plan) {
    Seq& s = *p.seq;
    const int64_t end = s.computed + p.n;
    for (int64_t i = s.computed; i < end; ++i)
      batch.push_back({s.kv, s.tokens[static_cast<size_t>(i)], i, i + 1 == static_cast<int64_t>(s.tokens.size())});
    if (end == static_cast<int64_t>(s.tokens.size())) ++n_logits;
  }
  const int64_t n_vocab = model_->config().n_vocab;
  logits_.resize(static_cast<size_t>(n_logits * n_vocab));
  model_->forward(batch, cache_, logits_.data());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
  }
  if (opts_.on_step) opts_.on_step(static_cast<int64_t>(plan.size()), static_cast<int64_t>(batch.size()));

  int64_t row = 0;
  for (const Part& p : plan) {
    Seq& s = *p.seq;
    s.computed += p.n;
    if (opts_.prefix_caching) cache_.publish(s.kv, s.tokens);
    if (s.computed != static_cast<int64_t>(s.tokens.size())) continue;
    std::span<float> lg(logits_.data() + row * n_vocab, static_cast<size_t>(n_vocab));
    ++row;
    if (s.json) s.json->mask(lg);
    const Sample sample = s.sampler.sample(lg, s.tokens);
    if (s.json) s.json->accept(sample.token);
    TextOutput::Step st = s.out.push(sample.token);
    if (!st.eog) s.tokens.push_back(sample.token);
    CompletionEvent e;
    e.text = std::move(st.text);
    e.sample = st.eog ? nullptr : &sample;
    if (s.req.on_event && (e.sample || !e.text.empty())) s.req.on_event(e);
    if (st.stop) {
      finish(s, "stop");
    } else if (s.json && s.json->closed()) {  // the value closed: the text held back is final
      CompletionEvent tail;
      tail.text = s.out.finish();
      if (s.req.on_event && !tail.text.empty()) s.req.on_event(tail);
      finish(s, "stop");
    } else if (s.generated() >= s.req.max_tokens || static_cast<int64_t>(s.tokens.size()) >= context_) {
      finish(s, "length");
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finished; }), running_.end());
}

}  // namespace kiln::llm
