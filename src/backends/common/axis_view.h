#pragma once
// A shape seen around one axis, as every backend's kernels iterate it (internal,
// header-only): [outer, n, inner] with outer the product of the dims before the axis.
#include <cstdint>

#include "kiln/core/shape.h"

namespace kiln::backends {

inline int64_t outer_size(const Shape& s, int axis) {
  int64_t n = 1;
  for (int d = 0; d < axis; ++d) n *= s[d];
  return n;
}

// x viewed as [outer, C, inner] around the channel axis (norms).
struct ChannelView {
  int64_t outer = 1, c = 1, inner = 1;
  ChannelView(const Shape& s, int axis) : outer(outer_size(s, axis)), c(s[axis]) {
    for (int i = axis + 1; i < s.rank(); ++i) inner *= s[i];
  }
};

}  // namespace kiln::backends
