#pragma once
// Layer: the unit models are built from (keras.layers.Layer), and SymbolicTensor, the
// placeholder that functional models are wired with.
//
// A layer owns Variables (created lazily by `build` on the first call, when input
// shapes are known) and may own sublayers. Calling a layer on concrete tensors runs
// it eagerly; calling it on SymbolicTensors records a node of a functional graph
// (see model.h) and infers output shapes by running the layer once on a batch of 1.
//
// Names: an unnamed layer is called after its type in snake case ("dense"); a Model
// makes the names of its layers unique ("dense", "dense_1", ...) when it is built, so
// weight names ("dense_1/kernel") are stable from run to run.
//
// Thread-safety: none; a layer is used by one thread at a time.
#include <memory>
#include <string>
#include <vector>

#include "kiln/autodiff/variable.h"
#include "kiln/train/initializers.h"
#include "kiln/train/mixed_precision.h"

namespace kiln::train {

// A weight penalty added to the training loss (keras.regularizers).
using Regularizer = std::function<Tensor(const Tensor& weight)>;
namespace regularizers {
Regularizer l2(double factor = 0.01);  // factor * sum(w^2)
Regularizer l1(double factor = 0.01);  // factor * sum(|w|)
}  // namespace regularizers

// "MultiHeadAttention" -> "multi_head_attention".
std::string snake_case(const std::string& type);

class Layer;
class SymbolicTensor;

// A shared layer handle that can be called like a Keras layer:
// `auto h = layers::Dense(64, "relu")(x);`
class LayerPtr : public std::shared_ptr<Layer> {
 public:
  LayerPtr() = default;
  LayerPtr(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
  template <typename T>
  LayerPtr(std::shared_ptr<T> p) : std::shared_ptr<Layer>(std::move(p)) {}  // NOLINT(google-explicit-constructor)
  SymbolicTensor operator()(const SymbolicTensor& x) const;
  // Multi-input call of a single-output layer (Add, Concatenate, attention);
  // InvalidArgumentError if the layer has several outputs (use Layer::operator()).
  SymbolicTensor operator()(const std::vector<SymbolicTensor>& xs) const;
  Tensor operator()(const Tensor& x, bool training = false) const;
  std::vector<Tensor> operator()(const std::vector<Tensor>& xs, bool training = false) const;
};

// A symbolic value in a functional model: shape with -1 for the batch dimension.
class SymbolicTensor {
 public:
  struct Node;
  SymbolicTensor() = default;
  SymbolicTensor(std::shared_ptr<Node> node, int index) : node_(std::move(node)), index_(index) {}
  bool defined() const { return node_ != nullptr; }
  const Shape& shape() const;  // batch dimension -1
  DType dtype() const;
  const std::shared_ptr<Node>& node() const { return node_; }
  int index() const { return index_; }

 private:
  std::shared_ptr<Node> node_;
  int index_ = 0;
};

struct SymbolicTensor::Node {
  LayerPtr layer;                        // null for an Input
  std::vector<SymbolicTensor> inputs;
  std::vector<Shape> shapes;             // per output, batch dim -1
  std::vector<DType> dtypes;
  std::string input_name;                // for Inputs
};

// A model input of the given per-sample shape (batch dimension not included).
SymbolicTensor Input(const Shape& shape, DType dtype = DType::kF32, std::string name = "");

class Layer : public std::enable_shared_from_this<Layer> {
 public:
  explicit Layer(std::string name = "");
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // The class name shown by summary() ("Dense").
  virtual std::string type() const = 0;
  std::string name() const { return name_.empty() ? snake_case(type()) : name_; }
  void set_name(std::string n) { name_ = std::move(n); }
  bool has_auto_name() const { return auto_name_; }

  // Eager calls; build on first use. Throws InvalidArgumentError on wrong shapes or
  // arity, naming the layer.
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs, bool training = false);
  Tensor operator()(const Tensor& x, bool training = false);
  // Symbolic calls (functional models).
  std::vector<SymbolicTensor> operator()(const std::vector<SymbolicTensor>& inputs);
  SymbolicTensor operator()(const SymbolicTensor& x);

  // Creates the weights for the given input shapes (batch dimension included).
  void ensure_built(const std::vector<Shape>& input_shapes);
  bool built() const { return built_; }
  // The input shapes the layer was built for (batch dimension included); empty before.
  const std::vector<Shape>& built_input_shapes() const { return built_shapes_; }

  // Every variable of this layer and its sublayers, in creation order.
  std::vector<Variable> weights() const;
  std::vector<Variable> trainable_weights() const;
  std::vector<Variable> non_trainable_weights() const;
  int64_t count_params() const;
  // Penalties of the regularised weights of this layer and its sublayers (scalars).
  std::vector<Tensor> regularization_losses() const;

  // A frozen layer's weights are not trainable (keras layer.trainable = False).
  bool trainable() const { return trainable_; }
  virtual void set_trainable(bool t);

  const std::vector<LayerPtr>& sublayers() const { return sublayers_; }
  // Whether training it calls collectives across a distribution strategy's replicas
  // (synchronized BatchNormalization: ops::cross_replica_sum), so that every replica must
  // run it in every step; by default, whether a sublayer does.
  virtual bool syncs_replicas() const;

  // The dtype policy (see mixed_precision.h): the global policy when the layer was
  // constructed, or the one set here.
  const DTypePolicy& dtype_policy() const { return policy_; }
  void set_dtype_policy(DTypePolicy policy) {
    policy_ = std::move(policy);
    policy_explicit_ = true;
  }
  // Whether set_dtype_policy was called (a Model leaves such output layers alone).
  bool has_explicit_dtype_policy() const { return policy_explicit_; }

 protected:
  // Subclasses: create weights (add_weight) from the input shapes.
  virtual void build(const std::vector<Shape>& input_shapes) { (void)input_shapes; }
  // Subclasses: compute the outputs. `training` switches dropout/batch norm.
  virtual std::vector<Tensor> call(const std::vector<Tensor>& inputs, bool training) = 0;
  // Number of inputs the layer takes (-1 = any); checked before call().
  virtual int num_inputs() const { return 1; }

  Variable add_weight(const std::string& name, const Shape& shape, const Initializer& init, bool trainable = true,
                      Regularizer regularizer = nullptr, DType dtype = DType::kF32);
  // Registers a sublayer (its weights become this layer's too).
  void track(LayerPtr sub);

  std::string name_;
  DTypePolicy policy_;
  bool policy_explicit_ = false;
  // Mixed-precision exceptions (set by subclasses): compute in the variable dtype
  // (normalization layers), return outputs in the variable dtype (models).
  bool computes_in_variable_dtype_ = false;
  bool outputs_in_variable_dtype_ = false;
  bool auto_name_ = false;
  bool trainable_ = true;
  bool built_ = false;
  std::vector<Shape> built_shapes_;

 private:
  struct Weight {
    Variable var;
    bool trainable;
    Regularizer regularizer;
  };
  // call() with the dtype policy applied: input casts, variable autocasting, output casts.
  std::vector<Tensor> call_with_policy(const std::vector<Tensor>& inputs, bool training);
  std::vector<Weight> own_;
  std::vector<LayerPtr> sublayers_;
  friend class Model;
};

inline SymbolicTensor LayerPtr::operator()(const SymbolicTensor& x) const { return (**this)(x); }
inline SymbolicTensor LayerPtr::operator()(const std::vector<SymbolicTensor>& xs) const {
  std::vector<SymbolicTensor> out = (**this)(xs);
  if (out.size() != 1)
    throw InvalidArgumentError("layer '" + (*this)->name() + "' has " + std::to_string(out.size()) +
                               " outputs; call it through Layer::operator() to get them all");
  return out[0];
}
inline Tensor LayerPtr::operator()(const Tensor& x, bool training) const { return (**this)(x, training); }
inline std::vector<Tensor> LayerPtr::operator()(const std::vector<Tensor>& xs, bool training) const {
  return (**this)(xs, training);
}

// A layer with one input and one output.
class UnaryLayer : public Layer {
 public:
  using Layer::Layer;
  using Layer::operator();

 protected:
  virtual Tensor forward(const Tensor& x, bool training) = 0;
  std::vector<Tensor> call(const std::vector<Tensor>& inputs, bool training) final {
    return {forward(inputs[0], training)};
  }
};

}  // namespace kiln::train
