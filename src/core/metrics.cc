#include "kiln/core/metrics.h"

#include <charconv>
#include <cmath>

namespace kiln {

namespace {

void atomic_add(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

void append_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  }
}

// Label values escaped as the exposition format asks: backslash, quote, newline.
void append_labels(std::string& out, const std::vector<std::string>& names, const std::vector<std::string>& values,
                   const char* extra_name = nullptr, const std::string* extra_value = nullptr) {
  if (names.empty() && !extra_name) return;
  out += '{';
  bool first = true;
  auto one = [&](const std::string& n, const std::string& v) {
    if (!first) out += ',';
    first = false;
    out += n;
    out += "=\"";
    for (char c : v) {
      if (c == '\\') out += "\\\\";
      else if (c == '"') out += "\\\"";
      else if (c == '\n') out += "\\n";
      else out += c;
    }
    out += '"';
  };
  for (size_t i = 0; i < names.size(); ++i) one(names[i], values[i]);
  if (extra_name) one(extra_name, *extra_value);
  out += '}';
}

}  // namespace

void Counter::inc(double v) { atomic_add(value_, v); }
void Gauge::add(double v) { atomic_add(value_, v); }

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds->size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_->size() && v > (*bounds_)[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  atomic_add(sum_, v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative() const {
  std::vector<uint64_t> out(bounds_->size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) out[i] = acc += buckets_[i].load(std::memory_order_relaxed);
  return out;
}

template <typename T>
T& Family<T>::at(const std::vector<std::string>& values) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(values);
  if (it != series_.end()) return *it->second;
  std::unique_ptr<T> s;
  if constexpr (std::is_same_v<T, Histogram>) s = std::make_unique<T>(&bounds_);
  else s = std::make_unique<T>();
  return *series_.emplace(values, std::move(s)).first->second;
}

template <typename T>
void Family<T>::each(const std::function<void(const std::vector<std::string>&, const T&)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [k, v] : series_) f(k, *v);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

const std::vector<double>& latency_buckets() {
  static const std::vector<double> b = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
                                        50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0};
  return b;
}

Family<Counter>& Metrics::counter(const std::string& name, const std::string& help, std::vector<std::string> labels) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& f : counters_) if (f->name() == name) return *f;
  counters_.push_back(std::make_unique<Family<Counter>>(name, help, std::move(labels)));
  return *counters_.back();
}

Family<Gauge>& Metrics::gauge(const std::string& name, const std::string& help, std::vector<std::string> labels) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& f : gauges_) if (f->name() == name) return *f;
  gauges_.push_back(std::make_unique<Family<Gauge>>(name, help, std::move(labels)));
  return *gauges_.back();
}

Family<Histogram>& Metrics::histogram(const std::string& name, const std::string& help,
                                      std::vector<std::string> labels, std::vector<double> bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& f : histograms_) if (f->name() == name) return *f;
  histograms_.push_back(std::make_unique<Family<Histogram>>(name, help, std::move(labels), std::move(bounds)));
  return *histograms_.back();
}

void Metrics::on_collect(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.push_back(std::move(f));
}

std::string Metrics::render() const {
  std::vector<std::function<void()>> collectors;
  {
    std::lock_guard<std::mutex> lock(mu_);
    collectors = collectors_;
  }
  for (auto& c : collectors) c();
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out.reserve(8192);
  auto header = [&](const std::string& name, const std::string& help, const char* type) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  for (auto& f : counters_) {
    header(f->name(), f->help(), "counter");
    f->each([&](const std::vector<std::string>& lv, const Counter& c) {
      out += f->name();
      append_labels(out, f->label_names(), lv);
      out += ' ';
      append_number(out, c.value());
      out += '\n';
    });
  }
  for (auto& f : gauges_) {
    header(f->name(), f->help(), "gauge");
    f->each([&](const std::vector<std::string>& lv, const Gauge& g) {
      out += f->name();
      append_labels(out, f->label_names(), lv);
      out += ' ';
      append_number(out, g.value());
      out += '\n';
    });
  }
  for (auto& f : histograms_) {
    header(f->name(), f->help(), "histogram");
    f->each([&](const std::vector<std::string>& lv, const Histogram& h) {
      auto cum = h.cumulative();
      const auto& b = f->bounds();
      for (size_t i = 0; i <= b.size(); ++i) {
        std::string le;
        if (i < b.size()) {
          char buf[32];
          auto r = std::to_chars(buf, buf + sizeof buf, b[i]);
          le.assign(buf, r.ptr);
        } else {
          le = "+Inf";
        }
        out += f->name() + "_bucket";
        append_labels(out, f->label_names(), lv, "le", &le);
        out += ' ' + std::to_string(cum[i]) + '\n';
      }
      out += f->name() + "_sum";
      append_labels(out, f->label_names(), lv);
      out += ' ';
      append_number(out, h.sum());
      out += '\n' + f->name() + "_count";
      append_labels(out, f->label_names(), lv);
      out += ' ' + std::to_string(h.count()) + '\n';
    });
  }
  return out;
}

}  // namespace kiln
