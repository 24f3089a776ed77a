// int8 inference ops vs their f32 fused counterparts at the layer shapes of the
// built-in Fashion-MNIST cnn (src/tools/train_cmd.cc build_model "cnn") at batch 64:
//   conv1: fused_conv2d 3x3 1->32 on 28x28, same, ReLU  vs qlinear_conv2d
//   conv2: fused_conv2d 3x3 32->64 on 14x14, same, ReLU vs qlinear_conv2d
//   dense1: fused_matmul 3136->128, ReLU                vs qlinear_matmul
//   dense2: fused_matmul 128->10                        vs qlinear_matmul
// and the four layers together (no pooling). Each int8 op is timed in three weight /
// activation regimes (see kiln/ops/nn.h on saturation):
//   w7     7-bit weights (|w_q| <= 64), u8 activations in [0, 255]: oneDNN's fast path
//   w8r7   8-bit weights, activations in [0, 127] (reduce_range): fast path
//   w8     8-bit weights, activations in [0, 255]: the exact split path (2x the work)
// Inputs are in [0, 1) (images, ReLU outputs), quantised with zero point 0. Times are
// medians of 20 runs after 5 warm-up runs; ratio = f32 / int8 (> 1: int8 is faster).
// Run: build/default/bin/bench_int8 [batch]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

double median_us(const std::function<Tensor()>& fn) {
  for (int i = 0; i < 5; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < 20; ++i) {
    auto a = std::chrono::steady_clock::now();
    Tensor y = fn();
    (void)y.raw_data();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return (t[9] + t[10]) / 2;
}

// Symmetric per-output-channel (last dim) quantisation of w to [-qmax, qmax].
struct QWeight {
  Tensor q, scale;
};
QWeight quantize_weight(const Tensor& w, int qmax) {
  const int64_t n = w.dim(w.rank() - 1), rows = w.numel() / n;
  const float* p = w.data<float>();
  std::vector<float> s(n, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) s[j] = std::max(s[j], std::abs(p[r * n + j]));
  for (float& v : s) v = v > 0 ? v / qmax : 1.0f;
  std::vector<int8_t> q(w.numel());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) q[r * n + j] = static_cast<int8_t>(std::nearbyint(p[r * n + j] / s[j]));
  return {Tensor::from_vector<int8_t>(q, w.shape()), Tensor::from_vector<float>(s, Shape{n})};
}

struct Layer {
  std::string name;
  bool conv;
  Tensor x, w, b;
  bool relu;
  Tensor run_f32() const {
    Attrs a{{"activation", std::string(relu ? "relu" : "")}};
    if (conv) {
      a.set("padding", std::string("same"));
      return call_op(OpRegistry::global().get("fused_conv2d"), std::vector<Tensor>{x, w, b}, a)[0];
    }
    return call_op(OpRegistry::global().get("fused_matmul"), std::vector<Tensor>{x, w, b}, a)[0];
  }
  Tensor run_int8(const QWeight& qw, double x_scale) const {
    const std::string act = relu ? "relu" : "none";
    if (conv) {
      ops::Conv2dOptions same;
      same.padding = "same";
      return ops::qlinear_conv2d(x, x_scale, 0, qw.q, qw.scale, same, b, act);
    }
    return ops::qlinear_matmul(x, x_scale, 0, qw.q, qw.scale, b, act);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 64;
  std::vector<Layer> layers = {
      {"conv1 3x3 1->32 28x28", true, ops::random_uniform({n, 28, 28, 1}, 0, 1, DType::kF32, 1),
       ops::random_uniform({3, 3, 1, 32}, -0.3, 0.3, DType::kF32, 2), ops::random_uniform({32}, -0.1, 0.1, DType::kF32, 3),
       true},
      {"conv2 3x3 32->64 14x14", true, ops::random_uniform({n, 14, 14, 32}, 0, 1, DType::kF32, 4),
       ops::random_uniform({3, 3, 32, 64}, -0.05, 0.05, DType::kF32, 5),
       ops::random_uniform({64}, -0.1, 0.1, DType::kF32, 6), true},
      {"dense1 3136->128", false, ops::random_uniform({n, 3136}, 0, 1, DType::kF32, 7),
       ops::random_uniform({3136, 128}, -0.02, 0.02, DType::kF32, 8),
       ops::random_uniform({128}, -0.1, 0.1, DType::kF32, 9), true},
      {"dense2 128->10", false, ops::random_uniform({n, 128}, 0, 1, DType::kF32, 10),
       ops::random_uniform({128, 10}, -0.1, 0.1, DType::kF32, 11), ops::random_uniform({10}, -0.1, 0.1, DType::kF32, 12),
       false},
  };
  struct Regime {
    const char* name;
    int wmax;
    double x_scale;  // inputs in [0, 1): 1/255 fills u8, 1/127 keeps xq <= 127
  };
  const Regime regimes[] = {{"w7", 64, 1.0 / 255}, {"w8r7", 127, 1.0 / 127}, {"w8", 127, 1.0 / 255}};

  std::printf("batch %lld, %d threads; median of 20 runs (us); ratio = f32 / int8\n", static_cast<long long>(n),
              num_threads());
  std::printf("%-24s %10s", "layer", "f32");
  for (const Regime& r : regimes) std::printf(" %10s %7s", r.name, "ratio");
  std::printf("\n");
  double total_f32 = 0, total_int8[3] = {0, 0, 0};
  double quant_us = 0;
  for (const Layer& l : layers) {
    double f = median_us([&] { return l.run_f32(); });
    total_f32 += f;
    std::printf("%-24s %10.1f", l.name.c_str(), f);
    for (int i = 0; i < 3; ++i) {
      QWeight qw = quantize_weight(l.w, regimes[i].wmax);
      double t = median_us([&] { return l.run_int8(qw, regimes[i].x_scale); });
      total_int8[i] += t;
      std::printf(" %10.1f %7.2f", t, f / t);
    }
    std::printf("\n");
    quant_us += median_us([&] { return ops::quantize_per_tensor(l.x, 1.0 / 255, 0); });
  }
  std::printf("%-24s %10.1f", "sum of the four", total_f32);
  for (int i = 0; i < 3; ++i) std::printf(" %10.1f %7.2f", total_int8[i], total_f32 / total_int8[i]);
  std::printf("\n(of which quantize_per_tensor of the four inputs alone: %.1f us)\n", quant_us);
  return 0;
}
