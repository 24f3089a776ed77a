// map: in the consumer's thread, or on a pool of worker threads (num_parallel_calls)
// that keeps up to that many calls in flight and hands results back in input order
// (deterministic) or in completion order.
#include <deque>
#include <thread>

#include "dataset_internal.h"

namespace kiln::data {
namespace {

class MapNode : public DatasetNode {
 public:
  MapNode(NodePtr input, Dataset::MapFn fn, MapOptions options)
      : DatasetNode(options.num_parallel_calls != 0 ? "ParallelMap" : "Map", options.output_spec,
                    input->cardinality(), {input}),
        fn_(std::move(fn)), options_(std::move(options)) {}

  std::string params() const override {
    if (options_.num_parallel_calls == 0) return "";
    return detail::str_cat("num_parallel_calls=",
                           options_.num_parallel_calls == kAutotune ? std::string("AUTOTUNE")
                                                                    : std::to_string(options_.num_parallel_calls),
                           options_.deterministic ? "" : ", deterministic=false");
  }

  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override;

  Element call(const Element& in, int64_t index) const {
    Element out;
    try {
      out = fn_(in);
    } catch (...) {
      rethrow_with_context(detail::str_cat("map: element ", index));
    }
    if (!spec().components.empty()) {
      bool ok = out.size() == spec().size();
      for (size_t i = 0; ok && i < out.size(); ++i) ok = spec().components[i].matches(out[i]);
      if (!ok)
        throw InvalidArgumentError(detail::str_cat("map: element ", index, ": the function returned ", out.desc(),
                                                   ", which does not match output_spec ", spec().str()));
    }
    return out;
  }

 private:
  Dataset::MapFn fn_;
  MapOptions options_;
};

class SequentialMapIterator : public IteratorImpl {
 public:
  SequentialMapIterator(const MapNode* node, std::unique_ptr<IteratorImpl> input)
      : node_(node), input_(std::move(input)) {}
  bool next(Element* out) override {
    if (!input_->next(&in_)) return false;
    *out = node_->call(in_, index_++);
    return true;
  }

 private:
  const MapNode* node_;
  std::unique_ptr<IteratorImpl> input_;
  Element in_;
  int64_t index_ = 0;
};

class ParallelMapIterator : public IteratorImpl {
 public:
  ParallelMapIterator(const MapNode* node, std::unique_ptr<IteratorImpl> input, int parallelism, bool deterministic,
                      const IterContext& ctx)
      : node_(node), input_(std::move(input)), deterministic_(deterministic), ctx_(ctx),
        parallelism_(static_cast<size_t>(parallelism)) {
    cancel_handle_ = ctx_.state->on_cancel([this] {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    });
    workers_.reserve(parallelism_);
    for (size_t i = 0; i < parallelism_; ++i) workers_.emplace_back([this] {
      init_pipeline_thread("kiln-data-map");
      work();
    });
  }

  ~ParallelMapIterator() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    ctx_.state->unregister(cancel_handle_);
  }

  bool next(Element* out) override {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (ctx_.cancelled()) return false;
      if (!results_.empty()) {
        auto it = results_.begin();
        if (!deterministic_) {
          while (it != results_.end() && !(*it)->done) ++it;
          if (it == results_.end()) it = results_.begin();  // none done yet: wait for the oldest
        }
        if ((*it)->done) {
          std::shared_ptr<Slot> slot = *it;
          results_.erase(it);
          cv_.notify_all();  // a worker may start another call
          if (slot->error) std::rethrow_exception(slot->error);
          *out = std::move(slot->out);
          return true;
        }
      } else if (input_done_ && in_flight_ == 0 && reserved_ == 0) {
        return false;
      }
      cv_.wait(lk);
    }
  }

 private:
  struct Slot {
    Element out;
    std::exception_ptr error;
    bool done = false;
  };

  void work() {
    Element in;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        // At most `parallelism` results waiting or computing.
        cv_.wait(lk, [&] {
          return stop_ || ctx_.cancelled() || input_done_ || results_.size() + reserved_ < parallelism_;
        });
        if (stop_ || ctx_.cancelled() || input_done_) return;
        ++reserved_;
      }
      auto slot = std::make_shared<Slot>();
      int64_t index = 0;
      {
        // Inputs are not thread-safe: one puller at a time, and the slot enters
        // results_ before the next pull so that results_ is in input order. The
        // consumer can take finished results meanwhile.
        std::lock_guard<std::mutex> in_lk(input_mu_);
        bool skip;
        {
          std::lock_guard<std::mutex> lk(mu_);
          skip = input_done_ || stop_;
        }
        bool got = false;
        std::exception_ptr error;
        if (!skip) {
          try {
            got = input_->next(&in);
          } catch (...) {
            error = std::current_exception();
          }
        }
        std::lock_guard<std::mutex> lk(mu_);
        --reserved_;
        if (error) {
          slot->error = std::move(error);  // no reference left in this thread
          slot->done = true;
          results_.push_back(std::move(slot));
        }
        if (!got) {
          input_done_ = true;
          cv_.notify_all();
          return;
        }
        index = next_index_++;
        results_.push_back(slot);
        ++in_flight_;
      }
      try {
        slot->out = node_->call(in, index);
      } catch (...) {
        slot->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        slot->done = true;
        --in_flight_;
        // Drop this thread's reference under the lock: the consumer, which takes the
        // slot under the same lock, then owns (and destroys) the result and any error.
        slot.reset();
      }
      cv_.notify_all();
    }
  }

  const MapNode* node_;
  std::unique_ptr<IteratorImpl> input_;
  bool deterministic_;
  IterContext ctx_;
  size_t parallelism_;
  int64_t cancel_handle_ = 0;
  std::mutex input_mu_;  // taken before mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Slot>> results_;
  bool input_done_ = false;
  bool stop_ = false;
  int64_t in_flight_ = 0;
  size_t reserved_ = 0;  // workers between reserving capacity and pushing a slot
  int64_t next_index_ = 0;
  std::vector<std::thread> workers_;
};

std::unique_ptr<IteratorImpl> MapNode::make(const IterContext& ctx) const {
  auto input = inputs()[0]->make(ctx);
  int parallelism = resolve_parallelism(options_.num_parallel_calls, ctx, "map: num_parallel_calls");
  if (parallelism == 0) return std::make_unique<SequentialMapIterator>(this, std::move(input));
  return std::make_unique<ParallelMapIterator>(this, std::move(input), parallelism, options_.deterministic, ctx);
}

}  // namespace

NodePtr make_map_node(NodePtr input, Dataset::MapFn fn, MapOptions options) {
  KILN_CHECK_ARG(options.num_parallel_calls >= 0 || options.num_parallel_calls == kAutotune,
                 "map: num_parallel_calls must be >= 0 or kAutotune, got ", options.num_parallel_calls);
  return std::make_shared<MapNode>(std::move(input), std::move(fn), std::move(options));
}

}  // namespace kiln::data
