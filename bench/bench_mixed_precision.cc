// Mixed precision on this machine: the built-in cnn (or mlp) trained on Fashion-MNIST
// under each dtype policy, alternating policies run by run so machine noise hits them
// alike. Prints per policy: median epoch time, speed ratio against float32, median
// test accuracy, and the memory of one training step (the allocator's peak above what
// was in use before the step: activations kept for the backward pass, gradients,
// temporaries) and of the activations alone (what a forward pass under a tape leaves
// held), with their ratios against float32.
//
//   bench_mixed_precision [cnn|mlp] [epochs=3] [runs=3] [policies=float32,mixed_bfloat16,mixed_float16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/device_config.h"
#include "kiln/core/parallel.h"
#include "kiln/core/random.h"
#include "kiln/data/idx.h"
#include "kiln/ops.h"
#include "kiln/train.h"

using namespace kiln;
using namespace kiln::train;

namespace {

ModelPtr build(const std::string& kind) {
  namespace L = layers;
  if (kind == "mlp")
    return std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(256, "relu"), L::Dense(128, "relu"), L::Dense(10)},
                                        Shape{784});
  L::Conv2DOptions same;
  same.padding = "same";
  same.activation = "relu";
  return std::make_shared<Sequential>(
      std::vector<LayerPtr>{L::Conv2D(32, {3, 3}, same), L::MaxPool2D(), L::Conv2D(64, {3, 3}, same), L::MaxPool2D(),
                            L::Flatten(), L::Dense(128, "relu"), L::Dense(10)},
      Shape{28, 28, 1});
}

Tensor images(const Tensor& u8, const std::string& kind) {
  Tensor x = ops::cast(u8, DType::kF32) * (1.0 / 255.0);
  return kind == "mlp" ? ops::reshape(x, {u8.dim(0), 784}) : ops::reshape(x, {u8.dim(0), 28, 28, 1});
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
}

struct Result {
  std::vector<double> epoch_s, accuracy, step_bytes, activation_bytes;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "cnn";
  const int epochs = argc > 2 ? std::stoi(argv[2]) : 3;
  const int runs = argc > 3 ? std::stoi(argv[3]) : 3;
  std::vector<std::string> policies;
  std::stringstream ps(argc > 4 ? argv[4] : "float32,mixed_bfloat16,mixed_float16");
  for (std::string p; std::getline(ps, p, ',');) policies.push_back(p);

  data::FashionMnist ds = data::load_fashion_mnist();
  Tensor x = images(ds.train_images, kind), y = ops::cast(ds.train_labels, DType::kI32);
  Tensor tx = images(ds.test_images, kind), ty = ops::cast(ds.test_labels, DType::kI32);
  const int64_t batch = 128;
  std::map<std::string, Result> results;
  for (int r = 0; r < runs; ++r) {
    for (const std::string& p : policies) {
      set_seed(42);
      set_global_policy(p);
      ModelPtr m = build(kind);
      m->compile({optimizers::Adam({1e-3}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
      // Memory of one step, after a warm-up step (caches, optimizer slots).
      std::vector<int64_t> begin(static_cast<size_t>(x.rank()), 0), size = x.shape().vec();
      size[0] = batch;
      std::vector<Tensor> bx{ops::slice(x, begin, size)}, by{ops::slice(y, {0}, {batch})};
      m->train_step(bx, by);
      const Device cpu = Device::cpu();
      const int64_t before = config::memory_stats(cpu).bytes_in_use;
      config::reset_peak_memory_stats(cpu);
      m->train_step(bx, by);
      results[p].step_bytes.push_back(static_cast<double>(config::memory_stats(cpu).peak_bytes_in_use - before));
      {
        // Activations: what the forward pass leaves held (for the backward pass) under a tape.
        GradientTape tape;
        Tensor out = (*m)(bx, /*training=*/true)[0];
        results[p].activation_bytes.push_back(static_cast<double>(config::memory_stats(cpu).bytes_in_use - before));
      }
      set_seed(42);
      m = build(kind);
      m->compile({optimizers::Adam({1e-3}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
      History h = m->fit(x, y, {.epochs = epochs, .batch_size = batch, .shuffle_seed = 42, .verbose = 0});
      for (double t : h.at("epoch_time")) results[p].epoch_s.push_back(t);
      results[p].accuracy.push_back(m->evaluate(tx, ty, {256})["accuracy"]);
      std::printf("run %d %-15s epoch %.2f s  test accuracy %.4f  step memory %.1f MiB\n", r + 1, p.c_str(),
                  median(h.at("epoch_time")), results[p].accuracy.back(), results[p].step_bytes.back() / (1 << 20));
      std::fflush(stdout);
    }
  }
  set_global_policy("float32");
  const Result& base = results[policies[0]];
  std::printf("\n%s, %d epochs x %d runs, batch %lld, %d threads (medians; ratios against %s)\n", kind.c_str(), epochs,
              runs, static_cast<long long>(batch), num_threads(), policies[0].c_str());
  std::printf("%-15s %10s %8s %10s %10s %8s %16s %8s\n", "policy", "epoch s", "speed", "test acc", "step MiB",
              "memory", "activations MiB", "memory");
  for (const std::string& p : policies) {
    const Result& q = results[p];
    std::printf("%-15s %10.2f %7.2fx %10.4f %10.1f %7.2fx %16.1f %7.2fx\n", p.c_str(), median(q.epoch_s),
                median(base.epoch_s) / median(q.epoch_s), median(q.accuracy), median(q.step_bytes) / (1 << 20),
                median(q.step_bytes) / median(base.step_bytes), median(q.activation_bytes) / (1 << 20),
                median(q.activation_bytes) / median(base.activation_bytes));
  }
  return 0;
}
