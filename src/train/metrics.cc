// Streaming metrics, accumulated in double on the host (batches are small next to
// the model; one host copy per update is cheaper than a handful of op launches).
#include "kiln/train/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace kiln::train {
namespace {
using kiln::detail::str_cat;

std::vector<double> host(const std::string& metric, const char* what, const Tensor& t) {
  if (!t.defined()) throw InvalidArgumentError(str_cat(metric, ": ", what, " is undefined"));
  return t.to_vector<double>();
}

void require_same_size(const std::string& metric, const Tensor& y_true, const Tensor& y_pred) {
  if (y_true.numel() != y_pred.numel())
    throw InvalidArgumentError(str_cat(metric, ": y_true shape ", y_true.shape().str(), " does not match y_pred shape ",
                                       y_pred.shape().str()));
}

// Rows of a [..., classes] prediction and the class count.
std::pair<int64_t, int64_t> rows_classes(const std::string& metric, const Tensor& y_pred) {
  if (!y_pred.defined()) throw InvalidArgumentError(str_cat(metric, ": y_pred is undefined"));
  if (y_pred.rank() < 1 || y_pred.dim(-1) == 0)
    throw InvalidArgumentError(
        str_cat(metric, ": y_pred must have a non-empty class axis, got shape ", y_pred.shape().str()));
  const int64_t c = y_pred.dim(-1);
  return {y_pred.numel() / c, c};
}

// First index of the largest value (NaN-free rows assumed, like np.argmax).
int64_t argmax_row(const double* p, int64_t c) {
  int64_t best = 0;
  for (int64_t j = 1; j < c; ++j)
    if (p[j] > p[best]) best = j;
  return best;
}

// Whether class t is among the k largest of the row; ties at the k-th value count
// as in (tf.math.in_top_k).
bool in_top_k(const double* p, int64_t c, int64_t t, int64_t k) {
  if (t < 0 || t >= c || !std::isfinite(p[t])) return false;
  int64_t greater = 0;
  for (int64_t j = 0; j < c; ++j) greater += p[j] > p[t];
  return greater < k;
}

// Sparse ids: one per row (shape rows or rows x 1).
std::vector<double> sparse_ids(const std::string& metric, const Tensor& y_true, int64_t rows, const Tensor& y_pred) {
  std::vector<double> ids = host(metric, "y_true", y_true);
  if (static_cast<int64_t>(ids.size()) != rows)
    throw InvalidArgumentError(str_cat(metric, ": y_true shape ", y_true.shape().str(), " does not match y_pred shape ",
                                       y_pred.shape().str(), " (one class id per row)"));
  return ids;
}

// A running mean of per-element (or per-row) values: total / count.
class MeanOf : public Metric {
 public:
  explicit MeanOf(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  double result() const override { return count_ > 0 ? total_ / count_ : 0; }
  void reset() override { total_ = count_ = 0; }

 protected:
  void accumulate(double total, double count) {
    total_ += total;
    count_ += count;
  }
  std::string name_;

 private:
  double total_ = 0, count_ = 0;
};

class AccuracyMetric final : public MeanOf {
 public:
  AccuracyMetric() : MeanOf("accuracy") {}
  void update(const Tensor& y_true, const Tensor& y_pred) override {
    std::vector<double> t = host(name_, "y_true", y_true), p = host(name_, "y_pred", y_pred);
    require_same_size(name_, y_true, y_pred);
    double hits = 0;
    for (size_t i = 0; i < t.size(); ++i) hits += t[i] == p[i];
    accumulate(hits, static_cast<double>(t.size()));
  }
};

class BinaryAccuracyMetric final : public MeanOf {
 public:
  explicit BinaryAccuracyMetric(double threshold) : MeanOf("binary_accuracy"), threshold_(threshold) {}
  void update(const Tensor& y_true, const Tensor& y_pred) override {
    std::vector<double> t = host(name_, "y_true", y_true), p = host(name_, "y_pred", y_pred);
    require_same_size(name_, y_true, y_pred);
    double hits = 0;
    for (size_t i = 0; i < t.size(); ++i) hits += t[i] == (p[i] > threshold_ ? 1.0 : 0.0);
    accumulate(hits, static_cast<double>(t.size()));
  }

 private:
  double threshold_;
};

class CategoricalAccuracyMetric final : public MeanOf {
 public:
  CategoricalAccuracyMetric() : MeanOf("categorical_accuracy") {}
  void update(const Tensor& y_true, const Tensor& y_pred) override {
    auto [rows, c] = rows_classes(name_, y_pred);
    std::vector<double> t = host(name_, "y_true", y_true), p = host(name_, "y_pred", y_pred);
    if (y_true.shape() != y_pred.shape())
      throw InvalidArgumentError(str_cat(name_, ": y_true shape ", y_true.shape().str(),
                                         " does not match y_pred shape ", y_pred.shape().str()));
    double hits = 0;
    for (int64_t r = 0; r < rows; ++r) hits += argmax_row(&t[r * c], c) == argmax_row(&p[r * c], c);
    accumulate(hits, static_cast<double>(rows));
  }
};

class SparseCategoricalAccuracyMetric final : public MeanOf {
 public:
  SparseCategoricalAccuracyMetric() : MeanOf("sparse_categorical_accuracy") {}
  void update(const Tensor& y_true, const Tensor& y_pred) override {
    auto [rows, c] = rows_classes(name_, y_pred);
    std::vector<double> ids = sparse_ids(name_, y_true, rows, y_pred), p = host(name_, "y_pred", y_pred);
    double hits = 0;
    for (int64_t r = 0; r < rows; ++r) hits += ids[r] == static_cast<double>(argmax_row(&p[r * c], c));
    accumulate(hits, static_cast<double>(rows));
  }
};

class TopKMetric final : public MeanOf {
 public:
  TopKMetric(int64_t k, bool sparse)
      : MeanOf(sparse ? "sparse_top_k_categorical_accuracy" : "top_k_categorical_accuracy"), k_(k), sparse_(sparse) {
    if (k < 1) throw InvalidArgumentError(str_cat(name_, ": k must be >= 1, got ", k));
  }
  void update(const Tensor& y_true, const Tensor& y_pred) override {
    auto [rows, c] = rows_classes(name_, y_pred);
    std::vector<double> p = host(name_, "y_pred", y_pred), t;
    if (sparse_) {
      t = sparse_ids(name_, y_true, rows, y_pred);
    } else {
      if (!y_true.defined() || y_true.shape() != y_pred.shape())
        throw InvalidArgumentError(str_cat(name_, ": y_true shape ",
                                           y_true.defined() ? y_true.shape().str() : "undefined",
                                           " does not match y_pred shape ", y_pred.shape().str()));
      t = host(name_, "y_true", y_true);
    }
    double hits = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double id = sparse_ ? t[r] : static_cast<double>(argmax_row(&t[r * c], c));
      // A non-integral id matches no class.
      const int64_t cls = id == std::floor(id) ? static_cast<int64_t>(id) : -1;
      hits += in_top_k(&p[r * c], c, cls, k_);
    }
    accumulate(hits, static_cast<double>(rows));
  }

 private:
  int64_t k_;
  bool sparse_;
};

class ErrorMetric final : public MeanOf {
 public:
  explicit ErrorMetric(bool squared) : MeanOf(squared ? "mean_squared_error" : "mean_absolute_error"), sq_(squared) {}
  void update(const Tensor& y_true, const Tensor& y_pred) override {
    std::vector<double> t = host(name_, "y_true", y_true), p = host(name_, "y_pred", y_pred);
    if (y_true.shape() != y_pred.shape())
      throw InvalidArgumentError(str_cat(name_, ": y_true shape ", y_true.shape().str(),
                                         " does not match y_pred shape ", y_pred.shape().str()));
    double s = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const double e = p[i] - t[i];
      s += sq_ ? e * e : std::abs(e);
    }
    accumulate(s, static_cast<double>(t.size()));
  }

 private:
  bool sq_;
};

// Keras AUC (ROC, interpolation): thresholds {-eps, 1/(n-1), ..., (n-2)/(n-1), 1+eps};
// a score is predicted positive at threshold i when score > thresholds[i]. Each
// sample lands in bucket k = #thresholds below its score, so the confusion counts at
// threshold i are suffix sums over buckets > i. Labels weigh the positive count
// (y) and the negative count (1 - y), as Keras does.
class AUCMetric final : public Metric {
 public:
  explicit AUCMetric(int64_t n) : n_(n) {
    if (n < 2) throw InvalidArgumentError(str_cat("auc: num_thresholds must be >= 2, got ", n));
    thresholds_.resize(static_cast<size_t>(n));
    constexpr double kEps = 1e-7;
    thresholds_[0] = -kEps;
    for (int64_t i = 1; i + 1 < n; ++i) thresholds_[i] = static_cast<double>(i) / static_cast<double>(n - 1);
    thresholds_[n - 1] = 1 + kEps;
    reset();
  }
  std::string name() const override { return "auc"; }
  void reset() override {
    pos_.assign(static_cast<size_t>(n_ + 1), 0);
    neg_.assign(static_cast<size_t>(n_ + 1), 0);
  }
  void update(const Tensor& y_true, const Tensor& y_pred) override {
    std::vector<double> t = host(name(), "y_true", y_true), p = host(name(), "y_pred", y_pred);
    require_same_size(name(), y_true, y_pred);
    for (double s : p)
      if (!(s >= 0 && s <= 1))
        throw InvalidArgumentError(str_cat("auc: predictions must be in [0, 1] (probabilities), got ", s));
    for (size_t i = 0; i < p.size(); ++i) {
      const size_t k =
          static_cast<size_t>(std::lower_bound(thresholds_.begin(), thresholds_.end(), p[i]) - thresholds_.begin());
      pos_[k] += t[i];
      neg_[k] += 1 - t[i];
    }
  }
  double result() const override {
    const size_t n = static_cast<size_t>(n_);
    std::vector<double> tpr(n), fpr(n);
    double tp = 0, fp = 0, total_pos = 0, total_neg = 0;
    for (size_t k = 0; k <= n; ++k) {
      total_pos += pos_[k];
      total_neg += neg_[k];
    }
    // tp at threshold i: buckets k > i; walk i downwards.
    for (size_t i = n; i-- > 0;) {
      tp += pos_[i + 1];
      fp += neg_[i + 1];
      tpr[i] = total_pos > 0 ? tp / total_pos : 0;
      fpr[i] = total_neg > 0 ? fp / total_neg : 0;
    }
    double auc = 0;
    for (size_t i = 0; i + 1 < n; ++i) auc += (fpr[i] - fpr[i + 1]) * (tpr[i] + tpr[i + 1]) / 2;
    return auc;
  }

 private:
  int64_t n_;
  std::vector<double> thresholds_, pos_, neg_;
};

}  // namespace

namespace metrics {

void Mean::update(const Tensor&, const Tensor& y_pred) {
  std::vector<double> v = host(name_, "y_pred", y_pred);
  for (double x : v) total_ += x;
  count_ += static_cast<double>(v.size());
}

void Mean::add(double value, double weight) {
  total_ += value * weight;
  count_ += weight;
}

MetricPtr MeanMetric(std::string name) { return std::make_shared<Mean>(std::move(name)); }
MetricPtr Accuracy() { return std::make_shared<AccuracyMetric>(); }
MetricPtr BinaryAccuracy(double threshold) { return std::make_shared<BinaryAccuracyMetric>(threshold); }
MetricPtr CategoricalAccuracy() { return std::make_shared<CategoricalAccuracyMetric>(); }
MetricPtr SparseCategoricalAccuracy() { return std::make_shared<SparseCategoricalAccuracyMetric>(); }
MetricPtr TopKCategoricalAccuracy(int64_t k) { return std::make_shared<TopKMetric>(k, false); }
MetricPtr SparseTopKCategoricalAccuracy(int64_t k) { return std::make_shared<TopKMetric>(k, true); }
MetricPtr AUC(int64_t num_thresholds) { return std::make_shared<AUCMetric>(num_thresholds); }
MetricPtr MeanSquaredErrorMetric() { return std::make_shared<ErrorMetric>(true); }
MetricPtr MeanAbsoluteErrorMetric() { return std::make_shared<ErrorMetric>(false); }

MetricPtr get(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (n == "accuracy" || n == "acc") return Accuracy();
  if (n == "binary_accuracy") return BinaryAccuracy();
  if (n == "categorical_accuracy") return CategoricalAccuracy();
  if (n == "sparse_categorical_accuracy") return SparseCategoricalAccuracy();
  if (n == "top_k_categorical_accuracy") return TopKCategoricalAccuracy();
  if (n == "sparse_top_k_categorical_accuracy") return SparseTopKCategoricalAccuracy();
  if (n == "auc") return AUC();
  if (n == "mse" || n == "mean_squared_error") return MeanSquaredErrorMetric();
  if (n == "mae" || n == "mean_absolute_error") return MeanAbsoluteErrorMetric();
  throw InvalidArgumentError("unknown metric '" + name +
                             "'; expected one of: accuracy, acc, binary_accuracy, categorical_accuracy, "
                             "sparse_categorical_accuracy, top_k_categorical_accuracy, "
                             "sparse_top_k_categorical_accuracy, auc, mse, mae");
}

}  // namespace metrics
}  // namespace kiln::train
