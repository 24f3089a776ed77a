#include "kiln/train/initializers.h"

#include <cmath>

#include "kiln/ops.h"

namespace kiln::train {

std::pair<double, double> compute_fans(const Shape& s) {
  if (s.rank() == 0) return {1, 1};
  if (s.rank() == 1) return {double(s.dim(0)), double(s.dim(0))};
  if (s.rank() == 2) return {double(s.dim(0)), double(s.dim(1))};
  double receptive = 1;
  for (int i = 0; i < s.rank() - 2; ++i) receptive *= double(s.dim(i));
  return {receptive * double(s.dim(s.rank() - 2)), receptive * double(s.dim(s.rank() - 1))};
}

namespace initializers {

Initializer zeros() {
  return [](const Shape& s, DType dt) { return ops::zeros(s, dt); };
}
Initializer ones() {
  return [](const Shape& s, DType dt) { return ops::ones(s, dt); };
}
Initializer constant(double v) {
  return [v](const Shape& s, DType dt) { return ops::full(s, v, dt); };
}
Initializer random_uniform(double lo, double hi, std::optional<uint64_t> seed) {
  return [=](const Shape& s, DType dt) { return ops::random_uniform(s, lo, hi, dt, seed); };
}
Initializer random_normal(double mean, double stddev, std::optional<uint64_t> seed) {
  return [=](const Shape& s, DType dt) { return ops::random_normal(s, mean, stddev, dt, seed); };
}
Initializer truncated_normal(double mean, double stddev, std::optional<uint64_t> seed) {
  return [=](const Shape& s, DType dt) { return ops::truncated_normal(s, mean, stddev, dt, seed); };
}

namespace {
// Keras variance scaling: truncated normal's stddev is corrected for the truncation at 2 sigma.
constexpr double kTruncCorrection = 0.87962566103423978;

Initializer variance_scaling(double scale, bool fan_avg, bool uniform, std::optional<uint64_t> seed) {
  return [=](const Shape& s, DType dt) {
    auto [fan_in, fan_out] = compute_fans(s);
    double n = fan_avg ? (fan_in + fan_out) / 2 : fan_in;
    double var = scale / std::max(1.0, n);
    if (uniform) {
      double limit = std::sqrt(3 * var);
      return ops::random_uniform(s, -limit, limit, dt, seed);
    }
    return ops::truncated_normal(s, 0, std::sqrt(var) / kTruncCorrection, dt, seed);
  };
}
}  // namespace

Initializer glorot_uniform(std::optional<uint64_t> seed) { return variance_scaling(1, true, true, seed); }
Initializer glorot_normal(std::optional<uint64_t> seed) { return variance_scaling(1, true, false, seed); }
Initializer he_uniform(std::optional<uint64_t> seed) { return variance_scaling(2, false, true, seed); }
Initializer he_normal(std::optional<uint64_t> seed) { return variance_scaling(2, false, false, seed); }

}  // namespace initializers
}  // namespace kiln::train
