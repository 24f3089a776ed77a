#pragma once
// Cache keys made of dtypes and shapes as raw bytes (the executor's plan cache and
// kiln::function's concrete functions look them up on every call: no formatting).
#include <cstdint>
#include <string>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"

namespace kiln::graph::detail {

inline void append_key(std::string& k, int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); }

// dtype, rank, dims.
inline void append_key(std::string& k, DType dtype, const Shape& shape) {
  append_key(k, static_cast<int64_t>(dtype));
  append_key(k, shape.rank());
  for (int64_t d : shape.dims()) append_key(k, d);
}

}  // namespace kiln::graph::detail
