#pragma once
// Losses (keras.losses). `per_sample` gives one value per sample ([batch]); calling
// the loss gives their mean (a scalar), optionally weighted per sample. y_true and
// y_pred must have matching shapes, except for SparseCategoricalCrossentropy (integer
// class ids [batch] or [batch, 1] against [batch, classes]); a mismatch is an
// InvalidArgumentError that names the loss and both shapes.
#include <memory>
#include <string>

#include "kiln/core/tensor.h"

namespace kiln::train {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  virtual Tensor per_sample(const Tensor& y_true, const Tensor& y_pred) const = 0;
  // Mean over the batch (weighted mean when sample_weight [batch] is given).
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight = {}) const;
};
using LossPtr = std::shared_ptr<Loss>;

namespace losses {
LossPtr MeanSquaredError();
LossPtr MeanAbsoluteError();
LossPtr Huber(double delta = 1.0);
LossPtr BinaryCrossentropy(bool from_logits = false, double label_smoothing = 0);
LossPtr CategoricalCrossentropy(bool from_logits = false, double label_smoothing = 0);
LossPtr SparseCategoricalCrossentropy(bool from_logits = false);
// By Keras name: "mse", "mae", "huber", "binary_crossentropy",
// "categorical_crossentropy", "sparse_categorical_crossentropy" (probabilities in;
// use the factories for from_logits).
LossPtr get(const std::string& name);
}  // namespace losses

}  // namespace kiln::train
