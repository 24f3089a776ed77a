// Dataset::shard_for_worker: auto-sharding a pipeline of global batches among
// data-parallel workers (include/kiln/data/dataset.h), as tf.distribute rewrites a
// tf.data graph: find the last batch, insert a shard below it (after the file list, or
// under the batch's ordered one-to-one transformations), make the batch
// batch_size / workers, and rebuild every transformation above the shard from its
// recipe (dataset_internal.h).
#include "dataset_internal.h"

namespace kiln::data {
namespace {

// `path` runs from a node down to (not including) `bottom`'s old input: rebuilds it on
// `bottom` from the lowest node up; returns the top.
NodePtr rebuild(const std::vector<NodePtr>& path, NodePtr bottom) {
  for (auto it = path.rbegin(); it != path.rend(); ++it) bottom = (*it)->recipe().remake(std::move(bottom));
  return bottom;
}

// Follows single-input transformations down from `node` while `more` holds for the
// node reached; the nodes passed over are appended to `path`; returns where it stopped.
template <class More>
NodePtr descend(NodePtr node, std::vector<NodePtr>* path, More more) {
  while (more(*node) && node->inputs().size() == 1 && node->recipe().remake) {
    path->push_back(node);
    node = node->inputs()[0];
  }
  return node;
}

const char* policy_name(AutoShardPolicy p) {
  switch (p) {
    case AutoShardPolicy::kAuto: return "AUTO";
    case AutoShardPolicy::kFile: return "FILE";
    case AutoShardPolicy::kData: return "DATA";
    case AutoShardPolicy::kOff: return "OFF";
  }
  return "?";
}

}  // namespace

WorkerShard Dataset::shard_for_worker(int64_t num_workers, int64_t index) const {
  KILN_CHECK_ARG(num_workers >= 1, "shard_for_worker: num_workers must be >= 1, got ", num_workers);
  KILN_CHECK_ARG(index >= 0 && index < num_workers, "shard_for_worker: index must be in [0, ", num_workers, "), got ",
                 index);
  const PipelineOptions* options = find_options(*node_);
  const AutoShardPolicy policy = options ? options->auto_shard_policy : AutoShardPolicy::kAuto;
  auto whole = [&](const std::string& why) {
    if (policy == AutoShardPolicy::kFile)
      throw InvalidArgumentError("shard_for_worker: auto_shard_policy FILE, but " + why);
    return WorkerShard{*this, false, "not sharded: " + why + " (every worker reads every global batch)"};
  };
  if (num_workers == 1) return WorkerShard{*this, false, "not sharded: one worker"};
  if (policy == AutoShardPolicy::kOff) return whole("auto_shard_policy is OFF");

  // The last batch: every transformation above it is rebuilt on the new one.
  std::vector<NodePtr> above;
  const NodePtr batch = descend(node_, &above, [](const DatasetNode& n) { return n.recipe().batch_size == 0; });
  const NodeRecipe& b = batch->recipe();
  if (b.batch_size == 0) return whole("no batch() reachable from the pipeline's end through single-input transformations");
  if (b.batch_size % num_workers != 0)
    return whole(detail::str_cat("the batch size ", b.batch_size, " does not divide among ", num_workers, " workers"));
  const int64_t per_worker = b.batch_size / num_workers;
  auto finish = [&](NodePtr below_batch, std::string how) {
    NodePtr top = b.rebatch(std::move(below_batch), per_worker);
    // drop_remainder: as many batches as the global pipeline has (the first workers may
    // have enough elements left over for one more).
    if (b.drop_remainder && batch->cardinality() >= 0) top = make_take_node(std::move(top), batch->cardinality());
    return WorkerShard{Dataset(rebuild(above, std::move(top))), true,
                       detail::str_cat(how, "; batch ", b.batch_size, " -> ", per_worker, " per worker")};
  };

  if (policy == AutoShardPolicy::kAuto || policy == AutoShardPolicy::kFile) {
    std::vector<NodePtr> path;  // from the batch's input down to the file list
    const NodePtr files = descend(batch->inputs()[0], &path, [](const DatasetNode& n) { return !n.recipe().file_list; });
    if (files->recipe().file_list) {
      const int64_t n = files->cardinality();
      if (n >= num_workers)
        return finish(rebuild(path, make_shard_node(files, num_workers, index)),
                      detail::str_cat("by files (", policy_name(policy), "): worker ", index, " reads files ", index, ", ",
                                      index + num_workers, ", ... of ", n));
      if (policy == AutoShardPolicy::kFile)
        return whole(detail::str_cat("the pipeline has ", n, " files for ", num_workers, " workers"));
    } else if (policy == AutoShardPolicy::kFile) {
      return whole("no list_files source under the batch");
    }
  }
  // By elements: under the batch, below its ordered one-to-one transformations.
  std::vector<NodePtr> path;
  const NodePtr at = descend(batch->inputs()[0], &path, [](const DatasetNode& n) { return n.recipe().one_to_one; });
  return finish(rebuild(path, make_shard_node(at, num_workers, index)),
                detail::str_cat("by elements (", policy_name(policy), "): worker ", index, " takes elements ", index, ", ",
                                index + num_workers, ", ... of every global batch, after ", at->name()));
}

}  // namespace kiln::data
