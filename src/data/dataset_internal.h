#pragma once
// The implementation side of kiln::data::Dataset: a DatasetNode per transformation
// makes an IteratorImpl per pass. Iterators pull from their inputs' iterators
// (IteratorImpl::next returns false at the end and throws on errors).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/data/dataset.h"

namespace kiln::data {

// Shared by every iterator of one pass: cancellation and the RAM budget.
class PipelineState {
 public:
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Sets the flag and runs every registered wake-up (components blocked on their
  // condition variables re-check cancelled()).
  void cancel();
  // Registers fn to run on cancel(); returns a handle for unregister().
  int64_t on_cancel(std::function<void()> fn);
  void unregister(int64_t handle);

  // Bytes held in autotuned buffers (prefetch) across the pipeline.
  std::atomic<int64_t> buffered_bytes{0};

 private:
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  int64_t next_handle_ = 0;
  std::vector<std::pair<int64_t, std::function<void()>>> callbacks_;
};

// What a node's make() receives.
struct IterContext {
  std::shared_ptr<PipelineState> state;
  int cpu_budget = 1;              // resolved (>= 1)
  int64_t ram_budget_bytes = 0;    // resolved (> 0)
  // Set by Dataset::iterator(pass) (and derived per repetition by repeat): the pass
  // that reshuffling nodes use instead of their own pass counters.
  std::optional<uint64_t> pass;
  bool cancelled() const { return state->cancelled(); }
  // The pass a reshuffling node uses: ctx.pass if given, else the next of `counter`.
  uint64_t next_pass(std::atomic<uint64_t>& counter) const { return pass ? *pass : counter.fetch_add(1); }
};

class IteratorImpl {
 public:
  virtual ~IteratorImpl() = default;
  // The next element, or false at the end. Throws kiln::Error (or the user's exception).
  virtual bool next(Element* out) = 0;
};

class DatasetNode;
using NodePtr = std::shared_ptr<const DatasetNode>;

// How the Dataset method that made a node makes it again on another input: auto-sharding
// (dataset_distribute.cc) rebuilds the transformations above a shard it inserts.
struct NodeRecipe {
  std::function<NodePtr(NodePtr input)> remake = nullptr;                      // single-input transformations
  std::function<NodePtr(NodePtr input, int64_t batch_size)> rebatch = nullptr;  // batch, padded_batch
  int64_t batch_size = 0;                                             // batch, padded_batch
  bool drop_remainder = false;
  bool one_to_one = false;  // one output per input element, in order (map, prefetch)
  bool file_list = false;   // list_files: its elements are the pipeline's files
};

class DatasetNode {
 public:
  DatasetNode(std::string name, ElementSpec spec, int64_t cardinality,
              std::vector<std::shared_ptr<const DatasetNode>> inputs = {})
      : name_(std::move(name)), spec_(std::move(spec)), cardinality_(cardinality), inputs_(std::move(inputs)) {}
  virtual ~DatasetNode() = default;
  virtual std::unique_ptr<IteratorImpl> make(const IterContext& ctx) const = 0;
  // Parameters for describe(), e.g. "batch_size=32, drop_remainder=true".
  virtual std::string params() const { return ""; }

  const std::string& name() const { return name_; }
  const ElementSpec& spec() const { return spec_; }
  int64_t cardinality() const { return cardinality_; }
  const std::vector<std::shared_ptr<const DatasetNode>>& inputs() const { return inputs_; }
  const NodeRecipe& recipe() const { return recipe_; }
  // Set once, by the Dataset method that made the node, before anything else sees it.
  void set_recipe(NodeRecipe recipe) { recipe_ = std::move(recipe); }

 private:
  std::string name_;
  ElementSpec spec_;
  int64_t cardinality_;
  std::vector<std::shared_ptr<const DatasetNode>> inputs_;
  NodeRecipe recipe_;
};

// Rethrows the exception in flight as a kiln::Error with the same code (InvalidArgument
// for a non-kiln exception) and "<where>: <cause>" as its message.
[[noreturn]] void rethrow_with_context(const std::string& where);

// Budgets from options (0 -> defaults: hardware threads, physical RAM / 8).
IterContext resolve_context(const PipelineOptions& options, std::shared_ptr<PipelineState> state);

// Called first on every pipeline thread: names it for debuggers and top. (Lowering
// their priority was measured not to help a 2-core training run: docs/benchmarks.md.)
void init_pipeline_thread(const char* name);

// Resolves a parallelism argument: 0 -> 0 (inline), kAutotune -> cpu budget, N -> N.
int resolve_parallelism(int64_t requested, const IterContext& ctx, const char* what);

// Stacks equal-shaped components of `elements` along a new dimension 0 (batch);
// InvalidArgumentError naming the component and both shapes when they differ.
// String values are moved out of the elements.
Value stack_component(std::vector<Element>& elements, size_t component);
// Row `i` of a value's dimension 0 (a view for tensors).
Value slice_row(const Value& v, int64_t i);

// A prefetching wrapper: runs `input` on a background thread, `buffer` elements ahead
// (kAutotune: adaptive within the RAM budget). Used by prefetch and parallel interleave.
class PrefetchIterator : public IteratorImpl {
 public:
  PrefetchIterator(std::unique_ptr<IteratorImpl> input, int64_t buffer, const IterContext& ctx);
  ~PrefetchIterator() override;
  bool next(Element* out) override;
  // True when next() would not block (an element, the end or an error is ready).
  bool ready();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::data

namespace kiln::data {
// Node factories, one file each (src/data/dataset_*.cc).
NodePtr make_tensor_slices_node(Element components);
NodePtr make_tensors_node(Element components);
NodePtr make_range_node(int64_t start, int64_t stop, int64_t step);
NodePtr make_generator_node(ElementSpec spec, std::function<PullFn()> make_pass, int64_t cardinality, std::string name);
NodePtr make_list_files_node(std::vector<std::string> patterns, bool shuffle, uint64_t seed);
NodePtr make_zip_node(std::vector<NodePtr> inputs);
NodePtr make_map_node(NodePtr input, Dataset::MapFn fn, MapOptions options);
NodePtr make_filter_node(NodePtr input, Dataset::PredicateFn pred);
NodePtr make_shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle);
NodePtr make_batch_node(NodePtr input, int64_t batch_size, bool drop_remainder);
NodePtr make_padded_batch_node(NodePtr input, int64_t batch_size, std::vector<std::vector<int64_t>> padded_shapes,
                               std::vector<double> padding_values, bool drop_remainder);
NodePtr make_unbatch_node(NodePtr input);
NodePtr make_prefetch_node(NodePtr input, int64_t buffer_size);
NodePtr make_cache_node(NodePtr input, std::string filename);
NodePtr make_repeat_node(NodePtr input, int64_t count);
NodePtr make_take_node(NodePtr input, int64_t count);
NodePtr make_skip_node(NodePtr input, int64_t count);
NodePtr make_shard_node(NodePtr input, int64_t num_shards, int64_t index);
NodePtr make_interleave_node(NodePtr input, Dataset::InterleaveFn fn, InterleaveOptions options);
NodePtr make_options_node(NodePtr input, PipelineOptions options);
// The options a with_options node sets (nullptr for other nodes).
const PipelineOptions* options_of(const DatasetNode& node);
// The options of the with_options nearest to `node`'s end (depth first), or null.
const PipelineOptions* find_options(const DatasetNode& node);
}  // namespace kiln::data
