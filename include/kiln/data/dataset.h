#pragma once
// kiln::data::Dataset: a lazy, composable input pipeline in the manner of tf.data.
//
//   auto ds = Dataset::tfrecord({"train-*.tfrecord"})
//                 .map(parse_fn, {.num_parallel_calls = kAutotune})
//                 .shuffle(10000, 42)
//                 .batch(128, true)
//                 .prefetch(kAutotune);
//   for (const Element& batch : ds) model.train_step(...);
//
// A Dataset is an immutable description (cheap to copy, shareable between threads);
// iterator() starts one pass over it. Transformations return new Datasets.
//
// Threads: map with num_parallel_calls, interleave with num_parallel_calls and
// prefetch run work on background threads that belong to the iterator; destroying or
// cancel()ling the iterator stops and joins them. User functions (map, filter,
// interleave) may therefore run on several threads at once and must be thread-safe
// when a parallel transformation calls them.
//
// Errors: an exception thrown by a user function or a source surfaces at the consumer
// from Iterator::next(), with the same error code, a message naming the
// transformation and the index of the input element, and the original cause. After an
// error the iterator is finished (next() returns false), like a closed tf.data
// iterator; background work stops.
//
// AUTOTUNE (kAutotune) for num_parallel_calls, cycle_length and prefetch buffer sizes:
// parallelism is the pipeline's CPU budget (default: all hardware threads); prefetch
// buffers start at 1 and grow while the consumer finds them empty, up to what the RAM
// budget (default: 1/8 of physical memory shared by the pipeline's buffers) holds.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/data/value.h"

namespace kiln::data {

inline constexpr int64_t kAutotune = -1;
inline constexpr int64_t kInfiniteCardinality = -1;
inline constexpr int64_t kUnknownCardinality = -2;

// Resource limits for AUTOTUNE, set with Dataset::with_options (applies to the
// transformations upstream of it, and to those downstream unless they set their own).
// How Dataset::shard_for_worker splits a pipeline among data-parallel workers
// (tf.data.experimental.AutoShardPolicy).
enum class AutoShardPolicy : uint8_t {
  kAuto,  // by files where a list_files source has at least one file per worker, else by elements
  kFile,  // by files, or an InvalidArgumentError saying why not
  kData,  // by elements
  kOff,   // no sharding: every worker reads every global batch and takes its rows of it
};

struct PipelineOptions {
  int cpu_budget = 0;             // threads; 0: std::thread::hardware_concurrency()
  int64_t ram_budget_bytes = 0;   // prefetch/shuffle-free buffer bytes; 0: physical RAM / 8
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::kAuto;
};

// One worker's part of a pipeline of global batches (Dataset::shard_for_worker).
struct WorkerShard;

// One pass over a dataset. Not copyable; movable.
// Thread-safety: next() may be called from several threads at once (calls are
// serialized); cancel() may be called from any thread at any time.
class Iterator {
 public:
  class Impl;
  explicit Iterator(std::unique_ptr<Impl> impl);
  Iterator(Iterator&&) noexcept;
  Iterator& operator=(Iterator&&) noexcept;
  ~Iterator();

  // The next element, or false at the end (or after cancel()). Throws the pipeline's
  // error (see above) once; false after that.
  bool next(Element* out);
  std::optional<Element> next();
  // Stops background work and makes every later or blocked next() return false.
  void cancel();
  bool cancelled() const;

  // Range-for support: for (const Element& e : dataset) ...
  class Sentinel {};
  class Cursor {
   public:
    explicit Cursor(Iterator* it);
    const Element& operator*() const { return current_; }
    const Element* operator->() const { return &current_; }
    Cursor& operator++();
    bool operator==(Sentinel) const { return done_; }

   private:
    Iterator* it_;
    Element current_;
    bool done_ = false;
  };

 private:
  std::unique_ptr<Impl> impl_;
};

// What an element-producing pass looks like to the implementation: a pull function
// returning false at the end. Exposed so that sources can be written outside this
// file (see Dataset::from_generator).
using PullFn = std::function<bool(Element*)>;

class DatasetNode;  // the implementation (src/data/dataset_internal.h)

struct MapOptions {
  int64_t num_parallel_calls = 0;  // 0: in the consumer's thread; N threads; kAutotune
  bool deterministic = true;       // false: emit results in completion order
  // What fn returns, if known (a C++ function cannot be traced like a tf.function);
  // empty: element_spec() of the result is unknown (no components).
  ElementSpec output_spec = {};
};

struct InterleaveOptions {
  int64_t cycle_length = kAutotune;  // input elements open at once
  int64_t block_length = 1;          // consecutive elements taken from each
  int64_t num_parallel_calls = 0;    // 0: sequential; N or kAutotune: background threads
  bool deterministic = true;
  ElementSpec output_spec = {};      // what the datasets give, if known (see MapOptions)
};

class Dataset {
 public:
  using MapFn = std::function<Element(const Element&)>;
  using PredicateFn = std::function<bool(const Element&)>;
  using InterleaveFn = std::function<Dataset(const Element&)>;

  // ---- sources ----
  // Slices along dimension 0 of each component (all need the same size there).
  static Dataset from_tensor_slices(Element components);
  // One element: the components as they are.
  static Dataset from_tensors(Element components);
  // i64 scalars start, start+step, ... before stop (step != 0).
  static Dataset range(int64_t start, int64_t stop, int64_t step = 1);
  static Dataset range(int64_t stop) { return range(0, stop, 1); }
  // A source from a function that starts a pass: make_pass() is called per iterator
  // and returns the pull function of that pass. `spec` describes the elements and
  // `cardinality` their count if known.
  static Dataset from_generator(ElementSpec spec, std::function<PullFn()> make_pass,
                                int64_t cardinality = kUnknownCardinality, std::string name = "Generator");
  // File names (string scalars) matching glob patterns, sorted; with shuffle, in a
  // seeded random order per pass. NotFoundError when a pattern matches nothing.
  static Dataset list_files(std::vector<std::string> patterns, bool shuffle = false, uint64_t seed = 0);
  // Zips datasets: element i is the concatenation of their i-th elements (names kept
  // when all are named); ends with the shortest.
  static Dataset zip(std::vector<Dataset> datasets);

  // ---- transformations ----
  Dataset map(MapFn fn, MapOptions options = {}) const;
  Dataset filter(PredicateFn pred) const;
  // Uniform shuffling within a buffer of `buffer_size` elements. seed 0 draws one from
  // kiln's default generator when the Dataset is built. With reshuffle_each_iteration
  // every pass uses seed + pass number, otherwise every pass has the same order.
  Dataset shuffle(int64_t buffer_size, uint64_t seed = 0, bool reshuffle_each_iteration = true) const;
  // Stacks `batch_size` consecutive elements along a new dimension 0. All components
  // must have equal shapes within a batch (else InvalidArgumentError naming the
  // component and the two shapes: use padded_batch).
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  // Like batch, padding each component to `padded_shapes` (per component, -1: the
  // longest in the batch; empty vector: all -1) with `padding_values` (per component,
  // default 0 / "").
  Dataset padded_batch(int64_t batch_size, std::vector<std::vector<int64_t>> padded_shapes = {},
                       std::vector<double> padding_values = {}, bool drop_remainder = false) const;
  // Splits each element along dimension 0 (inverse of batch).
  Dataset unbatch() const;
  // Produces up to `buffer_size` elements ahead on a background thread.
  Dataset prefetch(int64_t buffer_size = kAutotune) const;
  // The first pass fills a cache, later passes read it. filename "": in memory;
  // otherwise files "<filename>.kcache" (+ an index) written atomically when a pass
  // completes, reused by later runs (a pass that stops early leaves no cache).
  Dataset cache(std::string filename = "") const;
  // count < 0: forever.
  Dataset repeat(int64_t count = -1) const;
  Dataset take(int64_t count) const;
  Dataset skip(int64_t count) const;
  // Every num_shards-th element starting at `index` (data-parallel workers).
  Dataset shard(int64_t num_shards, int64_t index) const;
  // Maps each element to a dataset and interleaves their elements.
  Dataset interleave(InterleaveFn fn, InterleaveOptions options = {}) const;
  // Sets the AUTOTUNE budgets (and the auto-shard policy) of this pipeline.
  Dataset with_options(PipelineOptions options) const;

  // ---- data-parallel workers ----
  // The part of this pipeline of global batches (its last batch() makes them) that
  // worker `index` of `num_workers` reads, as tf.distribute's auto-sharding does, by the
  // pipeline's auto_shard_policy (with_options; default kAuto):
  //  - by files: a shard(num_workers, index) after the list_files source under the
  //    batch (tfrecord_dataset's too): each worker reads its files only (at least one
  //    file per worker; a shuffled file list must have the same seed on every worker);
  //  - by elements: a shard(num_workers, index) right under the batch, below the
  //    ordered one-to-one transformations there (map, prefetch), which so run on the
  //    worker's elements only: global batch k of the pipeline is then exactly the union
  //    of the workers' batches k (worker i has its elements i, i+num_workers, ...), so
  //    training matches one process reading the global batches.
  // Either way the batch size becomes batch_size / num_workers (global batch = per-
  // worker batch x workers; a drop_remainder pipeline also keeps its number of batches).
  // Not sharded (`sharded` false, the pipeline returned whole, `how` says why): policy
  // kOff, one worker, no batch() reachable through single-input transformations, a
  // batch size that num_workers does not divide; with kFile those are errors
  // (InvalidArgumentError), as is a pipeline without enough files.
  WorkerShard shard_for_worker(int64_t num_workers, int64_t index) const;

  // ---- inspection and iteration ----
  // Empty (no components) when unknown, e.g. after a map without output_spec.
  const ElementSpec& element_spec() const;
  // Number of elements, kInfiniteCardinality or kUnknownCardinality.
  int64_t cardinality() const;
  // Starts a pass: for (const Element& e : ds.iterator()) ...
  Iterator iterator() const;
  // Starts pass number `pass`: reshuffling transformations (shuffle, list_files with
  // shuffle) seed this pass from `pass` instead of counting the passes made so far, so
  // pass p has the same order whatever ran before, in this process or another
  // (Model::fit uses the epoch, which makes a resumed run see the same batches).
  Iterator iterator(uint64_t pass) const;
  // The pipeline as text, one transformation per line (for logs and `kiln` tools).
  std::string describe() const;

  explicit Dataset(std::shared_ptr<const DatasetNode> node);
  const std::shared_ptr<const DatasetNode>& node() const { return node_; }

 private:
  std::shared_ptr<const DatasetNode> node_;
};

struct WorkerShard {
  Dataset dataset;
  bool sharded = false;  // false: `dataset` is the whole pipeline
  std::string how;       // what was done, or why not (for logs)
};

inline Iterator::Cursor begin(Iterator& it) { return Iterator::Cursor(&it); }
inline Iterator::Sentinel end(Iterator&) { return {}; }

}  // namespace kiln::data
