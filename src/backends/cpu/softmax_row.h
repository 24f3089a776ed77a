#pragma once
// Numerically stable (log-)softmax of one contiguous row (internal), shared by the
// softmax kernels and fused attention. y may alias x.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "vecmath.h"

namespace kiln::cpu {

// One contiguous row of n values.
template <typename T, bool kLog>
inline void softmax_row(const T* x, T* y, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  T s = 0;
  if constexpr (kLog) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += vm::exp(x[i] - m);
    const T shift = m + vm::log(s);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - shift;
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      y[i] = vm::exp(x[i] - m);
      s += y[i];
    }
    const T inv = T(1) / s;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

}  // namespace kiln::cpu
