#include "kiln/train/model.h"
#include "kiln/train/device_scope.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "kiln/autodiff/tape.h"
#include "kiln/core/parallel.h"
#include "kiln/distribute/strategy.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "train_util.h"

namespace kiln::train {

const std::vector<double>& History::at(const std::string& key) const {
  auto it = history.find(key);
  if (it == history.end()) throw NotFoundError("History has no key '" + key + "'");
  return it->second;
}

Model::Model(std::string name) : Layer(std::move(name)) {
  outputs_in_variable_dtype_ = true;  // losses and metrics see f32 under mixed precision
}

void Model::output_layer_in_float32(Layer& layer) {
  // Keras' advice for mixed precision, applied by default: the last layer (its
  // activation, softmax included) computes in f32.
  if (layer.policy_.is_mixed() && !layer.policy_explicit_) layer.policy_ = DTypePolicy();
}

std::shared_ptr<Model> Model::functional(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs,
                                         std::string name) {
  std::shared_ptr<Model> m(new Model(std::move(name)));
  m->init_graph(std::move(inputs), std::move(outputs));
  return m;
}

void Model::init_graph(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs) {
  if (inputs.empty() || outputs.empty())
    throw InvalidArgumentError("Model '" + name() + "': a functional model needs at least one input and one output");
  std::set<const SymbolicTensor::Node*> input_nodes;
  for (auto& in : inputs) {
    if (!in.defined() || in.node()->layer)
      throw InvalidArgumentError("Model '" + name() + "': inputs must be made with kiln::train::Input()");
    input_nodes.insert(in.node().get());
  }
  // Post-order DFS from the outputs gives a topological order.
  std::set<const SymbolicTensor::Node*> seen;
  std::function<void(const std::shared_ptr<SymbolicTensor::Node>&)> visit =
      [&](const std::shared_ptr<SymbolicTensor::Node>& n) {
        if (!seen.insert(n.get()).second) return;
        if (!n->layer) {
          if (!input_nodes.count(n.get()))
            throw InvalidArgumentError("Model '" + name() + "': output depends on an Input ('" + n->input_name +
                                       "') that is not among the model's inputs");
          return;
        }
        for (auto& in : n->inputs) visit(in.node());
        order_.push_back(n);
      };
  for (auto& out : outputs) {
    if (!out.defined()) throw InvalidArgumentError("Model '" + name() + "': an output is undefined");
    visit(out.node());
  }
  for (auto& out : outputs) {
    if (!out.node()->layer) continue;
    output_layer_in_float32(*out.node()->layer);
    for (DType& t : out.node()->dtypes)
      if (t == DType::kBF16 || t == DType::kF16) t = DType::kF32;
  }
  inputs_ = std::move(inputs);
  outputs_ = std::move(outputs);
  std::set<const Layer*> tracked;
  for (auto& n : order_)
    if (tracked.insert(n->layer.get()).second) track(n->layer);
  uniquify_names();
  built_ = true;
}

void Model::uniquify_names() {
  std::set<std::string> used;
  for (auto& l : sublayers())
    if (!l->has_auto_name()) used.insert(l->name());
  std::map<std::string, int> next;
  for (auto& l : sublayers()) {
    if (!l->has_auto_name()) continue;
    const std::string base = snake_case(l->type());
    std::string n;
    do {
      int c = next[base]++;
      n = c == 0 ? base : base + "_" + std::to_string(c);
    } while (used.count(n));
    l->set_name(n);
    used.insert(n);
  }
}

std::vector<LayerPtr> Model::layers() const { return sublayers(); }

std::vector<Tensor> Model::call(const std::vector<Tensor>& inputs, bool training) {
  if (!is_functional()) throw UnimplementedError("Model '" + name() + "': subclasses must override call()");
  std::unordered_map<const SymbolicTensor::Node*, std::vector<Tensor>> values;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Shape& want = inputs_[i].shape();
    const Tensor& x = inputs[i];
    bool ok = x.rank() == want.rank();
    for (int d = 1; ok && d < want.rank(); ++d) ok = want.dim(d) < 0 || want.dim(d) == x.dim(d);
    if (!ok)
      throw InvalidArgumentError("Model '" + name() + "': input " + std::to_string(i) + " should be " +
                                 shape_str(want) + ", got " + x.desc());
    values[inputs_[i].node().get()] = {x};
  }
  for (auto& n : order_) {
    std::vector<Tensor> ins;
    ins.reserve(n->inputs.size());
    for (auto& s : n->inputs) ins.push_back(values.at(s.node().get()).at(s.index()));
    values[n.get()] = (*n->layer)(ins, training);
  }
  std::vector<Tensor> outs;
  for (auto& o : outputs_) outs.push_back(values.at(o.node().get()).at(o.index()));
  return outs;
}

// ---- compile / train_step ------------------------------------------------------

void Model::compile(CompileOptions opts) {
  if (!opts.optimizer) throw InvalidArgumentError("Model::compile: no optimizer given");
  if (opts.loss.empty()) throw InvalidArgumentError("Model::compile: no loss given");
  for (auto& l : opts.loss)
    if (!l) throw InvalidArgumentError("Model::compile: a loss is null");
  metrics_.clear();
  const std::string loss_name = opts.loss[0]->name();
  for (const std::string& m : opts.metrics) metrics_.push_back(resolve_metric(m, loss_name));
  for (auto& m : opts.metric_objects) metrics_.push_back(m);
  if (!opts.precision.empty()) {
    const DTypePolicy policy(opts.precision);  // throws on an unknown name
    std::function<void(Layer&)> apply = [&](Layer& l) {
      if (!l.policy_explicit_) l.policy_ = policy;
      for (const LayerPtr& s : l.sublayers_) apply(*s);
    };
    apply(*this);
    if (is_functional()) {
      for (auto& out : outputs_)
        if (out.node()->layer) output_layer_in_float32(*out.node()->layer);
    } else if (auto* seq = dynamic_cast<Sequential*>(this); seq && !seq->stack().empty()) {
      output_layer_in_float32(*seq->stack().back());
    }
  }
  // Keras: a mixed_float16 model trains with dynamic loss scaling.
  if (dtype_policy().name() == "mixed_float16" && !dynamic_cast<LossScaleOptimizer*>(opts.optimizer.get()))
    opts.optimizer = std::make_shared<LossScaleOptimizer>(opts.optimizer);
  Device device = Device::cpu();
  if (!opts.device.empty()) {
    device = parse_device(opts.device);  // InvalidArgumentError
    if (device.type != DeviceType::kCPU) backend_for(device);  // NotFoundError: no such device, and why
  }
  if (!opts.strategy) opts.strategy = distribute::StrategyScope::current();
  if (opts.strategy) {
    const Device first = opts.strategy->devices().at(0);
    if (!opts.device.empty() && device != first)
      throw InvalidArgumentError("Model::compile: device " + device.str() + " is not the strategy's first device " +
                                 first.str() + " (a strategy places the model on its devices)");
    device = first;
  }
  // Variables of an earlier strategy go back to one copy before anything moves.
  if (strategy_) for (const Variable& v : all_variables()) v.mirror({});
  opts_ = std::move(opts);
  compiled_ = true;
  train_fn_.reset();  // a new optimizer or loss: trace again
  predict_fn_.reset();  // a new policy or run_eagerly: likewise
  replica_grad_fns_.clear();
  replica_apply_fns_.clear();
  strategy_ = opts_.strategy;
  device_ = device;
  // Weights, and the optimizer's iterations and slots: a traced step runs on one device.
  for (const Variable& v : all_variables())
    if (v.peek().device() != device_) v.assign(v.peek().to(device_));
}

std::vector<Variable> Model::all_variables() const {
  std::vector<Variable> vars = weights();
  if (opts_.optimizer) {
    for (const Variable& v : opts_.optimizer->variables()) vars.push_back(v);
    for (const Variable& v : opts_.optimizer->state_variables()) vars.push_back(v);
  }
  return vars;
}

std::vector<Tensor> Model::on_device(const std::vector<Tensor>& ts) const {
  std::vector<Tensor> out = ts;
  for (Tensor& t : out)
    if (t.defined() && t.device() != device_) t = t.to(device_);
  return out;
}

namespace {
void require_compiled(const Model& m, bool compiled, const char* what) {
  if (!compiled) throw FailedPreconditionError(std::string("Model '") + m.name() + "': call compile() before " + what);
}
}  // namespace

Tensor Model::total_loss(const std::vector<Tensor>& y, const std::vector<Tensor>& preds) {
  if (y.size() != preds.size())
    throw InvalidArgumentError("Model '" + name() + "' has " + std::to_string(preds.size()) + " outputs but " +
                               std::to_string(y.size()) + " targets were given");
  Tensor total;
  for (size_t i = 0; i < preds.size(); ++i) {
    const LossPtr& loss = opts_.loss.size() == 1 ? opts_.loss[0] : opts_.loss.at(i);
    Tensor li = (*loss)(y[i], preds[i]);
    if (i < opts_.loss_weights.size() && opts_.loss_weights[i] != 1) li = li * opts_.loss_weights[i];
    total = total.defined() ? total + li : li;
  }
  return total;
}

Model::Gradients Model::gradients(const std::vector<Tensor>& x, const std::vector<Tensor>& y, const Tensor& weight) {
  Gradients g;
  GradientTape tape;
  g.preds = (*this)(x, /*training=*/true);
  g.loss = total_loss(y, g.preds);
  Tensor objective = g.loss;
  for (const Tensor& r : regularization_losses()) objective = objective + r;
  if (weight.defined()) objective = ops::mul(objective, ops::cast(weight, objective.dtype()));
  g.vars = trainable_weights();
  g.grads = tape.gradient(opts_.optimizer->scale_loss(objective), g.vars);
  return g;
}

std::pair<Tensor, std::vector<Tensor>> Model::step(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                                   const Tensor& hyper, const Tensor& iteration) {
  Gradients g = gradients(x, y);
  if (hyper.defined())
    opts_.optimizer->apply_gradients_traced(g.grads, g.vars, hyper, iteration);
  else
    opts_.optimizer->apply_gradients(g.grads, g.vars);
  return {g.loss, g.preds};
}

int Model::num_train_traces() const {
  if (!replica_grad_fns_.empty()) return replica_grad_fns_[0] ? replica_grad_fns_[0]->num_traces() : 0;
  return train_fn_ ? train_fn_->num_traces() : 0;
}

Logs Model::train_step(const std::vector<Tensor>& x_in, const std::vector<Tensor>& y_in) {
  require_compiled(*this, compiled_, "training");
  if (strategy_) return distributed_train_step(x_in, y_in);
  DeviceScope scope(device_);
  const std::vector<Tensor> x = on_device(x_in), y = on_device(y_in);
  Tensor loss;
  std::vector<Tensor> preds;
  if (train_fn_) {
    // Arguments: inputs, targets, (lr, step) as f64[2], step as i64.
    auto [hyper, step_t] = opts_.optimizer->step_inputs();
    std::vector<Tensor> args = x;
    args.insert(args.end(), y.begin(), y.end());
    // On the model's device: tracing runs the step eagerly on these very arguments.
    args.push_back(hyper.to(device_));
    args.push_back(step_t.to(device_));
    std::vector<Tensor> out = (*train_fn_)(args);
    loss = out[0];
    preds.assign(out.begin() + 1, out.end());
    ++traced_steps_;
  } else {
    std::tie(loss, preds) = step(x, y);
    // The first step built the layers and the optimizer's slots (creating variables
    // inside a trace would capture their initialisers): trace from the next one.
    if (!opts_.run_eagerly && opts_.optimizer->traceable()) {
      const size_t nx = x.size();
      FunctionOptions fn_opts;
      fn_opts.name = name() + "_train_step";
      train_fn_ = std::make_shared<Function>(
          [this, nx](const std::vector<Tensor>& a) {
            const size_t ny = a.size() - nx - 2;
            std::vector<Tensor> xs(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(nx));
            std::vector<Tensor> ys(a.begin() + static_cast<std::ptrdiff_t>(nx),
                                   a.begin() + static_cast<std::ptrdiff_t>(nx + ny));
            auto [l, p] = step(xs, ys, a[nx + ny], a[nx + ny + 1]);
            std::vector<Tensor> out{l};
            out.insert(out.end(), p.begin(), p.end());
            return out;
          },
          fn_opts);
    }
  }
  Logs logs;
  logs["loss"] = loss.item<double>();
  for (auto& m : metrics_) m->update(y.at(0), preds.at(0));
  return logs;
}

// ---- fit / evaluate / predict ---------------------------------------------------

History Model::fit(const std::vector<Tensor>& x_in, const std::vector<Tensor>& y_in, FitOptions opts) {
  require_compiled(*this, compiled_, "fit()");
  if (opts.epochs < 0 || opts.batch_size <= 0)
    throw InvalidArgumentError("fit: epochs must be >= 0 and batch_size > 0, got epochs=" +
                               std::to_string(opts.epochs) + " batch_size=" + std::to_string(opts.batch_size));
  if (opts.validation_split < 0 || opts.validation_split >= 1)
    throw InvalidArgumentError("fit: validation_split must be in [0, 1), got " + std::to_string(opts.validation_split));
  const int64_t n_all = check_batch_dims(x_in, y_in, "fit");
  std::vector<Tensor> x = x_in, y = y_in, vx = opts.validation_x, vy = opts.validation_y;
  if (!vx.empty() || !vy.empty()) check_batch_dims(vx, vy, "fit (validation data)");
  int64_t n = n_all;
  if (opts.validation_split > 0 && vx.empty()) {
    int64_t n_val = static_cast<int64_t>(static_cast<double>(n_all) * opts.validation_split);
    n = n_all - n_val;
    if (n <= 0 || n_val <= 0)
      throw InvalidArgumentError("fit: validation_split " + std::to_string(opts.validation_split) + " of " +
                                 std::to_string(n_all) + " samples leaves an empty training or validation set");
    vx = take_rows(x_in, n, n_all);
    vy = take_rows(y_in, n, n_all);
    x = take_rows(x_in, 0, n);
    y = take_rows(y_in, 0, n);
  }
  if (n == 0) throw InvalidArgumentError("fit: no training samples");

  const int64_t batches_per_epoch = (n + opts.batch_size - 1) / opts.batch_size;
  const int64_t steps = opts.steps_per_epoch > 0 ? std::min(opts.steps_per_epoch, batches_per_epoch) : batches_per_epoch;
  std::vector<int64_t> perm;
  int perm_epoch = -1;
  int64_t b = 0;
  auto next_batch = [&](int epoch, std::vector<Tensor>* bx, std::vector<Tensor>* by) {
    if (epoch != perm_epoch) {
      perm = opts.shuffle ? shuffled_indices(n, opts.shuffle_seed + static_cast<uint64_t>(epoch)) : perm;
      perm_epoch = epoch;
      b = step_in_epoch;  // > 0 when resuming mid-epoch
    }
    if (b >= steps) return false;
    int64_t lo = b * opts.batch_size, hi = std::min(n, lo + opts.batch_size);
    *bx = opts.shuffle ? gather_rows(x, perm, lo, hi) : take_rows(x, lo, hi);
    *by = opts.shuffle ? gather_rows(y, perm, lo, hi) : take_rows(y, lo, hi);
    ++b;
    return true;
  };
  auto validate = [&] { return evaluate(vx, vy, EvaluateOptions{opts.batch_size, 0, {}}); };
  return fit_loop(next_batch, steps, vx.empty() ? std::function<Logs()>() : validate, opts);
}

void Model::split_batch(const data::Element& e, std::vector<Tensor>* x, std::vector<Tensor>* y,
                        const char* what) const {
  const size_t n_in = static_cast<size_t>(num_inputs());
  const size_t n_out = is_functional() ? outputs_.size() : 1;
  if (e.size() != n_in + n_out && !(y == nullptr && e.size() >= n_in))
    throw InvalidArgumentError(std::string(what) + ": model '" + name() + "' takes " + std::to_string(n_in) +
                               " input(s) and " + std::to_string(n_out) + " target(s) per batch, the dataset gives " +
                               e.desc());
  x->clear();
  for (size_t i = 0; i < n_in; ++i) x->push_back(e.tensor(i));
  if (!y) return;
  y->clear();
  for (size_t i = n_in; i < e.size(); ++i) y->push_back(e.tensor(i));
}

History Model::fit(const data::Dataset& train, FitOptions opts) {
  require_compiled(*this, compiled_, "fit()");
  if (opts.epochs < 0) throw InvalidArgumentError("fit: epochs must be >= 0, got " + std::to_string(opts.epochs));
  if (opts.validation_split != 0)
    throw InvalidArgumentError("fit: validation_split does not apply to a Dataset; pass validation_data");
  // Several workers read their own parts of the global batches where the pipeline
  // allows (Dataset::shard_for_worker); a step then learns the global batch's rows from
  // every worker's count, and a worker whose part ended early passes empty batches while
  // the others still have rows (every worker takes part in every step's collectives).
  std::optional<data::Dataset> part;
  if (strategy_ && strategy_->num_workers() > 1) {
    data::WorkerShard shard = train.shard_for_worker(strategy_->num_workers(), strategy_->worker_rank());
    if (opts.verbose > 0 && strategy_->is_chief()) std::fprintf(stderr, "fit: input %s\n", shard.how.c_str());
    if (shard.sharded) part = std::move(shard.dataset);
  }
  const data::Dataset& source = part ? *part : train;
  const int64_t card = source.cardinality();
  if (card == data::kInfiniteCardinality && opts.steps_per_epoch <= 0)
    throw InvalidArgumentError("fit: the dataset is infinite (repeat()): give steps_per_epoch");
  const int64_t steps = opts.steps_per_epoch > 0 ? opts.steps_per_epoch : std::max<int64_t>(card, 0);
  // steps_per_epoch: one iterator across epochs (a new pass when one ends);
  // otherwise a fresh pass per epoch.
  std::optional<data::Iterator> it;
  int it_epoch = -1;
  int64_t taken = 0;
  data::Element e;
  auto next_batch = [&](int epoch, std::vector<Tensor>* bx, std::vector<Tensor>* by) {
    if (epoch != it_epoch) {
      it_epoch = epoch;
      taken = 0;
      // A fresh pass per epoch is pass `epoch` (Dataset::iterator(pass)): its shuffle
      // order depends on the epoch only, so a resumed run skips exactly the batches
      // the interrupted one finished.
      if (opts.steps_per_epoch <= 0) it.emplace(source.iterator(static_cast<uint64_t>(epoch)));
      else if (!it) it.emplace(source.iterator());
      for (int64_t s = 0; s < step_in_epoch && it->next(&e); ++s) ++taken;
    }
    if (opts.steps_per_epoch > 0 && taken >= opts.steps_per_epoch) return false;
    if (!it->next(&e)) {
      if (opts.steps_per_epoch <= 0) return false;
      it.emplace(source.iterator());  // the pass ended before steps_per_epoch: start another
      if (!it->next(&e)) throw InvalidArgumentError("fit: the dataset is empty");
    }
    ++taken;
    split_batch(e, bx, by, "fit");
    return true;
  };
  std::vector<Tensor> empty_x, empty_y;  // 0 rows of this worker's batches
  const bool syncs = syncs_replicas();
  auto next_part = [&](int epoch, std::vector<Tensor>* bx, std::vector<Tensor>* by) {
    const bool got = next_batch(epoch, bx, by);
    const int64_t mine = got ? bx->at(0).dim(0) : 0;
    // The rows of the global batch, and how many replicas of the job get some.
    const std::vector<int64_t> sums =
        strategy_->sum_over_workers({mine, std::min<int64_t>(mine, strategy_->num_local_replicas())});
    const int64_t rows = sums[0];
    if (rows == 0) return false;  // every worker's part has ended
    // Synchronized statistics need every replica in every step: the epoch ends with the
    // first batch that would leave one without rows.
    if (syncs && sums[1] < strategy_->num_replicas_in_sync()) return false;
    if (got && empty_x.empty()) {
      empty_x = take_rows(*bx, 0, 0);
      empty_y = take_rows(*by, 0, 0);
    } else if (!got) {
      if (empty_x.empty() && e.size() > 0) {  // resumed past this worker's last batch: the last one skipped
        std::vector<Tensor> lx, ly;
        split_batch(e, &lx, &ly, "fit");
        empty_x = take_rows(lx, 0, 0);
        empty_y = take_rows(ly, 0, 0);
      }
      if (empty_x.empty())
        throw FailedPreconditionError(detail::str_cat("fit: worker ", strategy_->worker_rank(),
                                                      "'s part of the dataset is empty while others have batches"));
      *bx = empty_x;
      *by = empty_y;
    }
    worker_batch_rows_ = rows;
    return true;
  };
  std::function<Logs()> validate;
  if (opts.validation_data) validate = [&] { return evaluate(*opts.validation_data); };
  if (!part) return fit_loop(next_batch, steps, validate, opts);
  struct Reset {
    int64_t& rows;
    ~Reset() { rows = 0; }
  } reset{worker_batch_rows_};
  return fit_loop(next_part, steps, validate, opts);
}

History Model::fit_loop(const NextBatchFn& next_batch, int64_t steps, const std::function<Logs()>& validate,
                        const FitOptions& opts) {
  using clock = std::chrono::steady_clock;
  auto history = std::make_shared<HistoryRecorder>();
  std::vector<CallbackPtr> cbs;
  cbs.push_back(history);
  if (opts.verbose > 0) cbs.push_back(make_progbar(opts.verbose, steps, opts.epochs));
  for (auto& c : opts.callbacks) cbs.push_back(c);
  for (auto& c : cbs) c->set_model(this);

  stop_training = false;
  epoch_counter = opts.initial_epoch;
  step_in_epoch = 0;
  Logs logs;
  for (auto& c : cbs) c->on_train_begin(logs);  // BackupAndRestore may move the counters forward
  if (strategy_) strategy_->sync_workers();  // the workers start the first epoch together

  for (int epoch = static_cast<int>(epoch_counter); epoch < opts.epochs && !stop_training; ++epoch) {
    for (auto& m : metrics_) m->reset();
    metrics::Mean loss_mean("loss");
    Logs epoch_logs;
    for (auto& c : cbs) c->on_epoch_begin(epoch, epoch_logs);
    auto t0 = clock::now();
    double wait = 0;
    int64_t samples = 0;
    std::vector<Tensor> bx, by;
    // Under a strategy the replica threads do the steps' work: this thread's own parallel
    // regions (batch gathers) would leave pool workers spinning on the replicas' cores
    // after each one, so while it feeds steps it runs them on itself alone.
    std::optional<ThreadLimitScope> one_thread;
    if (strategy_) one_thread.emplace(1);
    for (int64_t b = step_in_epoch; !stop_training; ++b) {
      auto w0 = clock::now();
      if (!next_batch(epoch, &bx, &by)) break;
      wait += std::chrono::duration<double>(clock::now() - w0).count();
      Logs batch_logs;
      for (auto& c : cbs) c->on_train_batch_begin(b, batch_logs);
      const int64_t rows = worker_batch_rows_ > 0 ? worker_batch_rows_ : bx.at(0).dim(0);  // the global batch's
      Logs step_logs = train_step(bx, by);
      loss_mean.add(step_logs["loss"], static_cast<double>(rows));
      samples += rows;
      batch_logs["loss"] = loss_mean.result();
      for (auto& m : metrics_) batch_logs[m->name()] = m->result();
      batch_logs["size"] = static_cast<double>(rows);  // the batch's samples (Keras' "size")
      step_in_epoch = b + 1;
      for (auto& c : cbs) c->on_train_batch_end(b, batch_logs);
    }
    one_thread.reset();  // validation and callbacks below use the whole pool
    double secs = std::chrono::duration<double>(clock::now() - t0).count();
    epoch_logs["loss"] = loss_mean.result();
    for (auto& m : metrics_) epoch_logs[m->name()] = m->result();
    epoch_logs["learning_rate"] = opts_.optimizer->learning_rate();
    epoch_logs["samples_per_sec"] = secs > 0 ? static_cast<double>(samples) / secs : 0;
    epoch_logs["epoch_time"] = secs;
    epoch_logs["input_wait"] = secs > 0 ? wait / secs : 0;
    if (validate) {
      Logs val = validate();
      for (auto& [k, v] : val) epoch_logs["val_" + k] = v;
    }
    epoch_counter = epoch + 1;
    step_in_epoch = 0;
    for (auto& c : cbs) c->on_epoch_end(epoch, epoch_logs);
  }
  for (auto& c : cbs) c->on_train_end(logs);
  record_.hyperparameters["optimizer"] = opts_.optimizer->name();
  record_.hyperparameters["learning_rate"] = std::to_string(opts_.optimizer->learning_rate());
  record_.hyperparameters["epochs"] = std::to_string(epoch_counter);
  record_.hyperparameters["batch_size"] = std::to_string(opts.batch_size);
  std::string loss_names;
  for (const auto& l : opts_.loss) loss_names += (loss_names.empty() ? "" : ",") + l->name();
  record_.hyperparameters["loss"] = loss_names;
  record_.hyperparameters["precision"] = dtype_policy().name();
  record_.metrics.clear();
  if (!history->history.history.empty())
    for (const auto& [k, v] : history->history.history)
      if (!v.empty() && k != "epoch_time" && k != "samples_per_sec" && k != "input_wait") record_.metrics[k] = v.back();
  return history->history;
}

Logs Model::evaluate(const std::vector<Tensor>& x, const std::vector<Tensor>& y, EvaluateOptions opts) {
  require_compiled(*this, compiled_, "evaluate()");
  if (opts.batch_size <= 0) throw InvalidArgumentError("evaluate: batch_size must be > 0");
  const int64_t n = check_batch_dims(x, y, "evaluate");
  int64_t lo = 0;
  return evaluate_loop(
      [&](std::vector<Tensor>* bx, std::vector<Tensor>* by) {
        if (lo >= n) return false;
        const int64_t hi = std::min(n, lo + opts.batch_size);
        *bx = take_rows(x, lo, hi);
        *by = take_rows(y, lo, hi);
        lo = hi;
        return true;
      },
      opts);
}

Logs Model::evaluate(const data::Dataset& ds, EvaluateOptions opts) {
  require_compiled(*this, compiled_, "evaluate()");
  if (ds.cardinality() == data::kInfiniteCardinality)
    throw InvalidArgumentError("evaluate: the dataset is infinite (repeat()); take() a finite part");
  data::Iterator it = ds.iterator();
  data::Element e;
  return evaluate_loop(
      [&](std::vector<Tensor>* bx, std::vector<Tensor>* by) {
        if (!it.next(&e)) return false;
        split_batch(e, bx, by, "evaluate");
        return true;
      },
      opts);
}

Logs Model::evaluate_loop(const EvalBatchFn& next_batch, const EvaluateOptions& opts) {
  Logs logs;
  for (auto& c : opts.callbacks) c->set_model(this);
  for (auto& c : opts.callbacks) c->on_test_begin(logs);
  // Fresh metric objects so evaluation inside fit does not disturb the training ones.
  std::vector<MetricPtr> ms;
  for (auto& m : opts_.metrics) ms.push_back(resolve_metric(m, opts_.loss[0]->name()));
  metrics::Mean loss_mean("loss");
  std::vector<Tensor> bx, by;
  DeviceScope scope(device_);
  while (next_batch(&bx, &by)) {
    bx = on_device(bx);
    by = on_device(by);
    std::vector<Tensor> preds = forward_inference(bx);
    loss_mean.add(total_loss(by, preds).item<double>(), static_cast<double>(bx.at(0).dim(0)));
    for (auto& m : ms) m->update(by.at(0), preds.at(0));
  }
  logs["loss"] = loss_mean.result();
  for (auto& m : ms) logs[m->name()] = m->result();
  for (auto& c : opts.callbacks) c->on_test_end(logs);
  return logs;
}

std::vector<Tensor> Model::predict(const std::vector<Tensor>& x, int64_t batch_size) {
  if (batch_size <= 0) throw InvalidArgumentError("predict: batch_size must be > 0");
  if (x.empty()) throw InvalidArgumentError("predict: no inputs given");
  const int64_t n = check_batch_dims(x, {}, "predict");
  int64_t lo = 0;
  return predict_loop([&](std::vector<Tensor>* bx, std::vector<Tensor>*) {
    if (lo >= n) return false;
    const int64_t hi = std::min(n, lo + batch_size);
    *bx = take_rows(x, lo, hi);
    lo = hi;
    return true;
  });
}

std::vector<Tensor> Model::predict(const data::Dataset& ds) {
  if (ds.cardinality() == data::kInfiniteCardinality)
    throw InvalidArgumentError("predict: the dataset is infinite (repeat()); take() a finite part");
  data::Iterator it = ds.iterator();
  data::Element e;
  return predict_loop([&](std::vector<Tensor>* bx, std::vector<Tensor>*) {
    if (!it.next(&e)) return false;
    split_batch(e, bx, nullptr, "predict");
    return true;
  });
}

std::vector<Tensor> Model::forward_inference(const std::vector<Tensor>& x) {
  if (predict_fn_) return (*predict_fn_)(x);
  std::vector<Tensor> out = (*this)(x, /*training=*/false);
  if (!opts_.run_eagerly) {
    FunctionOptions fn_opts;
    fn_opts.name = name() + "_predict";
    predict_fn_ = std::make_shared<Function>(
        [this](const std::vector<Tensor>& a) { return (*this)(a, /*training=*/false); }, fn_opts);
  }
  return out;
}

int Model::num_predict_traces() const { return predict_fn_ ? predict_fn_->num_traces() : 0; }

std::vector<Tensor> Model::predict_loop(const EvalBatchFn& next_batch) {
  std::vector<std::vector<Tensor>> parts;
  std::vector<Tensor> bx;
  DeviceScope scope(device_);
  while (next_batch(&bx, nullptr)) {
    std::vector<Tensor> outs = forward_inference(on_device(bx));
    if (parts.empty()) parts.resize(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) parts[i].push_back(outs[i].to(Device::cpu()));
  }
  std::vector<Tensor> result;
  for (auto& p : parts) result.push_back(p.size() == 1 ? p[0] : ops::concat(p, 0));
  return result;
}

// ---- state ----------------------------------------------------------------------

std::vector<std::pair<std::string, Variable>> Model::named_weights() const {
  std::vector<std::pair<std::string, Variable>> out;
  std::set<uintptr_t> seen;
  std::function<void(const Layer&, const std::string&)> walk = [&](const Layer& l, const std::string& prefix) {
    for (const LayerPtr& sub : l.sublayers()) {
      std::string p = prefix.empty() ? sub->name() : prefix + "/" + sub->name();
      // A layer's own weights are named "<build-time layer name>/<weight>": keep the
      // weight part and put it under the model-unique path.
      for (const Variable& v : sub->weights()) {
        if (!seen.insert(v.uid()).second) continue;
        const std::string& vn = v.name();
        size_t slash = vn.find('/');
        out.emplace_back(p + "/" + (slash == std::string::npos ? vn : vn.substr(slash + 1)), v);
      }
    }
  };
  walk(*this, "");
  return out;
}

namespace {
std::string optimizer_state_key(const Variable& v) {
  const std::string& n = v.name();
  return "optimizer/" + n.substr(n.rfind('/') + 1);
}
}  // namespace

CheckpointData Model::state() const {
  CheckpointData d;
  auto named = named_weights();
  std::set<std::string> keys;
  for (auto& [k, v] : named) {
    if (!keys.insert(k).second) throw InternalError("Model '" + name() + "': two weights map to '" + k + "'");
    d.tensors.emplace_back("model/" + k, v.peek());
  }
  if (opts_.optimizer) {
    d.tensors.emplace_back("optimizer/iterations", opts_.optimizer->iterations_variable().peek());
    for (auto& [k, v] : named) {
      auto slots = opts_.optimizer->slots(v);
      for (const Variable& s : slots) {
        const std::string& sn = s.name();
        d.tensors.emplace_back("optimizer/" + k + "/" + sn.substr(sn.rfind('/') + 1), s.peek());
      }
    }
    for (const Variable& v : opts_.optimizer->state_variables())
      d.tensors.emplace_back(optimizer_state_key(v), v.peek());
  }
  d.metadata["epoch"] = std::to_string(epoch_counter);
  d.metadata["step_in_epoch"] = std::to_string(step_in_epoch);
  return d;
}

void Model::load_state(const CheckpointData& data) {
  auto named = named_weights();
  // Validate every tensor before assigning any.
  std::vector<std::pair<Variable, Tensor>> plan;
  auto want = [&](const std::string& key, const Variable& v) {
    const Tensor* t = data.find(key);
    if (!t) throw NotFoundError("checkpoint has no tensor '" + key + "' (model '" + name() + "')");
    if (t->shape() != v.shape() || t->dtype() != v.dtype())
      throw InvalidArgumentError("checkpoint tensor '" + key + "' is " + t->desc() + " but the model expects " +
                                 v.peek().desc());
    plan.emplace_back(v, *t);
  };
  for (auto& [k, v] : named) want("model/" + k, v);
  if (opts_.optimizer && data.find("optimizer/iterations")) {
    std::vector<Variable> trainable;
    for (auto& [k, v] : named)
      if (v.trainable()) trainable.push_back(v);
    opts_.optimizer->build(trainable);
    want("optimizer/iterations", opts_.optimizer->iterations_variable());
    for (auto& [k, v] : named)
      for (const Variable& s : opts_.optimizer->slots(v)) {
        const std::string& sn = s.name();
        want("optimizer/" + k + "/" + sn.substr(sn.rfind('/') + 1), s);
      }
    // Optional: a checkpoint from a float32 run restores into a loss-scaled one.
    for (const Variable& v : opts_.optimizer->state_variables())
      if (data.find(optimizer_state_key(v))) want(optimizer_state_key(v), v);
  }
  for (auto& [v, t] : plan) v.assign(t.clone());
  if (strategy_) strategy_->mirror(all_variables());  // every replica's copy from the checkpoint
  auto meta = [&](const char* key) -> int64_t {
    auto it = data.metadata.find(key);
    return it == data.metadata.end() ? 0 : std::stoll(it->second);
  };
  epoch_counter = meta("epoch");
  step_in_epoch = meta("step_in_epoch");
}

// ---- summary --------------------------------------------------------------------

std::string Model::summary() const {
  std::ostringstream os;
  summary(os);
  return os.str();
}

void Model::summary(std::ostream& os) const {
  const int w1 = 34, w2 = 26, w3 = 12;
  const bool connected = is_functional();
  const int width = w1 + w2 + w3 + (connected ? 30 : 0);
  auto rule = [&](char c) { os << std::string(width, c) << "\n"; };
  os << "Model: \"" << name() << "\"\n";
  rule('_');
  os << std::left << std::setw(w1) << " Layer (type)" << std::setw(w2) << "Output Shape" << std::setw(w3) << "Param #";
  if (connected) os << "Connected to";
  os << "\n";
  rule('=');
  auto row = [&](const std::string& layer, const std::string& shape, int64_t params, const std::string& conn) {
    os << std::left << std::setw(w1) << (" " + layer) << std::setw(w2) << shape << std::setw(w3) << params;
    if (connected) os << conn;
    os << "\n";
  };
  std::map<const SymbolicTensor::Node*, std::string> node_names;
  if (connected) {
    for (auto& in : inputs_) {
      std::string nm = in.node()->input_name.empty() ? "input" : in.node()->input_name;
      node_names[in.node().get()] = nm;
      row(nm + " (InputLayer)", shape_str(in.shape()), 0, "");
    }
    for (auto& n : order_) {
      node_names[n.get()] = n->layer->name();
      std::string conn;
      for (auto& s : n->inputs) conn += (conn.empty() ? "" : ", ") + node_names[s.node().get()];
      row(n->layer->name() + " (" + n->layer->type() + ")", shape_str(n->shapes.at(0)), n->layer->count_params(), conn);
    }
  } else {
    const std::vector<LayerPtr> ls = layers();
    for (size_t i = 0; i < ls.size(); ++i) {
      const LayerPtr& l = ls[i];
      row(l->name() + " (" + l->type() + ")", i < output_shapes_.size() ? shape_str(output_shapes_[i]) : "?",
          l->count_params(), "");
    }
  }
  rule('=');
  int64_t total = 0, trainable = 0;
  for (auto& [k, v] : named_weights()) {
    total += v.numel();
    if (v.trainable()) trainable += v.numel();
  }
  os << "Total params: " << with_commas(total) << "\n";
  os << "Trainable params: " << with_commas(trainable) << "\n";
  os << "Non-trainable params: " << with_commas(total - trainable) << "\n";
  rule('_');
}

// ---- Sequential -----------------------------------------------------------------

Sequential::Sequential(std::vector<LayerPtr> layers, std::optional<Shape> input_shape, std::string name)
    : Model(std::move(name)), input_shape_(std::move(input_shape)) {
  for (auto& l : layers) add(std::move(l));
  if (input_shape_) {
    std::vector<int64_t> dims{1};
    for (int64_t d : input_shape_->vec()) dims.push_back(d);
    ensure_built({Shape(dims)});
  }
}

void Sequential::add(LayerPtr layer) {
  if (!layer) throw InvalidArgumentError("Sequential::add: the layer is null");
  if (built_) throw FailedPreconditionError("Sequential '" + name() + "': cannot add layers after it was built");
  stack_.push_back(layer);
  track(std::move(layer));
  uniquify_names();
}

void Sequential::build(const std::vector<Shape>& input_shapes) {
  if (stack_.empty()) throw FailedPreconditionError("Sequential '" + name() + "' has no layers");
  output_layer_in_float32(*stack_.back());
  // Build every layer by running a batch of one sample through the stack.
  std::vector<int64_t> dims = input_shapes.at(0).vec();
  if (!dims.empty()) dims[0] = 1;
  Tensor x = ops::zeros(Shape(dims));
  output_shapes_.clear();
  for (auto& l : stack_) {
    x = (*l)(x, false);
    Shape s = x.shape();
    if (s.rank() > 0) {
      s.erase(0);
      s.insert(0, -1);  // batch dimension unknown
    }
    output_shapes_.push_back(s);
  }
}

std::vector<Tensor> Sequential::call(const std::vector<Tensor>& inputs, bool training) {
  Tensor x = inputs.at(0);
  for (auto& l : stack_) x = (*l)(x, training);
  return {x};
}

}  // namespace kiln::train
