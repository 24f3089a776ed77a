#pragma once
// Models (keras.Model): a layer graph with training machinery.
//
//   auto x = Input({784});
//   auto h = layers::Dense(256, "relu")(x);
//   auto y = layers::Dense(10)(h);
//   auto model = Model::functional({x}, {y});
//   model->compile({optimizers::Adam(), losses::SparseCategoricalCrossentropy(true), {"accuracy"}});
//   History h = model->fit(train_x, train_y, {.epochs = 5, .batch_size = 128});
//
// Functional models may have several inputs and outputs and residual connections;
// Sequential stacks single-input layers. Subclass Model and override call() for
// imperative models.
//
// A training step is one GradientTape: forward in training mode, loss (+ the
// regularization losses), gradients of the trainable weights, optimizer step. fit runs
// it traced by default (as Keras's train_function): the first step runs eagerly (it
// builds the layers and the optimizer's slots), the second is traced into one graph
// with kiln::function (forward, gradients through the same vjp rules, updates; see
// kiln/graph/function.h), and later steps run that graph: passes, fusion, one memory
// plan, no per-op dispatch. The learning rate and step are fed to the graph on every
// step, so schedules and callbacks behave as eagerly; dropout draws a fresh mask every
// step. A batch of another shape (the last, smaller one) is traced once more.
// CompileOptions::run_eagerly = true keeps every step eager (debugging, or code that
// must see concrete values); so do optimizers that decide on the host
// (Optimizer::traceable(): clipnorm, loss scaling). As in Keras, the trace fixes what
// the step read on the host: changing a layer's `trainable` flag, or code in a custom
// call() that branches on tensor values, takes effect after compile() again.
// evaluate() and predict() run the forward pass in inference mode traced the same way
// (Keras's predict_function): the first batch a model ever sees runs eagerly (it may
// build layers), later ones run one graph per batch shape; run_eagerly turns it off.
// Reproducible: with kiln::set_seed(s) before building and fit's shuffle_seed, two
// runs produce the same weights and losses.
//
// Thread-safety: none.
#include <functional>
#include <iosfwd>
#include <optional>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/train/callbacks.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/layer.h"
#include "kiln/train/losses.h"
#include "kiln/train/metrics.h"
#include "kiln/train/optimizers.h"

namespace kiln {
class Function;
}
namespace kiln::distribute {
class Strategy;
}

namespace kiln::train {

struct CompileOptions {
  OptimizerPtr optimizer;
  std::vector<LossPtr> loss;               // one per output (one applies to all)
  std::vector<std::string> metrics = {};   // names, see metrics::get (applied to output 0)
  std::vector<double> loss_weights = {};   // per output, default 1
  std::vector<MetricPtr> metric_objects = {};
  // A dtype policy name (mixed_precision.h) for the model and every layer in it
  // without an explicit policy, output layers excepted (they stay float32 under a
  // mixed policy); empty keeps the policies the layers were built with. Variables are
  // f32 under every policy, so this also works on a trained or restored model.
  std::string precision = "";
  // Every training step eagerly (no trace); see the top of this file.
  bool run_eagerly = false;
  // Where the model trains and runs ("cuda:0", ...; "" or "cpu": the host). Weights
  // (existing ones are moved), optimizer slots, batches and the traced step live
  // there; predict() returns host tensors. An unknown or absent device is an error of
  // compile() (NotFoundError saying why, e.g. no GPU).
  std::string device = "";
  // Data-parallel training (kiln/distribute/strategy.h); null: the strategy of the
  // StrategyScope open on this thread, if any. fit() and train_step() then split each
  // batch across the strategy's replicas (one device each; `device` must be empty or
  // the first replica's), all-reduce the gradients and update every replica's copy of
  // the variables alike. evaluate() and predict() run on the first replica's device.
  // Under a multi-worker strategy, fit(), train_step() and load_state() are collective:
  // every worker calls them alike (docs/distributed.md).
  std::shared_ptr<distribute::Strategy> strategy = nullptr;
};

struct FitOptions {
  int epochs = 1;
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t shuffle_seed = 0;               // epoch e shuffles with seed + e
  double validation_split = 0;             // last fraction of x/y held out (before shuffling)
  std::vector<Tensor> validation_x = {};   // or explicit validation data
  std::vector<Tensor> validation_y = {};
  std::vector<CallbackPtr> callbacks = {};
  int verbose = 1;                         // 0 silent, 1 progress bar, 2 one line per epoch
  int initial_epoch = 0;
  int64_t steps_per_epoch = 0;             // 0: all batches
  // Validation batches when fitting on a Dataset (see fit(const data::Dataset&)).
  std::optional<data::Dataset> validation_data = std::nullopt;
};

struct EvaluateOptions {
  int64_t batch_size = 32;
  int verbose = 0;
  std::vector<CallbackPtr> callbacks = {};
};

class Model : public Layer {
 public:
  // A functional model from symbolic inputs to outputs.
  static std::shared_ptr<Model> functional(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs,
                                           std::string name = "model");
  std::string type() const override { return is_functional() ? "Functional" : "Model"; }

  void compile(CompileOptions opts);
  bool compiled() const { return compiled_; }

  History fit(const std::vector<Tensor>& x, const std::vector<Tensor>& y, FitOptions opts = {});
  History fit(const Tensor& x, const Tensor& y, FitOptions opts = {}) {
    return fit(std::vector<Tensor>{x}, std::vector<Tensor>{y}, std::move(opts));
  }
  // Fits on a Dataset of batches (tf.data style): each element holds the model inputs
  // (the first num_inputs() components: 1 for Sequential) then the targets (one per
  // output). batch_size, shuffle and validation_split do not apply (batch and shuffle
  // the dataset); steps_per_epoch > 0 takes that many batches per epoch from one
  // iterator that continues across epochs (needed for infinite datasets), 0 runs each
  // epoch to the end of a fresh pass, pass number `epoch` (so shuffles depend on the
  // epoch only, and BackupAndRestore resumes exactly). Epoch logs gain "input_wait":
  // the share of the epoch spent waiting for the next batch (prefetch() brings it
  // towards 0).
  History fit(const data::Dataset& train, FitOptions opts = {});
  Logs evaluate(const data::Dataset& data, EvaluateOptions opts = {});
  // Outputs for every batch of a Dataset (components beyond the inputs are ignored).
  std::vector<Tensor> predict(const data::Dataset& data);
  // Loss and metrics over the data ({"loss": .., "accuracy": ..}).
  Logs evaluate(const std::vector<Tensor>& x, const std::vector<Tensor>& y, EvaluateOptions opts = {});
  Logs evaluate(const Tensor& x, const Tensor& y, EvaluateOptions opts = {}) {
    return evaluate(std::vector<Tensor>{x}, std::vector<Tensor>{y}, std::move(opts));
  }
  // Outputs for the inputs, computed in batches in inference mode.
  std::vector<Tensor> predict(const std::vector<Tensor>& x, int64_t batch_size = 32);
  Tensor predict(const Tensor& x, int64_t batch_size = 32) { return predict(std::vector<Tensor>{x}, batch_size)[0]; }

  // One optimisation step on one batch; returns the batch loss and metric values.
  // Traced unless run_eagerly (see the top of this file).
  Logs train_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y);
  // Steps the traced training function has run, and how many times it was traced
  // (0 and 0 while steps run eagerly).
  int64_t traced_steps() const { return traced_steps_; }
  // Times the inference forward of evaluate()/predict() was traced (0 while eager).
  int num_predict_traces() const;
  int num_train_traces() const;

  // Keras-style table: layer (type), output shape, params; totals.
  void summary(std::ostream& os) const;
  std::string summary() const;

  // Model weights, optimizer state and counters as checkpoint data, and back
  // (restore builds the optimizer's slots first).
  CheckpointData state() const;
  void load_state(const CheckpointData& data);
  void save_weights(const std::string& path) const { save_checkpoint(path, state()); }
  void load_weights(const std::string& path) { load_state(load_checkpoint(path)); }

  const OptimizerPtr& optimizer() const { return opts_.optimizer; }
  // The distribution strategy the model was compiled under (null: none).
  const std::shared_ptr<distribute::Strategy>& strategy() const { return strategy_; }
  // Every weight under its model path ("dense_1/kernel"): stable across runs.
  std::vector<std::pair<std::string, Variable>> named_weights() const;
  // What the last fit() recorded, for a model package's lineage (kiln/train/export.h):
  // optimizer, learning rate, epochs, batch size, losses, precision; the final epoch's
  // metrics (loss, metrics, val_*).
  struct TrainingRecord {
    std::map<std::string, std::string> hyperparameters;
    std::map<std::string, double> metrics;
  };
  const TrainingRecord& training_record() const { return record_; }
  bool stop_training = false;
  // Progress counters (restored by BackupAndRestore).
  int64_t epoch_counter = 0;  // epochs completed
  int64_t step_in_epoch = 0;  // batches completed in the current epoch

  // The layers in execution order (functional/sequential).
  std::vector<LayerPtr> layers() const;
  bool is_functional() const { return !inputs_.empty(); }
  const std::vector<SymbolicTensor>& inputs() const { return inputs_; }
  const std::vector<SymbolicTensor>& outputs() const { return outputs_; }

 protected:
  explicit Model(std::string name = "model");
  std::vector<Tensor> call(const std::vector<Tensor>& inputs, bool training) override;
  int num_inputs() const override { return is_functional() ? static_cast<int>(inputs_.size()) : 1; }
  // Sets up the functional graph (topological order of the nodes).
  void init_graph(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs);
  void uniquify_names();
  // Under mixed precision an output layer without an explicit policy computes in f32.
  static void output_layer_in_float32(Layer& layer);
  // The epoch loop shared by both fit()s: `next_batch(epoch, &x, &y)` gives the
  // epoch's batches until it returns false; `steps` is their number (0: unknown).
  using NextBatchFn = std::function<bool(int epoch, std::vector<Tensor>* x, std::vector<Tensor>* y)>;
  History fit_loop(const NextBatchFn& next_batch, int64_t steps, const std::function<Logs()>& validate,
                   const FitOptions& opts);
  // The loops shared by the tensor and Dataset overloads of evaluate and predict:
  // `next_batch(&x, &y)` gives batches until it returns false (y is null for predict).
  using EvalBatchFn = std::function<bool(std::vector<Tensor>* x, std::vector<Tensor>* y)>;
  Logs evaluate_loop(const EvalBatchFn& next_batch, const EvaluateOptions& opts);
  std::vector<Tensor> predict_loop(const EvalBatchFn& next_batch);
  // The inference-mode forward of evaluate and predict: traced after the first batch
  // unless run_eagerly (see the top of this file).
  std::vector<Tensor> forward_inference(const std::vector<Tensor>& x);
  // Splits a dataset element into model inputs and targets.
  void split_batch(const data::Element& e, std::vector<Tensor>* x, std::vector<Tensor>* y, const char* what) const;
  // Sum of the (weighted) losses of every output.
  Tensor total_loss(const std::vector<Tensor>& y, const std::vector<Tensor>& preds);
  // `ts` copied to the model's device (CompileOptions::device) where they are elsewhere.
  std::vector<Tensor> on_device(const std::vector<Tensor>& ts) const;
  // The step's loss and predictions; the optimizer's update with `hyper`/`step`
  // (Optimizer::apply_gradients_traced) when they are given.
  std::pair<Tensor, std::vector<Tensor>> step(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                              const Tensor& hyper = {}, const Tensor& iteration = {});
  // The loss, predictions and gradients of the trainable weights (one GradientTape).
  struct Gradients {
    Tensor loss;
    std::vector<Tensor> preds, grads;
    std::vector<Variable> vars;
  };
  // `weight` (a scalar, optional) multiplies the objective the gradients are taken of.
  Gradients gradients(const std::vector<Tensor>& x, const std::vector<Tensor>& y, const Tensor& weight = {});
  // train_step under CompileOptions::strategy (src/train/model_distributed.cc).
  Logs distributed_train_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y);
  // Every variable of the model and its optimizer (mirrored under a strategy).
  std::vector<Variable> all_variables() const;

  std::vector<SymbolicTensor> inputs_, outputs_;
  std::vector<std::shared_ptr<SymbolicTensor::Node>> order_;  // non-input nodes, topological
  CompileOptions opts_;
  bool compiled_ = false;
  Device device_ = Device::cpu();  // CompileOptions::device
  std::vector<MetricPtr> metrics_;
  std::vector<Shape> output_shapes_;  // per layer, for summary() (Sequential)
  TrainingRecord record_;
  std::shared_ptr<kiln::Function> train_fn_;    // the traced step (made after one eager step)
  std::shared_ptr<kiln::Function> predict_fn_;  // the traced inference forward (likewise)
  int64_t traced_steps_ = 0;
  std::shared_ptr<distribute::Strategy> strategy_;  // CompileOptions::strategy
  // Under a strategy, per replica: the traced forward + gradients, and the traced update.
  std::vector<std::shared_ptr<kiln::Function>> replica_grad_fns_, replica_apply_fns_;
  // > 0 while fit reads an auto-sharded Dataset under several workers: each worker's
  // batch is its own part of the step's global batch of this many rows.
  int64_t worker_batch_rows_ = 0;
};
using ModelPtr = std::shared_ptr<Model>;

// A linear stack of layers (keras.Sequential). Give input_shape (per sample) to build
// eagerly and get a summary before the first call.
class Sequential : public Model {
 public:
  explicit Sequential(std::vector<LayerPtr> layers = {}, std::optional<Shape> input_shape = std::nullopt,
                      std::string name = "sequential");
  std::string type() const override { return "Sequential"; }
  void add(LayerPtr layer);
  std::vector<LayerPtr> stack() const { return stack_; }

 protected:
  std::vector<Tensor> call(const std::vector<Tensor>& inputs, bool training) override;
  void build(const std::vector<Shape>& input_shapes) override;

 private:
  std::vector<LayerPtr> stack_;
  std::optional<Shape> input_shape_;
};

}  // namespace kiln::train
