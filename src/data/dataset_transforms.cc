// Element-order transformations: filter, shuffle, repeat, take, skip, shard, and
// with_options.
#include <random>

#include "dataset_internal.h"
#include "kiln/core/random.h"

namespace kiln::data {
namespace {

// A node with one input whose iterator is built from the input's iterator.
template <typename It, typename... Args>
std::unique_ptr<IteratorImpl> make_unary(const DatasetNode& node, const IterContext& ctx, Args&&... args) {
  return std::make_unique<It>(node.inputs()[0]->make(ctx), std::forward<Args>(args)...);
}

class FilterNode : public DatasetNode {
 public:
  FilterNode(NodePtr input, Dataset::PredicateFn pred)
      : DatasetNode("Filter", input->spec(), input->cardinality() == kInfiniteCardinality ? kInfiniteCardinality
                                                                                          : kUnknownCardinality,
                    {input}),
        pred_(std::move(pred)) {}
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      It(std::unique_ptr<IteratorImpl> in, const Dataset::PredicateFn* pred) : in(std::move(in)), pred(pred) {}
      std::unique_ptr<IteratorImpl> in;
      const Dataset::PredicateFn* pred;
      int64_t index = 0;
      bool next(Element* out) override {
        while (in->next(out)) {
          bool keep;
          try {
            keep = (*pred)(*out);
          } catch (...) {
            rethrow_with_context(detail::str_cat("filter: element ", index));
          }
          ++index;
          if (keep) return true;
        }
        return false;
      }
    };
    return make_unary<It>(*this, ctx, &pred_);
  }

 private:
  Dataset::PredicateFn pred_;
};

class ShuffleNode : public DatasetNode {
 public:
  ShuffleNode(NodePtr input, int64_t buffer, uint64_t seed, bool reshuffle)
      : DatasetNode("Shuffle", input->spec(), input->cardinality(), {input}),
        buffer_(buffer), seed_(seed), reshuffle_(reshuffle) {}
  std::string params() const override {
    return detail::str_cat("buffer_size=", buffer_, ", seed=", seed_, reshuffle_ ? "" : ", reshuffle=false");
  }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      It(std::unique_ptr<IteratorImpl> in, int64_t buffer, uint64_t seed)
          : in(std::move(in)), capacity(static_cast<size_t>(buffer)), rng(seed) {}
      std::unique_ptr<IteratorImpl> in;
      size_t capacity;
      std::mt19937_64 rng;
      std::vector<Element> buf;
      bool input_done = false;
      bool next(Element* out) override {
        while (!input_done && buf.size() < capacity) {
          Element e;
          if (!in->next(&e)) {
            input_done = true;
            break;
          }
          buf.push_back(std::move(e));
        }
        if (buf.empty()) return false;
        size_t k = std::uniform_int_distribution<size_t>(0, buf.size() - 1)(rng);
        *out = std::move(buf[k]);
        if (k != buf.size() - 1) buf[k] = std::move(buf.back());
        buf.pop_back();
        return true;
      }
    };
    uint64_t pass = reshuffle_ ? ctx.next_pass(passes_) : 0;
    // Mixed so that seeds s and s+1 do not give correlated streams.
    uint64_t s = (seed_ + pass * 0x9E3779B97F4A7C15ull) ^ 0xD1B54A32D192ED03ull;
    return make_unary<It>(*this, ctx, buffer_, s);
  }

 private:
  int64_t buffer_;
  uint64_t seed_;
  bool reshuffle_;
  mutable std::atomic<uint64_t> passes_{0};
};

class RepeatNode : public DatasetNode {
 public:
  RepeatNode(NodePtr input, int64_t count)
      : DatasetNode("Repeat", input->spec(), card(input->cardinality(), count), {input}), count_(count) {}
  static int64_t card(int64_t c, int64_t count) {
    if (count == 0 || c == 0) return 0;
    if (count < 0 || c == kInfiniteCardinality) return kInfiniteCardinality;
    if (c == kUnknownCardinality) return kUnknownCardinality;
    return c * count;
  }
  std::string params() const override { return count_ < 0 ? "forever" : detail::str_cat("count=", count_); }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      const DatasetNode* input;
      IterContext ctx;
      int64_t count, done_passes = 0;
      std::unique_ptr<IteratorImpl> in;
      bool produced_this_pass = false;
      bool next(Element* out) override {
        for (;;) {
          if (count >= 0 && done_passes >= count) return false;
          if (ctx.cancelled()) return false;
          if (!in) {
            IterContext rep = ctx;
            // A given pass p becomes a distinct, deterministic pass per repetition.
            if (ctx.pass) rep.pass = *ctx.pass * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(done_passes) + 1;
            in = input->make(rep);
            produced_this_pass = false;
          }
          if (in->next(out)) {
            produced_this_pass = true;
            return true;
          }
          in.reset();
          ++done_passes;
          if (!produced_this_pass) return false;  // an empty input would loop forever
        }
      }
    };
    auto it = std::make_unique<It>();
    it->input = inputs()[0].get();
    it->ctx = ctx;
    it->count = count_;
    return it;
  }

 private:
  int64_t count_;
};

class TakeSkipNode : public DatasetNode {
 public:
  TakeSkipNode(NodePtr input, int64_t count, bool take)
      : DatasetNode(take ? "Take" : "Skip", input->spec(), card(input->cardinality(), count, take), {input}),
        count_(count), take_(take) {}
  static int64_t card(int64_t c, int64_t count, bool take) {
    if (take) {
      if (count < 0) return c;
      if (c == kInfiniteCardinality) return count;
      if (c == kUnknownCardinality) return kUnknownCardinality;
      return std::min(c, count);
    }
    if (count < 0) return 0;
    if (c < 0) return c;
    return std::max<int64_t>(0, c - count);
  }
  std::string params() const override { return detail::str_cat("count=", count_); }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      It(std::unique_ptr<IteratorImpl> in, int64_t count, bool take) : in(std::move(in)), left(count), take(take) {}
      std::unique_ptr<IteratorImpl> in;
      int64_t left;
      bool take;
      bool next(Element* out) override {
        if (take) {
          if (left == 0) return false;
          if (!in->next(out)) return false;
          if (left > 0) --left;
          return true;
        }
        // skip: a negative count skips everything.
        while (left != 0) {
          if (!in->next(out)) return false;
          if (left > 0) --left;
        }
        return in->next(out);
      }
    };
    return make_unary<It>(*this, ctx, count_, take_);
  }

 private:
  int64_t count_;
  bool take_;
};

class ShardNode : public DatasetNode {
 public:
  ShardNode(NodePtr input, int64_t n, int64_t index)
      : DatasetNode("Shard", input->spec(), card(input->cardinality(), n, index), {input}), n_(n), index_(index) {}
  static int64_t card(int64_t c, int64_t n, int64_t index) {
    if (c < 0) return c;
    return c / n + (index < c % n ? 1 : 0);
  }
  std::string params() const override { return detail::str_cat("num_shards=", n_, ", index=", index_); }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    struct It : IteratorImpl {
      It(std::unique_ptr<IteratorImpl> in, int64_t n, int64_t index) : in(std::move(in)), n(n), index(index) {}
      std::unique_ptr<IteratorImpl> in;
      int64_t n, index, pos = 0;
      bool next(Element* out) override {
        // Element i belongs to shard i % n.
        for (;;) {
          if (!in->next(out)) return false;
          if (pos++ % n == index) return true;
        }
      }
    };
    return make_unary<It>(*this, ctx, n_, index_);
  }

 private:
  int64_t n_, index_;
};

class OptionsNode : public DatasetNode {
 public:
  OptionsNode(NodePtr input, PipelineOptions o)
      : DatasetNode("Options", input->spec(), input->cardinality(), {input}), options_(o) {}
  std::string params() const override {
    return detail::str_cat("cpu_budget=", options_.cpu_budget, ", ram_budget_bytes=", options_.ram_budget_bytes);
  }
  std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const override {
    IterContext mine = resolve_context(options_, ctx.state);
    mine.pass = ctx.pass;
    return inputs()[0]->make(mine);
  }
  const PipelineOptions& options() const { return options_; }

 private:
  PipelineOptions options_;
};

}  // namespace

NodePtr make_filter_node(NodePtr input, Dataset::PredicateFn pred) {
  return std::make_shared<FilterNode>(std::move(input), std::move(pred));
}
NodePtr make_shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle) {
  KILN_CHECK_ARG(buffer_size > 0, "shuffle: buffer_size must be > 0, got ", buffer_size);
  if (seed == 0) {
    // Drawn once from the default generator: set_seed() makes it reproducible.
    auto w = Philox::block(default_generator().seed(), 0x5348554646ull, default_generator().reserve(2));
    seed = (uint64_t{w[0]} << 32 | w[1]) | 1;
  }
  return std::make_shared<ShuffleNode>(std::move(input), buffer_size, seed, reshuffle);
}
NodePtr make_repeat_node(NodePtr input, int64_t count) { return std::make_shared<RepeatNode>(std::move(input), count); }
NodePtr make_take_node(NodePtr input, int64_t count) {
  return std::make_shared<TakeSkipNode>(std::move(input), count, true);
}
NodePtr make_skip_node(NodePtr input, int64_t count) {
  return std::make_shared<TakeSkipNode>(std::move(input), count, false);
}
NodePtr make_shard_node(NodePtr input, int64_t num_shards, int64_t index) {
  KILN_CHECK_ARG(num_shards >= 1, "shard: num_shards must be >= 1, got ", num_shards);
  KILN_CHECK_ARG(index >= 0 && index < num_shards, "shard: index must be in [0, ", num_shards, "), got ", index);
  return std::make_shared<ShardNode>(std::move(input), num_shards, index);
}
NodePtr make_options_node(NodePtr input, PipelineOptions options) {
  return std::make_shared<OptionsNode>(std::move(input), options);
}
const PipelineOptions* options_of(const DatasetNode& node) {
  const auto* o = dynamic_cast<const OptionsNode*>(&node);
  return o ? &o->options() : nullptr;
}

}  // namespace kiln::data
