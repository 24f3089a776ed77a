#pragma once
// Streaming metrics (keras.metrics): update with batches, read result(), reset()
// between epochs. Results are computed in double on the host.
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::train {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual std::string name() const = 0;
  virtual void update(const Tensor& y_true, const Tensor& y_pred) = 0;
  virtual double result() const = 0;
  virtual void reset() = 0;
};
using MetricPtr = std::shared_ptr<Metric>;

namespace metrics {
// Weighted running mean of values given to `add` (what fit uses for the loss).
class Mean : public Metric {
 public:
  explicit Mean(std::string name = "mean") : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void update(const Tensor& y_true, const Tensor& y_pred) override;  // mean of y_pred
  void add(double value, double weight = 1);
  double result() const override { return count_ > 0 ? total_ / count_ : 0; }
  void reset() override { total_ = count_ = 0; }

 private:
  std::string name_;
  double total_ = 0, count_ = 0;
};

MetricPtr MeanMetric(std::string name = "mean");
MetricPtr Accuracy();                          // exact equality of y_true and y_pred
MetricPtr BinaryAccuracy(double threshold = 0.5);
MetricPtr CategoricalAccuracy();               // argmax(y_true) == argmax(y_pred)
MetricPtr SparseCategoricalAccuracy();         // y_true ids == argmax(y_pred)
MetricPtr TopKCategoricalAccuracy(int64_t k = 5);
MetricPtr SparseTopKCategoricalAccuracy(int64_t k = 5);
// Area under the ROC curve from `num_thresholds` buckets (binary labels, scores in [0,1]).
MetricPtr AUC(int64_t num_thresholds = 200);
MetricPtr MeanSquaredErrorMetric();
MetricPtr MeanAbsoluteErrorMetric();
// By Keras name: "accuracy"/"acc" (resolved against the loss by Model::compile),
// "binary_accuracy", "categorical_accuracy", "sparse_categorical_accuracy",
// "top_k_categorical_accuracy", "auc", "mse", "mae".
MetricPtr get(const std::string& name);
}  // namespace metrics

}  // namespace kiln::train
