#include "train_util.h"

#include <numeric>

#include "kiln/ops.h"

namespace kiln::train {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (int i = 0; i < s.rank(); ++i) {
    if (i) out += ", ";
    out += s.dim(i) < 0 ? "None" : std::to_string(s.dim(i));
  }
  if (s.rank() == 1) out += ",";
  return out + ")";
}

std::string with_commas(int64_t v) {
  std::string d = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return v < 0 ? "-" + out : out;
}

namespace {
class NamedMetric : public Metric {
 public:
  NamedMetric(std::string name, MetricPtr inner) : name_(std::move(name)), inner_(std::move(inner)) {}
  std::string name() const override { return name_; }
  void update(const Tensor& t, const Tensor& p) override { inner_->update(t, p); }
  double result() const override { return inner_->result(); }
  void reset() override { inner_->reset(); }

 private:
  std::string name_;
  MetricPtr inner_;
};
}  // namespace

MetricPtr resolve_metric(const std::string& name, const std::string& loss_name) {
  if (name == "accuracy" || name == "acc") {
    MetricPtr m;
    if (loss_name.find("sparse_categorical") != std::string::npos)
      m = metrics::SparseCategoricalAccuracy();
    else if (loss_name.find("categorical") != std::string::npos)
      m = metrics::CategoricalAccuracy();
    else if (loss_name.find("binary") != std::string::npos)
      m = metrics::BinaryAccuracy();
    else
      m = metrics::Accuracy();
    return std::make_shared<NamedMetric>(name, m);
  }
  return std::make_shared<NamedMetric>(name, metrics::get(name));
}

int64_t check_batch_dims(const std::vector<Tensor>& x, const std::vector<Tensor>& y, const char* what) {
  int64_t n = -1;
  auto check = [&](const Tensor& t, const std::string& label) {
    if (!t.defined()) throw InvalidArgumentError(std::string(what) + ": " + label + " is undefined");
    if (t.rank() == 0) throw InvalidArgumentError(std::string(what) + ": " + label + " is a scalar; need a batch");
    if (n < 0) n = t.dim(0);
    if (t.dim(0) != n)
      throw InvalidArgumentError(std::string(what) + ": " + label + " has " + std::to_string(t.dim(0)) +
                                 " samples but the first input has " + std::to_string(n));
  };
  for (size_t i = 0; i < x.size(); ++i) check(x[i], "x[" + std::to_string(i) + "] " + x[i].desc());
  for (size_t i = 0; i < y.size(); ++i) check(y[i], "y[" + std::to_string(i) + "] " + y[i].desc());
  if (n < 0) throw InvalidArgumentError(std::string(what) + ": no data given");
  return n;
}

std::vector<Tensor> take_rows(const std::vector<Tensor>& xs, int64_t lo, int64_t hi) {
  std::vector<Tensor> out;
  out.reserve(xs.size());
  for (const Tensor& x : xs) {
    if (lo == 0 && hi == x.dim(0)) {
      out.push_back(x);
      continue;
    }
    std::vector<int64_t> begin(x.rank(), 0), size = x.shape().vec();
    begin[0] = lo;
    size[0] = hi - lo;
    out.push_back(ops::slice(x, begin, size));
  }
  return out;
}

std::vector<Tensor> gather_rows(const std::vector<Tensor>& xs, const std::vector<int64_t>& perm, int64_t lo,
                                int64_t hi) {
  Tensor idx = Tensor::from_vector<int64_t>(std::vector<int64_t>(perm.begin() + lo, perm.begin() + hi), {hi - lo});
  std::vector<Tensor> out;
  out.reserve(xs.size());
  for (const Tensor& x : xs) out.push_back(ops::gather(x, idx, 0));
  return out;
}

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  auto next = [&s]() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(next() % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

void HistoryRecorder::on_epoch_end(int epoch, Logs& logs) {
  history.epochs.push_back(epoch);
  for (auto& [k, v] : logs) history.history[k].push_back(v);
}

}  // namespace kiln::train
