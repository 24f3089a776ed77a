// interleave: maps input elements to datasets, keeps cycle_length of them open and
// takes block_length elements from each in turn. With num_parallel_calls each open
// dataset runs on its own prefetching thread (like tf.data's parallel interleave);
// deterministic=false lets the consumer take from whichever has an element ready.
#include <algorithm>

#include "dataset_internal.h"

namespace kiln::data {
namespace {

class InterleaveNode : public DatasetNode {
 public:
  InterleaveNode(NodePtr input, Dataset::InterleaveFn fn, InterleaveOptions o)
      : DatasetNode("Interleave", o.output_spec,
                    input->cardinality() == kInfiniteCardinality ? kInfiniteCardinality : kUnknownCardinality, {input}),
        fn_(std::move(fn)), options_(o) {}

  std::string params() const override {
    auto at = [](int64_t v) { return v == kAutotune ? std::string("AUTOTUNE") : std::to_string(v); };
    return "cycle_length=" + at(options_.cycle_length) + ", block_length=" + std::to_string(options_.block_length) +
           (options_.num_parallel_calls ? ", num_parallel_calls=" + at(options_.num_parallel_calls) : "") +
           (options_.deterministic ? "" : ", deterministic=false");
  }

  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override;

  Dataset call(const Element& e, int64_t index) const {
    try {
      return fn_(e);
    } catch (...) {
      rethrow_with_context(detail::str_cat("interleave: input element ", index));
    }
  }
  const InterleaveOptions& options() const { return options_; }

 private:
  Dataset::InterleaveFn fn_;
  InterleaveOptions options_;
};

class InterleaveIterator : public IteratorImpl {
 public:
  InterleaveIterator(const InterleaveNode* node, const IterContext& ctx, int cycle, bool parallel)
      : node_(node), ctx_(ctx), input_(node->inputs()[0]->make(ctx)), slots_(static_cast<size_t>(cycle)),
        parallel_(parallel) {}

  bool next(Element* out) override {
    const int64_t block = node_->options().block_length;
    for (;;) {
      if (ctx_.cancelled()) return false;
      fill_slots();
      if (open_ == 0) return false;
      size_t k = pick();
      Slot& s = slots_[k];
      bool got;
      try {
        got = s.it->next(out);
      } catch (...) {
        rethrow_with_context(detail::str_cat("interleave: dataset of input element ", s.index));
      }
      if (!got) {
        s.it.reset();
        --open_;
        advance();
        continue;
      }
      if (++s.taken >= block) advance();
      return true;
    }
  }

 private:
  struct Slot {
    NodePtr node;
    std::unique_ptr<IteratorImpl> it;
    int64_t index = 0;  // input element the slot's dataset came from
    int64_t taken = 0;  // elements taken in the current block
  };

  // Opens datasets for empty slots while the input has elements.
  void fill_slots() {
    for (auto& s : slots_) {
      if (s.it || input_done_) continue;
      Element e;
      if (!input_->next(&e)) {
        input_done_ = true;
        break;
      }
      Dataset d = node_->call(e, next_index_);
      s.node = d.node();  // the slot's iterator points into it
      auto it = s.node->make(ctx_);
      s.it = parallel_ ? std::make_unique<PrefetchIterator>(std::move(it), kAutotune, ctx_) : std::move(it);
      s.index = next_index_++;
      s.taken = 0;
      ++open_;
    }
  }

  void advance() {
    slots_[cur_].taken = 0;
    for (size_t i = 1; i <= slots_.size(); ++i) {
      size_t k = (cur_ + i) % slots_.size();
      if (slots_[k].it || !input_done_) {
        cur_ = k;
        return;
      }
    }
  }

  // The slot to take from: the current one, or with deterministic=false the first
  // open one (from the current on) that has an element ready.
  size_t pick() {
    if (!slots_[cur_].it) advance();
    if (!parallel_ || node_->options().deterministic) return cur_;
    for (size_t i = 0; i < slots_.size(); ++i) {
      size_t k = (cur_ + i) % slots_.size();
      auto* p = dynamic_cast<PrefetchIterator*>(slots_[k].it.get());
      if (p && p->ready()) {
        if (k != cur_) {
          slots_[cur_].taken = 0;
          cur_ = k;
        }
        return k;
      }
    }
    return cur_;
  }

  const InterleaveNode* node_;
  IterContext ctx_;
  std::unique_ptr<IteratorImpl> input_;
  std::vector<Slot> slots_;
  bool parallel_;
  bool input_done_ = false;
  int64_t open_ = 0;
  int64_t next_index_ = 0;
  size_t cur_ = 0;
};

std::unique_ptr<IteratorImpl> InterleaveNode::make(const IterContext& ctx) const {
  int cycle = options_.cycle_length == kAutotune ? ctx.cpu_budget : static_cast<int>(options_.cycle_length);
  int parallel = resolve_parallelism(options_.num_parallel_calls, ctx, "interleave: num_parallel_calls");
  return std::make_unique<InterleaveIterator>(this, ctx, std::max(cycle, 1), parallel > 0);
}

}  // namespace

NodePtr make_interleave_node(NodePtr input, Dataset::InterleaveFn fn, InterleaveOptions options) {
  KILN_CHECK_ARG(options.cycle_length > 0 || options.cycle_length == kAutotune,
                 "interleave: cycle_length must be > 0 or kAutotune, got ", options.cycle_length);
  KILN_CHECK_ARG(options.block_length > 0, "interleave: block_length must be > 0, got ", options.block_length);
  KILN_CHECK_ARG(options.num_parallel_calls >= 0 || options.num_parallel_calls == kAutotune,
                 "interleave: num_parallel_calls must be >= 0 or kAutotune, got ", options.num_parallel_calls);
  return std::make_shared<InterleaveNode>(std::move(input), std::move(fn), options);
}

}  // namespace kiln::data
