#include "op_util.h"

#include <algorithm>
#include "kiln/core/op_def.h"

namespace kiln::ops::detail {

const OpDef& op(const char* name) {
  const OpDef* d = OpRegistry::global().find(name);
  KILN_CHECK_INTERNAL(d && d->infer, "op '", name, "' is not registered");
  return *d;
}

OpDef make_def(const char* name, const char* doc, int num_inputs, InferFn infer, std::vector<AttrSpec> attrs,
               Differentiable d, int dispatch_input) {
  OpDef o;
  o.name = name;
  o.doc = doc;
  o.num_inputs = num_inputs;
  o.dispatch_input = dispatch_input;
  o.infer = infer;
  o.attrs = std::move(attrs);
  o.differentiable = d;
  return o;
}

std::string dtype_str(DType t) { return std::string(dtype_name(t)); }

void require_same_dtype(const char* op, std::span<const TensorMeta> in) {
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype)
      throw InvalidArgumentError(std::string(op) + ": input " + std::to_string(i) + " has dtype " + dtype_str(in[i].dtype) +
                                 " but input 0 has " + dtype_str(in[0].dtype));
}

void require_floating(const char* op, const TensorMeta& m) {
  if (!is_floating(m.dtype))
    throw InvalidArgumentError(std::string(op) + ": expected a floating-point input, got " + dtype_str(m.dtype));
}

std::vector<TensorMeta> infer_same(std::span<const TensorMeta> in, const Attrs&) { return {in[0]}; }

std::vector<TensorMeta> infer_broadcast(std::span<const TensorMeta> in, const Attrs&) {
  require_same_dtype("binary op", in);
  return {{broadcast_shapes(in[0].shape, in[1].shape), in[0].dtype}};
}

std::vector<TensorMeta> infer_broadcast_bool(std::span<const TensorMeta> in, const Attrs&) {
  require_same_dtype("comparison", in);
  return {{broadcast_shapes(in[0].shape, in[1].shape), DType::kBool}};
}

std::vector<int> normalize_axes(const std::vector<int64_t>& axes, int rank, const char* op) {
  std::vector<int> out;
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) out.push_back(normalize_axis(a, rank, (std::string(op) + " axis").c_str()));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw InvalidArgumentError(std::string(op) + ": repeated axis in the axis list");
  return out;
}

}  // namespace kiln::ops::detail
