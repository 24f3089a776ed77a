// The Dataset facade, the public Iterator, and the pipeline-wide state.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "dataset_internal.h"

namespace kiln::data {

// ---- PipelineState ----

void PipelineState::cancel() {
  cancelled_.store(true, std::memory_order_release);
  // Under the lock: a component unregisters (in its destructor) before it goes, so no
  // callback runs on a destroyed component. Callbacks only lock their component's
  // mutex, and no thread holding one calls into this class.
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [h, fn] : callbacks_) fn();
}

int64_t PipelineState::on_cancel(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  callbacks_.emplace_back(next_handle_, std::move(fn));
  return next_handle_++;
}

void PipelineState::unregister(int64_t handle) {
  std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(callbacks_, [&](const auto& p) { return p.first == handle; });
}

// ---- helpers ----

void rethrow_with_context(const std::string& where) {
  try {
    throw;
  } catch (const Error& e) {
    throw Error(e.code(), where + ": " + e.message());
  } catch (const std::exception& e) {
    throw InvalidArgumentError(where + ": " + e.what());
  } catch (...) {
    throw InvalidArgumentError(where + ": unknown exception");
  }
}

void init_pipeline_thread(const char* name) { ::pthread_setname_np(::pthread_self(), name); }

int resolve_parallelism(int64_t requested, const IterContext& ctx, const char* what) {
  if (requested == kAutotune) return ctx.cpu_budget;
  KILN_CHECK_ARG(requested >= 0, what, " must be >= 0 or kAutotune, got ", requested);
  return static_cast<int>(std::min<int64_t>(requested, 1024));
}

// ---- Iterator ----

class Iterator::Impl {
 public:
  Impl(NodePtr node, std::shared_ptr<PipelineState> state, std::unique_ptr<IteratorImpl> root)
      : node_(std::move(node)), state_(std::move(state)), root_(std::move(root)) {}
  ~Impl() {
    // Wake and stop every background thread before the iterators are destroyed.
    state_->cancel();
    root_.reset();
  }

  bool next(Element* out) {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_ || state_->cancelled()) return false;
    try {
      if (root_->next(out)) return true;
      done_ = true;
      return false;
    } catch (...) {
      done_ = true;
      state_->cancel();
      throw;
    }
  }
  void cancel() { state_->cancel(); }
  bool cancelled() const { return state_->cancelled(); }

 private:
  std::mutex mu_;
  bool done_ = false;
  NodePtr node_;  // iterators point into their nodes: keep them alive
  std::shared_ptr<PipelineState> state_;
  std::unique_ptr<IteratorImpl> root_;
};

Iterator::Iterator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Iterator::Iterator(Iterator&&) noexcept = default;
Iterator& Iterator::operator=(Iterator&&) noexcept = default;
Iterator::~Iterator() = default;

bool Iterator::next(Element* out) { return impl_ && impl_->next(out); }
std::optional<Element> Iterator::next() {
  Element e;
  if (!next(&e)) return std::nullopt;
  return e;
}
void Iterator::cancel() {
  if (impl_) impl_->cancel();
}
bool Iterator::cancelled() const { return impl_ && impl_->cancelled(); }

Iterator::Cursor::Cursor(Iterator* it) : it_(it) { ++*this; }
Iterator::Cursor& Iterator::Cursor::operator++() {
  done_ = !it_->next(&current_);
  return *this;
}

// ---- Dataset ----

const PipelineOptions* find_options(const DatasetNode& node) {
  if (const auto* o = options_of(node)) return o;
  for (const auto& in : node.inputs())
    if (const auto* o = find_options(*in)) return o;
  return nullptr;
}

IterContext resolve_context(const PipelineOptions& o, std::shared_ptr<PipelineState> state) {
  IterContext ctx;
  ctx.state = std::move(state);
  ctx.cpu_budget = o.cpu_budget > 0 ? o.cpu_budget : std::max(1u, std::thread::hardware_concurrency());
  if (o.ram_budget_bytes > 0) {
    ctx.ram_budget_bytes = o.ram_budget_bytes;
  } else {
    long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    ctx.ram_budget_bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page / 8 : int64_t{1} << 30;
  }
  return ctx;
}

namespace {

// `node`, just made and not shared yet, remembering how it was made.
NodePtr remember(NodePtr node, NodeRecipe recipe) {
  const_cast<DatasetNode&>(*node).set_recipe(std::move(recipe));
  return node;
}
// A node made by `recipe.remake` on `input`, which remembers the recipe.
NodePtr made(const NodePtr& input, NodeRecipe recipe) {
  NodePtr node = recipe.remake(input);
  return remember(std::move(node), std::move(recipe));
}

}  // namespace

Dataset::Dataset(std::shared_ptr<const DatasetNode> node) : node_(std::move(node)) {
  KILN_CHECK_INTERNAL(node_ != nullptr, "null dataset node");
}

Dataset Dataset::from_tensor_slices(Element components) {
  return Dataset(make_tensor_slices_node(std::move(components)));
}
Dataset Dataset::from_tensors(Element components) { return Dataset(make_tensors_node(std::move(components))); }
Dataset Dataset::range(int64_t start, int64_t stop, int64_t step) {
  return Dataset(make_range_node(start, stop, step));
}
Dataset Dataset::from_generator(ElementSpec spec, std::function<PullFn()> make_pass, int64_t cardinality,
                                std::string name) {
  return Dataset(make_generator_node(std::move(spec), std::move(make_pass), cardinality, std::move(name)));
}
Dataset Dataset::list_files(std::vector<std::string> patterns, bool shuffle, uint64_t seed) {
  return Dataset(remember(make_list_files_node(std::move(patterns), shuffle, seed), {.file_list = true}));
}
Dataset Dataset::zip(std::vector<Dataset> datasets) {
  std::vector<NodePtr> nodes;
  for (auto& d : datasets) nodes.push_back(d.node_);
  return Dataset(make_zip_node(std::move(nodes)));
}

Dataset Dataset::map(MapFn fn, MapOptions options) const {
  KILN_CHECK_ARG(fn != nullptr, "map: the function is empty");
  const bool ordered = options.num_parallel_calls == 0 || options.deterministic;
  return Dataset(made(node_, {.remake = [fn = std::move(fn), options](NodePtr in) {
                                return make_map_node(std::move(in), fn, options);
                              },
                              .one_to_one = ordered}));
}
Dataset Dataset::filter(PredicateFn pred) const {
  KILN_CHECK_ARG(pred != nullptr, "filter: the predicate is empty");
  return Dataset(made(node_, {.remake = [pred = std::move(pred)](NodePtr in) {
                                return make_filter_node(std::move(in), pred);
                              }}));
}
Dataset Dataset::shuffle(int64_t buffer_size, uint64_t seed, bool reshuffle_each_iteration) const {
  return Dataset(made(node_, {.remake = [=](NodePtr in) {
                                return make_shuffle_node(std::move(in), buffer_size, seed, reshuffle_each_iteration);
                              }}));
}
Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  auto rebatch = [drop_remainder](NodePtr in, int64_t b) { return make_batch_node(std::move(in), b, drop_remainder); };
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return rebatch(std::move(in), batch_size); },
                              .rebatch = rebatch,
                              .batch_size = batch_size,
                              .drop_remainder = drop_remainder}));
}
Dataset Dataset::padded_batch(int64_t batch_size, std::vector<std::vector<int64_t>> padded_shapes,
                              std::vector<double> padding_values, bool drop_remainder) const {
  auto rebatch = [padded_shapes = std::move(padded_shapes), padding_values = std::move(padding_values),
                  drop_remainder](NodePtr in, int64_t b) {
    return make_padded_batch_node(std::move(in), b, padded_shapes, padding_values, drop_remainder);
  };
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return rebatch(std::move(in), batch_size); },
                              .rebatch = rebatch,
                              .batch_size = batch_size,
                              .drop_remainder = drop_remainder}));
}
Dataset Dataset::unbatch() const { return Dataset(made(node_, {.remake = make_unbatch_node})); }
Dataset Dataset::prefetch(int64_t buffer_size) const {
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return make_prefetch_node(std::move(in), buffer_size); },
                              .one_to_one = true}));
}
Dataset Dataset::cache(std::string filename) const {
  return Dataset(made(node_, {.remake = [f = std::move(filename)](NodePtr in) { return make_cache_node(std::move(in), f); }}));
}
Dataset Dataset::repeat(int64_t count) const {
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return make_repeat_node(std::move(in), count); }}));
}
Dataset Dataset::take(int64_t count) const {
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return make_take_node(std::move(in), count); }}));
}
Dataset Dataset::skip(int64_t count) const {
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return make_skip_node(std::move(in), count); }}));
}
Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return make_shard_node(std::move(in), num_shards, index); }}));
}
Dataset Dataset::interleave(InterleaveFn fn, InterleaveOptions options) const {
  KILN_CHECK_ARG(fn != nullptr, "interleave: the function is empty");
  return Dataset(made(node_, {.remake = [fn = std::move(fn), options](NodePtr in) {
                                return make_interleave_node(std::move(in), fn, options);
                              }}));
}
Dataset Dataset::with_options(PipelineOptions options) const {
  KILN_CHECK_ARG(options.cpu_budget >= 0 && options.ram_budget_bytes >= 0,
                 "with_options: budgets must be >= 0 (0: default), got cpu_budget=", options.cpu_budget,
                 " ram_budget_bytes=", options.ram_budget_bytes);
  return Dataset(made(node_, {.remake = [=](NodePtr in) { return make_options_node(std::move(in), options); }}));
}

const ElementSpec& Dataset::element_spec() const { return node_->spec(); }
int64_t Dataset::cardinality() const { return node_->cardinality(); }

namespace {
Iterator start(const NodePtr& node, std::optional<uint64_t> pass) {
  const PipelineOptions* found = find_options(*node);
  IterContext ctx = resolve_context(found ? *found : PipelineOptions{}, std::make_shared<PipelineState>());
  ctx.pass = pass;
  auto root = node->make(ctx);
  return Iterator(std::make_unique<Iterator::Impl>(node, ctx.state, std::move(root)));
}
}  // namespace

Iterator Dataset::iterator() const { return start(node_, std::nullopt); }
Iterator Dataset::iterator(uint64_t pass) const { return start(node_, pass); }

std::string Dataset::describe() const {
  std::string out;
  // Inputs first, so that the text reads in data-flow order.
  std::function<void(const DatasetNode&, int)> walk = [&](const DatasetNode& n, int depth) {
    for (const auto& in : n.inputs()) walk(*in, depth + (n.inputs().size() > 1 ? 1 : 0));
    out += std::string(static_cast<size_t>(depth) * 2, ' ') + n.name();
    std::string p = n.params();
    if (!p.empty()) out += "(" + p + ")";
    out += "  -> " + n.spec().str();
    int64_t c = n.cardinality();
    out += c == kInfiniteCardinality ? "  [infinite]" : c == kUnknownCardinality ? "" : "  [" + std::to_string(c) + "]";
    out += "\n";
  };
  walk(*node_, 0);
  return out;
}

}  // namespace kiln::data
