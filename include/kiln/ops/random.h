#pragma once
// Random tensors from the Philox4x32-10 counter-based generator (kiln/core/random.h).
//
// Determinism: with a seed, element i depends only on (seed, i, dtype), never on the
// thread count, the shape, or other draws (a longer draw with the same seed extends a
// shorter one). Without a seed the draw uses default_generator(): its seed, and a range
// of counters reserved from it, so successive unseeded calls differ and kiln::set_seed()
// makes a program's sequence of draws reproducible. The counter layout is documented
// in src/backends/cpu/random_kernels.cc.
//
// Errors (kiln::InvalidArgumentError): a negative dimension; a dtype the function does
// not produce; non-finite parameters; lo >= hi; stddev < 0; p outside [0, 1]; for
// integer random_uniform, lo or hi not an integer within the dtype's range.
#include <cstdint>
#include <optional>

#include "kiln/core/tensor.h"

namespace kiln::ops {

// Uniform on [lo, hi). Floating dtypes: lo + (hi - lo) * u with u on [0, 1) with 24
// (f32, f16, bf16) or 53 (f64) random bits, clamped below hi after rounding to the
// dtype (f16/bf16: requires a representable value in [lo, hi)). Integer dtypes
// (u8, i8, i32, i64): integers in [lo, hi), lo and hi integers.
Tensor random_uniform(const Shape& shape, double lo = 0.0, double hi = 1.0, DType dtype = DType::kF32,
                      std::optional<uint64_t> seed = std::nullopt);

// Normal(mean, stddev^2) by the Box-Muller transform; floating dtypes. stddev may be 0.
Tensor random_normal(const Shape& shape, double mean = 0.0, double stddev = 1.0, DType dtype = DType::kF32,
                     std::optional<uint64_t> seed = std::nullopt);

// Normal(mean, stddev^2) with draws farther than 2 stddev from the mean discarded and
// redrawn (TensorFlow's truncated_normal): every value lies in [mean - 2 stddev,
// mean + 2 stddev] (up to rounding to the dtype). The result's standard deviation is
// about 0.88 stddev.
Tensor truncated_normal(const Shape& shape, double mean = 0.0, double stddev = 1.0, DType dtype = DType::kF32,
                        std::optional<uint64_t> seed = std::nullopt);

// Bool tensor, each element true with probability p (p = 0: all false, p = 1: all true).
Tensor bernoulli(const Shape& shape, double p = 0.5, std::optional<uint64_t> seed = std::nullopt);

}  // namespace kiln::ops
