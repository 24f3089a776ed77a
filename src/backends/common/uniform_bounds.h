#pragma once
// The clamping bounds of uniform floats that every backend applies (internal,
// header-only): the smallest T >= lo and the largest T < hi, so that rounding
// lo + (hi - lo) * u to T never leaves [lo, hi).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "kiln/core/half.h"

namespace kiln::backends {

template <typename T>
inline constexpr bool kHalf = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <typename T>
double to_d(T v) {
  if constexpr (kHalf<T>) return static_cast<float>(v);
  else return static_cast<double>(v);
}
template <typename T>
T from_d(double v) {
  if constexpr (kHalf<T>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
// One representable step toward +inf (up) or -inf.
template <typename T>
T step(T v, bool up) {
  if constexpr (kHalf<T>) {
    uint16_t b = v.bits;
    if (up) b = b == 0x8000 ? 0x0001 : (b & 0x8000) ? b - 1 : b + 1;
    else b = b == 0x0000 ? 0x8001 : (b & 0x8000) ? b + 1 : b - 1;
    T r;
    r.bits = b;
    return r;
  } else {
    return std::nextafter(v, up ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity());
  }
}
// Smallest T >= lo and largest T < hi (the op checked that such values exist).
template <typename T>
std::pair<T, T> uniform_bounds(double lo, double hi) {
  T l = from_d<T>(lo), h = from_d<T>(hi);
  while (to_d(l) < lo) l = step(l, true);
  while (to_d(h) >= hi) h = step(h, false);
  return {l, h};
}

}  // namespace kiln::backends
