#pragma once
// Cache keys made of dtypes and shapes as raw bytes (the executor's plan cache and
// kiln::function's concrete functions look them up on every call: no formatting), and
// the comparison both use first against the previous call's (no key built at all).
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"

namespace kiln::graph::detail {

inline void append_key(std::string& k, int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); }

// dtype, rank, dims.
inline void append_key(std::string& k, DType dtype, const Shape& shape) {
  append_key(k, static_cast<int64_t>(dtype));
  append_key(k, shape.rank());
  for (int64_t d : shape.dims()) append_key(k, d);
}

// Whether every tensor is defined and has the dtype and shape of the meta at its place.
inline bool same_metas(const std::vector<TensorMeta>& metas, const std::vector<Tensor>& ts) {
  if (metas.size() != ts.size()) return false;
  for (size_t i = 0; i < ts.size(); ++i)
    if (!ts[i].defined() || metas[i].dtype != ts[i].dtype() || metas[i].shape != ts[i].shape()) return false;
  return true;
}

inline std::vector<TensorMeta> metas_of(const std::vector<Tensor>& ts) {
  std::vector<TensorMeta> m;
  m.reserve(ts.size());
  for (const Tensor& t : ts) m.push_back({t.shape(), t.dtype()});
  return m;
}

}  // namespace kiln::graph::detail
