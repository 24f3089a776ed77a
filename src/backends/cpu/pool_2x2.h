#pragma once
// One output row of a 2x2, stride-2, unpadded NHWC max pool (internal): shared by
// max_pool2d's fast path (pool_kernels.cc) and fused_conv2d's pooled store
// (conv_kernels.cc).
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kiln::cpu {

// out[ow, 0:C] = max over the 2x2 window at column 2 * ow of input rows r0 and r1
// (each at least 2 * PW pixels of C channels), ow < PW. For floats a NaN in a window
// wins (as max_pool2d's loop does).
template <typename T>
inline void max_pool_2x2_row(const T* r0, const T* r1, int64_t PW, int64_t C, T* out) {
  for (int64_t ow = 0; ow < PW; ++ow) {
    const T *a = r0 + 2 * ow * C, *b = a + C, *c = r1 + 2 * ow * C, *d = c + C;
    T* o = out + ow * C;
    if constexpr (std::is_integral_v<T>) {
#pragma omp simd
      for (int64_t k = 0; k < C; ++k) o[k] = std::max(std::max(a[k], b[k]), std::max(c[k], d[k]));
    } else {
      auto pick = [](T m, T e) { return (e > m || e != e) ? e : m; };  // NaN sticks once taken
#pragma omp simd
      for (int64_t k = 0; k < C; ++k) o[k] = pick(pick(pick(a[k], b[k]), c[k]), d[k]);
    }
  }
}

}  // namespace kiln::cpu
