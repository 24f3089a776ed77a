// Model::train_step under a distribution strategy (kiln/distribute/strategy.h).
//
// Per step: the batch is split into one shard per replica; on every replica thread at
// once, forward + backward on its shard (its own traced function after the first
// step), an all-reduce of the gradients weighted by shard rows (the whole batch's mean
// gradient), the optimizer update of the replica's copies (its own traced update), and
// an all-reduce (mean) of the non-trainable float weights the forward changed
// (BatchNormalization's moving statistics), so the copies stay equal. Metrics see the
// whole global batch (across workers: the predictions are gathered, and the targets too
// when each worker passed its own part of the batch: fit on an auto-sharded Dataset).
#include <mutex>

#include "kiln/distribute/strategy.h"
#include "kiln/graph/function.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/shape.h"
#include "kiln/train/device_scope.h"
#include "kiln/train/model.h"

namespace kiln::train {

Logs Model::distributed_train_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y) {
  distribute::Strategy& strategy = *strategy_;
  const int n = strategy.num_local_replicas();
  if (x.empty() || y.empty()) throw InvalidArgumentError("train_step: a batch needs inputs and targets");
  std::vector<Tensor> batch = x;
  batch.insert(batch.end(), y.begin(), y.end());
  // The global batch, or (fit on an auto-sharded Dataset) this worker's part of it.
  const auto of = worker_batch_rows_ > 0 ? distribute::Strategy::BatchOf::kWorker : distribute::Strategy::BatchOf::kJob;
  std::vector<std::vector<Tensor>> shards = strategy.split_batch(batch, of);  // InvalidArgumentError: unequal rows
  const int64_t rows = worker_batch_rows_ > 0 ? worker_batch_rows_ : x[0].dim(0);  // the global batch's
  if (rows == 0) throw InvalidArgumentError("train_step: an empty batch");
  const std::vector<int64_t> shard_rows = strategy.shard_rows(x[0].dim(0), of);
  const size_t nx = x.size();
  // Synchronized statistics (BatchNormalization(synchronized)) make each replica's loss
  // depend on every replica's rows: the gradients are then those of the job's objective
  // only when each replica's objective carries its weight rows_r / rows itself (the
  // collectives' gradients sum the replicas' upstream gradients), and every replica must
  // run the model in every step.
  const bool syncs = syncs_replicas();
  if (syncs && rows < strategy.num_replicas_in_sync())
    throw InvalidArgumentError(detail::str_cat("train_step: a batch of ", rows, " rows for ",
                                               strategy.num_replicas_in_sync(),
                                               " replicas: synchronized batch statistics need a row on every replica"));

  if (replica_grad_fns_.empty()) {
    // Layers and optimizer slots are made once, on this thread (a layer built on the
    // replica threads would make one set of weights per replica), then mirrored.
    DeviceScope scope(device_);
    if (!built()) {
      if (x[0].dim(0) == 0)
        throw FailedPreconditionError(detail::str_cat("train_step: worker ", strategy.worker_rank(),
                                                      " has no rows of the first batch (the model is built from them)"));
      (*this)(std::vector<Tensor>(shards[0].begin(), shards[0].begin() + static_cast<std::ptrdiff_t>(nx)),
              /*training=*/false);
    }
    opts_.optimizer->build(trainable_weights());
    // Every worker must train the same model on the same batches.
    std::string config = detail::str_cat("batch of ", rows, " rows at epoch ", epoch_counter, " step ", step_in_epoch,
                                         " (iteration ", opts_.optimizer->iterations(), ");");
    for (const Tensor& t : batch) {  // per-sample shapes and dtypes
      config += " " + std::string(dtype_name(t.dtype())) + "[";
      for (int d = 1; d < t.rank(); ++d) config += std::to_string(t.dim(d)) + (d + 1 < t.rank() ? "," : "");
      config += "]";
    }
    for (const auto& [name, v] : named_weights())
      config += " " + name + ":" + std::string(dtype_name(v.dtype())) + v.shape().str();
    strategy.check_same_on_workers("model and batch", config);
    strategy.mirror(all_variables());
    replica_grad_fns_.assign(static_cast<size_t>(n), nullptr);
    replica_apply_fns_.assign(static_cast<size_t>(n), nullptr);
  }
  const bool traced = replica_grad_fns_[0] != nullptr;
  const std::pair<Tensor, Tensor> step_inputs = opts_.optimizer->step_inputs();
  const Tensor hyper = step_inputs.first, step_t = step_inputs.second;  // (clang captures no structured bindings)
  std::vector<Variable> synced;  // non-trainable float weights: averaged after each step
  for (const Variable& v : non_trainable_weights())
    if (v.dtype() == DType::kF32 || v.dtype() == DType::kF64) synced.push_back(v);

  std::vector<Tensor> losses(static_cast<size_t>(n));
  std::vector<std::vector<Tensor>> preds(static_cast<size_t>(n));
  // Eager updates and traces run the optimizer's host code, which keeps per-call state:
  // one replica at a time. Traced updates replay concurrently.
  std::mutex host_mu;
  strategy.run([&](distribute::ReplicaContext& ctx) {
    const size_t ri = static_cast<size_t>(ctx.local_replica_id());
    DeviceScope scope(ctx.device());
    const std::vector<Tensor>& shard = shards[ri];
    std::vector<Variable> vars = trainable_weights();
    const size_t nv = vars.size();
    const double weight = static_cast<double>(shard_rows[ri]) / static_cast<double>(rows);
    const Tensor in_graph = Tensor::scalar<float>(syncs ? static_cast<float>(weight) : 1.0f).to(ctx.device());
    // The gradients are all-reduced in buckets, the last layer's first (the order the
    // backward pass makes them), and the loss with them: position 0 the loss, position
    // 1 + k the gradient of variable nv - 1 - k. Synchronized statistics put collectives
    // in the pass itself: then the gradients are reduced after it.
    distribute::PendingAllReduce pending =
        ctx.start_all_reduce(nv + 1, distribute::ReduceOp::kSum, syncs ? 1.0 : weight, /*may_overlap=*/!syncs);
    auto give_loss = [&](const Tensor& loss) {
      Tensor l = loss.dtype() == DType::kF64 ? loss : loss.to(DType::kF32);  // the batch's mean over every replica
      if (syncs) l = ops::mul(l, ops::scalar(weight, l.dtype()));
      pending.give(0, l);
    };
    if (shard_rows[ri] == 0) {  // fewer rows than replicas: this one adds nothing
      give_loss(Tensor::zeros({}, DType::kF32, ctx.device()));
      for (size_t i = 0; i < nv; ++i) pending.give(nv - i, Tensor::zeros(vars[i].shape(), vars[i].dtype(), ctx.device()));
    } else if (traced) {
      std::vector<Tensor> args = shard;
      args.push_back(in_graph);
      // Each gradient goes to its bucket as soon as the replay has made it (outputs: the
      // loss, the gradients, the predictions).
      std::vector<Tensor> out = (*replica_grad_fns_[ri])(args, [&](size_t k, const Tensor& t) {
        if (k == 0) give_loss(t);
        else if (k <= nv) pending.give(nv + 1 - k, t);
      });
      preds[ri].assign(out.begin() + 1 + static_cast<std::ptrdiff_t>(nv), out.end());
    } else {
      std::vector<Tensor> xs(shard.begin(), shard.begin() + static_cast<std::ptrdiff_t>(nx));
      std::vector<Tensor> ys(shard.begin() + static_cast<std::ptrdiff_t>(nx), shard.end());
      Gradients g = gradients(xs, ys, syncs ? in_graph : Tensor());
      give_loss(g.loss);
      preds[ri] = g.preds;
      for (size_t i = 0; i < nv; ++i)  // (zeros for a weight the loss does not reach)
        pending.give(nv - i, g.grads[i].defined() ? g.grads[i] : Tensor::zeros(vars[i].shape(), vars[i].dtype(), ctx.device()));
    }
    std::vector<Tensor> reduced = pending.wait();
    losses[ri] = reduced[0];
    std::vector<Tensor> grads(nv);
    for (size_t i = 0; i < nv; ++i) grads[i] = std::move(reduced[nv - i]);
    if (traced) {
      std::vector<Tensor> args = grads;
      args.push_back(hyper.to(ctx.device()));
      args.push_back(step_t.to(ctx.device()));
      auto& fn = *replica_apply_fns_[ri];
      if (fn.num_traces() == 0) {
        std::lock_guard<std::mutex> lock(host_mu);
        fn(args);
      } else {
        fn(args);
      }
    } else {
      std::lock_guard<std::mutex> lock(host_mu);
      opts_.optimizer->apply_gradients(grads, vars);
    }
    if (!synced.empty()) {
      std::vector<Tensor> values;
      for (const Variable& v : synced) values.push_back(v.peek());
      ctx.all_reduce(values, distribute::ReduceOp::kMean);
      for (size_t i = 0; i < synced.size(); ++i) synced[i].assign(values[i]);
    }
  });

  if (!traced && !opts_.run_eagerly && opts_.optimizer->traceable()) {
    // Trace from the next step, as train_step does: one pair of functions per replica.
    const size_t nv = trainable_weights().size();
    for (int r = 0; r < n; ++r) {
      FunctionOptions fn_opts;
      fn_opts.name = name() + "_train_step_replica" + std::to_string(r);
      replica_grad_fns_[static_cast<size_t>(r)] = std::make_shared<Function>(
          [this, nx](const std::vector<Tensor>& a) {  // inputs, targets, the objective's weight (synchronized statistics)
            std::vector<Tensor> xs(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(nx));
            std::vector<Tensor> ys(a.begin() + static_cast<std::ptrdiff_t>(nx), a.end() - 1);
            Gradients g = gradients(xs, ys, syncs_replicas() ? a.back() : Tensor());
            std::vector<Tensor> out{g.loss};
            for (size_t i = 0; i < g.grads.size(); ++i)
              out.push_back(g.grads[i].defined() ? g.grads[i] : ops::zeros_like(g.vars[i].peek()));
            out.insert(out.end(), g.preds.begin(), g.preds.end());
            return out;
          },
          fn_opts);
      fn_opts.name = name() + "_apply_replica" + std::to_string(r);
      replica_apply_fns_[static_cast<size_t>(r)] = std::make_shared<Function>(
          [this, nv](const std::vector<Tensor>& a) {
            std::vector<Tensor> grads(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(nv));
            opts_.optimizer->apply_gradients_traced(grads, trainable_weights(), a[nv], a[nv + 1]);
            return std::vector<Tensor>{};  // the update is the function's variable assignments
          },
          fn_opts);
    }
  } else if (traced) {
    ++traced_steps_;
  }

  Logs logs;
  if (strategy.num_workers() == 1) {
    for (size_t ri = 0; ri < static_cast<size_t>(n); ++ri)
      if (shard_rows[ri] > 0)
        for (auto& m : metrics_) m->update(shards[ri][nx], preds[ri].at(0));
  } else if (!metrics_.empty()) {
    // Metrics of the global batch on every worker: the job's predictions, gathered.
    std::vector<Tensor> mine;
    for (size_t ri = 0; ri < static_cast<size_t>(n); ++ri)
      if (shard_rows[ri] > 0) mine.push_back(preds[ri].at(0).to(Device::cpu()));
    const Tensor local = mine.empty() ? Tensor() : mine.size() == 1 ? mine[0] : ops::concat(mine, 0);
    const Tensor all = strategy.all_gather_rows(local);
    // Each worker's own targets when it passed its part of the batch.
    const Tensor labels = of == distribute::Strategy::BatchOf::kJob ? y.at(0)
                          : strategy.all_gather_rows(x[0].dim(0) > 0 ? y.at(0) : Tensor());
    for (auto& m : metrics_) m->update(labels, all);
  }
  logs["loss"] = losses[0].item<double>();
  return logs;
}

}  // namespace kiln::train
