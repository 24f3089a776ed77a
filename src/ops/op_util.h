#pragma once
// Helpers shared by the op definitions (internal).
#include <span>
#include <string>
#include <vector>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::detail {

// Looks an op up once; `name` must be registered (internal error otherwise).
const OpDef& op(const char* name);

inline Tensor call1(const OpDef& d, std::initializer_list<Tensor> in, const Attrs& attrs = {}) {
  return call_op1(d, std::span<const Tensor>(in.begin(), in.size()), attrs);
}
// Function-local cached op lookup: KILN_OP("add") -> const OpDef&.
#define KILN_OP(name)                                                \
  ([]() -> const ::kiln::OpDef& {                                    \
    static const ::kiln::OpDef& d = ::kiln::ops::detail::op(name);   \
    return d;                                                        \
  }())

// An OpDef with the common fields set (dispatch_input -1: kernel chosen by the
// dtype of output 0, for ops without inputs).
OpDef make_def(const char* name, const char* doc, int num_inputs, InferFn infer, std::vector<AttrSpec> attrs = {},
               Differentiable d = Differentiable::kYes, int dispatch_input = 0);

// Inference helpers.
std::vector<TensorMeta> infer_same(std::span<const TensorMeta> in, const Attrs&);
std::vector<TensorMeta> infer_broadcast(std::span<const TensorMeta> in, const Attrs&);
std::vector<TensorMeta> infer_broadcast_bool(std::span<const TensorMeta> in, const Attrs&);
void require_same_dtype(const char* op, std::span<const TensorMeta> in);
void require_floating(const char* op, const TensorMeta& m);
std::string dtype_str(DType t);

// Axis list normalisation: sorted unique axes in [0, rank); empty input = all axes.
std::vector<int> normalize_axes(const std::vector<int64_t>& axes, int rank, const char* op);

}  // namespace kiln::ops::detail
