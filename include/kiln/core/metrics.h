#pragma once
// Prometheus metrics: counters, gauges and histograms with labels, rendered in
// Prometheus' text exposition format (version 0.0.4). The model server exposes them on
// its REST port; a training process with metrics_endpoint.h.
//
//   Metrics m;
//   auto& requests = m.counter("kiln_requests_total", "Requests answered", {"model", "api", "code"});
//   requests.at({"mnist", "rest", "OK"}).inc();
//   std::string text = m.render();
//
// Thread-safety: every method may be called from any thread. Increments are lock-free
// once a label set exists; creating a label set takes a short lock.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln {

class Counter {
 public:
  void inc(double v = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void observe(double v);
  // Cumulative counts per bound (then +Inf), the sum and the count.
  std::vector<uint64_t> cumulative() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_->size() + 1
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

// One metric name with a fixed list of label names; at() returns the series of one
// label-value tuple (created on first use, never removed: label sets must stay few).
template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> labels, std::vector<double> bounds = {})
      : name_(std::move(name)), help_(std::move(help)), labels_(std::move(labels)), bounds_(std::move(bounds)) {}
  T& at(const std::vector<std::string>& values);
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return labels_; }
  const std::vector<double>& bounds() const { return bounds_; }
  // Visits every series (under the family's lock).
  void each(const std::function<void(const std::vector<std::string>&, const T&)>& f) const;

 private:
  std::string name_, help_;
  std::vector<std::string> labels_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_;
};

// Latency buckets in seconds: 50 us .. 60 s, roughly x2.5 apart.
const std::vector<double>& latency_buckets();

class Metrics {
 public:
  Family<Counter>& counter(const std::string& name, const std::string& help, std::vector<std::string> labels);
  Family<Gauge>& gauge(const std::string& name, const std::string& help, std::vector<std::string> labels);
  Family<Histogram>& histogram(const std::string& name, const std::string& help, std::vector<std::string> labels,
                               std::vector<double> bounds);
  // Called before each render() to refresh gauges (process CPU/RSS, allocator bytes ...).
  void on_collect(std::function<void()> f);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::function<void()>> collectors_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_;
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_;
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_;
};

}  // namespace kiln
