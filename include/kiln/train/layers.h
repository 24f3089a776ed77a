#pragma once
// The built-in layers (keras.layers). Shapes are NHWC for images; Dense acts on the
// last axis. Every layer checks its input's rank and last dimension against what it
// was built for and throws InvalidArgumentError naming itself otherwise.
#include <optional>
#include <string>

#include "kiln/train/layer.h"

namespace kiln::train::layers {

// Activation by name: "linear" (or ""), "relu", "relu6", "sigmoid", "tanh", "softmax",
// "log_softmax", "gelu", "silu" (= "swish"), "elu", "leaky_relu", "softplus".
// Unknown names throw InvalidArgumentError listing the known ones.
Tensor activation(const std::string& name, const Tensor& x);

struct DenseOptions {
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = initializers::glorot_uniform();
  Initializer bias_initializer = initializers::zeros();
  Regularizer kernel_regularizer = nullptr;
  Regularizer bias_regularizer = nullptr;
};
// y = activation(x @ kernel + bias); kernel [in, units].
LayerPtr Dense(int64_t units, DenseOptions opts = {}, std::string name = "");
LayerPtr Dense(int64_t units, const std::string& activation, std::string name = "");

struct Conv2DOptions {
  std::vector<int64_t> strides = {1, 1};
  std::string padding = "valid";  // "valid" | "same"
  std::vector<int64_t> dilation_rate = {1, 1};
  int64_t groups = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = initializers::glorot_uniform();
  Initializer bias_initializer = initializers::zeros();
  Regularizer kernel_regularizer = nullptr;
};
// NHWC input, HWIO kernel [kh, kw, in/groups, filters].
LayerPtr Conv2D(int64_t filters, std::vector<int64_t> kernel_size, Conv2DOptions opts = {}, std::string name = "");

// pool_size defaults to 2x2; strides default to pool_size.
LayerPtr MaxPool2D(std::vector<int64_t> pool_size = {2, 2}, std::vector<int64_t> strides = {},
                   std::string padding = "valid", std::string name = "");
LayerPtr AveragePool2D(std::vector<int64_t> pool_size = {2, 2}, std::vector<int64_t> strides = {},
                       std::string padding = "valid", std::string name = "");
LayerPtr GlobalAveragePool2D(std::string name = "");
LayerPtr GlobalMaxPool2D(std::string name = "");
LayerPtr Flatten(std::string name = "");
// target_shape excludes the batch dimension; one -1 is inferred.
LayerPtr Reshape(std::vector<int64_t> target_shape, std::string name = "");
LayerPtr Activation(std::string activation, std::string name = "");

struct BatchNormOptions {
  int64_t axis = -1;
  double momentum = 0.99;
  double epsilon = 1e-3;
  bool center = true;
  bool scale = true;
  // Under a distribution strategy, the batch statistics of the whole global batch (summed
  // over the replicas with ops::cross_replica_sum, in two passes: mean, then the squared
  // deviations from it) instead of each replica's shard's; gradients flow through the
  // sums (Keras' synchronized=True). Alone, the same as false (one replica).
  bool synchronized = false;
};
// Training: normalises with batch statistics and updates moving_mean/moving_variance
// (moving = momentum * moving + (1 - momentum) * batch); inference: uses the moving ones.
LayerPtr BatchNormalization(BatchNormOptions opts = {}, std::string name = "");
// Normalises over the last axis (or from `axis` to the end).
LayerPtr LayerNormalization(double epsilon = 1e-3, int64_t axis = -1, std::string name = "");
// Active only with training = true; a seed makes the masks reproducible.
LayerPtr Dropout(double rate, std::optional<uint64_t> seed = std::nullopt, std::string name = "");
// Integer ids [...] -> [..., output_dim]; ids outside [0, input_dim) are an OutOfRangeError.
LayerPtr Embedding(int64_t input_dim, int64_t output_dim,
                   Initializer init = initializers::random_uniform(-0.05, 0.05), std::string name = "");

struct MultiHeadAttentionOptions {
  int64_t value_dim = -1;     // default key_dim
  int64_t output_dim = -1;    // default: the query's last dimension
  bool use_bias = true;
  double dropout = 0;
  bool causal = false;
};
// Inputs: {query, value} or {query, value, key}; each [batch, seq, features].
LayerPtr MultiHeadAttention(int64_t num_heads, int64_t key_dim, MultiHeadAttentionOptions opts = {},
                            std::string name = "");

// Merging layers for functional models (residual connections, multi-input).
LayerPtr Add(std::string name = "");                       // elementwise sum of >= 2 inputs
LayerPtr Concatenate(int64_t axis = -1, std::string name = "");

}  // namespace kiln::train::layers
