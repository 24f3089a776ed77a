#pragma once
// Weight initializers (keras.initializers). Draws come from kiln's default generator
// (kiln::set_seed makes them reproducible) unless the initializer has its own seed.
//
// Fans follow Keras: a 2-d shape [in, out] has fan_in = in, fan_out = out; a conv
// filter HWIO [h, w, in, out] has fan_in = h*w*in, fan_out = h*w*out; a 1-d shape
// has fan_in = fan_out = its size.
#include <functional>
#include <optional>

#include "kiln/core/tensor.h"

namespace kiln::train {

using Initializer = std::function<Tensor(const Shape& shape, DType dtype)>;

namespace initializers {
Initializer zeros();
Initializer ones();
Initializer constant(double value);
Initializer random_uniform(double lo = -0.05, double hi = 0.05, std::optional<uint64_t> seed = std::nullopt);
Initializer random_normal(double mean = 0, double stddev = 0.05, std::optional<uint64_t> seed = std::nullopt);
Initializer truncated_normal(double mean = 0, double stddev = 0.05, std::optional<uint64_t> seed = std::nullopt);
Initializer glorot_uniform(std::optional<uint64_t> seed = std::nullopt);  // U(+-sqrt(6/(fan_in+fan_out)))
Initializer glorot_normal(std::optional<uint64_t> seed = std::nullopt);   // TN(0, sqrt(2/(fan_in+fan_out)))
Initializer he_uniform(std::optional<uint64_t> seed = std::nullopt);      // U(+-sqrt(6/fan_in))
Initializer he_normal(std::optional<uint64_t> seed = std::nullopt);       // TN(0, sqrt(2/fan_in))
}  // namespace initializers

// {fan_in, fan_out} of a weight shape (see above).
std::pair<double, double> compute_fans(const Shape& shape);

}  // namespace kiln::train
