// Indexing ops: gather, gather_nd, scatter_add, one_hot, top_k (definitions,
// inference, eager entry points). Index values are checked by the kernels, which
// throw OutOfRangeError before writing anything.
#include <algorithm>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/shape.h"
#include "op_util.h"
#include "shape_util.h"

namespace kiln::ops {
namespace {
using detail::dtype_str;
using kiln::detail::str_cat;

bool is_index_dtype(DType t) { return t == DType::kI32 || t == DType::kI64; }

void require_index_dtype(const char* op, const TensorMeta& m) {
  if (!is_index_dtype(m.dtype))
    throw InvalidArgumentError(str_cat(op, ": indices must be i32 or i64, got ", dtype_str(m.dtype)));
}

// Resolved gather geometry, shared by gather and scatter_add.
Shape gather_shape(const char* op, const Shape& params, const Shape& indices, int64_t axis_attr, int64_t batch_attr,
                   int* axis_out = nullptr) {
  if (params.rank() == 0) throw InvalidArgumentError(str_cat(op, ": params must have rank >= 1, got a scalar"));
  int64_t bd = batch_attr < 0 ? batch_attr + indices.rank() : batch_attr;
  if (bd < 0 || bd > indices.rank())
    throw InvalidArgumentError(str_cat(op, ": batch_dims ", batch_attr, " is outside [-", indices.rank(), ", ",
                                       indices.rank(), "] for indices of shape ", indices.str()));
  int axis = normalize_axis(axis_attr, params.rank(), (std::string(op) + " axis").c_str());
  if (axis < bd)
    throw InvalidArgumentError(str_cat(op, ": axis ", axis, " must be >= batch_dims ", bd));
  for (int i = 0; i < bd; ++i)
    if (params[i] != indices[i])
      throw InvalidArgumentError(str_cat(op, ": batch dimension ", i, " differs: params ", params.str(),
                                         " vs indices ", indices.str()));
  Shape out;
  for (int i = 0; i < axis; ++i) out.push_back(params[i]);
  for (int i = static_cast<int>(bd); i < indices.rank(); ++i) out.push_back(indices[i]);
  for (int i = axis + 1; i < params.rank(); ++i) out.push_back(params[i]);
  if (axis_out) *axis_out = axis;
  return out;
}

std::vector<TensorMeta> infer_gather(std::span<const TensorMeta> in, const Attrs& a) {
  require_index_dtype("gather", in[1]);
  return {{gather_shape("gather", in[0].shape, in[1].shape, a.get_int("axis", 0), a.get_int("batch_dims", 0)),
           in[0].dtype}};
}

std::vector<TensorMeta> infer_gather_nd(std::span<const TensorMeta> in, const Attrs&) {
  require_index_dtype("gather_nd", in[1]);
  const Shape &p = in[0].shape, &ix = in[1].shape;
  if (ix.rank() == 0) throw InvalidArgumentError("gather_nd: indices must have rank >= 1, got a scalar");
  int64_t k = ix[ix.rank() - 1];
  if (k > p.rank())
    throw InvalidArgumentError(str_cat("gather_nd: indices of shape ", ix.str(), " address ", k,
                                       " dimensions but params ", p.str(), " has rank ", p.rank()));
  Shape out;
  for (int i = 0; i + 1 < ix.rank(); ++i) out.push_back(ix[i]);
  for (int i = static_cast<int>(k); i < p.rank(); ++i) out.push_back(p[i]);
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_scatter_add(std::span<const TensorMeta> in, const Attrs& a) {
  if (in[0].dtype == DType::kBool) throw InvalidArgumentError("scatter_add: x must be numeric, got bool");
  require_index_dtype("scatter_add", in[1]);
  if (in[2].dtype != in[0].dtype)
    throw InvalidArgumentError(str_cat("scatter_add: updates have dtype ", dtype_str(in[2].dtype), " but x has ",
                                       dtype_str(in[0].dtype)));
  Shape want = gather_shape("scatter_add", in[0].shape, in[1].shape, a.get_int("axis", 0), 0);
  if (in[2].shape != want)
    throw InvalidArgumentError(str_cat("scatter_add: updates must have shape ", want.str(), " (x ", in[0].shape.str(),
                                       " gathered with indices ", in[1].shape.str(), "), got ", in[2].shape.str()));
  return {in[0]};
}

std::vector<TensorMeta> infer_index_copy(std::span<const TensorMeta> in, const Attrs&) {
  require_index_dtype("index_copy", in[1]);
  const Shape &x = in[0].shape, &ix = in[1].shape, &rows = in[2].shape;
  if (x.rank() < 1 || ix.rank() != 1)
    throw InvalidArgumentError(str_cat("index_copy: x must have rank >= 1 and indices rank 1, got ", x.str(), " and ", ix.str()));
  Shape want = x;
  want[0] = ix[0];
  if (rows != want || in[2].dtype != in[0].dtype)
    throw InvalidArgumentError(str_cat("index_copy: rows must be ", dtype_str(in[0].dtype), " ", want.str(), " (one row of x ",
                                       x.str(), " per index), got ", dtype_str(in[2].dtype), " ", rows.str()));
  return {in[0]};
}

std::vector<TensorMeta> infer_one_hot(std::span<const TensorMeta> in, const Attrs& a) {
  require_index_dtype("one_hot", in[0]);
  int64_t depth = a.get_int("depth");
  if (depth < 0) throw InvalidArgumentError(str_cat("one_hot: depth must be >= 0, got ", depth));
  Shape out = in[0].shape;
  int64_t axis = a.get_int("axis", -1);
  int ax = axis == -1 ? out.rank() : normalize_axis(axis, out.rank() + 1, "one_hot axis");
  out.insert(ax, depth);
  return {{out, a.get_dtype("dtype", DType::kF32)}};
}

std::vector<TensorMeta> infer_top_k(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape& s = in[0].shape;
  if (in[0].dtype == DType::kBool) throw InvalidArgumentError("top_k: x must be numeric, got bool");
  if (s.rank() == 0) throw InvalidArgumentError("top_k: x must have rank >= 1, got a scalar");
  int64_t k = a.get_int("k");
  int64_t n = s[s.rank() - 1];
  if (k < 0 || k > n)
    throw InvalidArgumentError(str_cat("top_k: k must be in [0, ", n, "] (the last dimension of ", s.str(),
                                       "), got ", k));
  Shape out = s;
  out[s.rank() - 1] = k;
  return {{out, in[0].dtype}, {out, DType::kI64}};
}

KILN_REGISTER_OP(detail::make_def("gather", "slices of params along axis at indices (TF gather)", 2, infer_gather,
                     {{"axis", AttrType::kInt, "gathered axis of params"},
                      {"batch_dims", AttrType::kInt, "leading dimensions shared by params and indices"}},
                     Differentiable::kYes));
KILN_REGISTER_OP(detail::make_def("gather_nd", "slices of params at index tuples (TF gather_nd)", 2, infer_gather_nd, {},
                     Differentiable::kYes));
KILN_REGISTER_OP(detail::make_def("scatter_add", "x with updates added at indices along axis (vjp of gather)", 3,
                     infer_scatter_add, {{"axis", AttrType::kInt, "scattered axis of x"}}, Differentiable::kYes));
KILN_REGISTER_OP([] {
  OpDef o = detail::make_def("index_copy", "x with the rows at indices replaced (axis 0)", 3, infer_index_copy, {},
                             Differentiable::kYes);
  o.overwritable = {{0, 0}};  // out row j is x's row j or a new row: x may be written in place
  return o;
}());
KILN_REGISTER_OP([] {
  OpDef o = detail::make_def("one_hot", "one-hot encoding of integer indices", 1, infer_one_hot,
                {{"depth", AttrType::kInt, "number of classes"},
                 {"on_value", AttrType::kFloat, "value at the index"},
                 {"off_value", AttrType::kFloat, "value elsewhere"},
                 {"dtype", AttrType::kDType, "output dtype"},
                 {"axis", AttrType::kInt, "position of the new dimension (-1: last)"}},
                Differentiable::kNo);
  return o;
}());
KILN_REGISTER_OP(detail::make_def("top_k", "k largest along the last axis: values, i64 indices", 1, infer_top_k,
                     {{"k", AttrType::kInt, "how many"}, {"sorted", AttrType::kBool, "descending (else by index)"}},
                     Differentiable::kYes));

void require_defined(const char* op, std::initializer_list<const Tensor*> ts) {
  size_t i = 0;
  for (const Tensor* t : ts) {
    if (!t->defined()) throw InvalidArgumentError(str_cat("op '", op, "': input ", i, " is undefined"));
    ++i;
  }
}

// Integer indices of any width go in as i32/i64; float and bool indices are errors.
Tensor as_index(const char* op, const Tensor& indices) {
  if (is_index_dtype(indices.dtype())) return indices;
  if (is_integral(indices.dtype())) return cast(indices, DType::kI32);
  throw InvalidArgumentError(str_cat(op, ": indices must be integers, got ", dtype_str(indices.dtype())));
}

}  // namespace

Tensor gather(const Tensor& params, const Tensor& indices, int64_t axis, int64_t batch_dims) {
  require_defined("gather", {&params, &indices});
  return detail::call1(KILN_OP("gather"), {params, as_index("gather", indices)},
                       {{"axis", axis}, {"batch_dims", batch_dims}});
}

Tensor gather_nd(const Tensor& params, const Tensor& indices) {
  require_defined("gather_nd", {&params, &indices});
  return detail::call1(KILN_OP("gather_nd"), {params, as_index("gather_nd", indices)});
}

Tensor scatter_add(const Tensor& x, const Tensor& indices, const Tensor& updates, int64_t axis) {
  require_defined("scatter_add", {&x, &indices, &updates});
  if (x.dtype() == DType::kBool) throw InvalidArgumentError("scatter_add: x must be numeric, got bool");
  Tensor u = updates.dtype() == x.dtype() ? updates : cast(updates, x.dtype());
  return detail::call1(KILN_OP("scatter_add"), {x, as_index("scatter_add", indices), u}, {{"axis", axis}});
}

Tensor index_copy(const Tensor& x, const Tensor& indices, const Tensor& rows, bool in_place) {
  require_defined("index_copy", {&x, &indices, &rows});
  const std::vector<Tensor> in{x, as_index("index_copy", indices), rows.dtype() == x.dtype() ? rows : cast(rows, x.dtype())};
  if (!in_place || op_observer() != nullptr) return call_op1(KILN_OP("index_copy"), in, {});
  std::vector<Tensor> out{x};
  call_op_into(KILN_OP("index_copy"), in, out, {});
  return x;
}

Tensor one_hot(const Tensor& indices, int64_t depth, double on_value, double off_value, DType dtype, int64_t axis) {
  require_defined("one_hot", {&indices});
  return detail::call1(KILN_OP("one_hot"), {as_index("one_hot", indices)},
                       {{"depth", depth},
                        {"on_value", on_value},
                        {"off_value", off_value},
                        {"dtype", dtype},
                        {"axis", axis}});
}

TopK top_k(const Tensor& x, int64_t k, bool sorted) {
  require_defined("top_k", {&x});
  std::vector<Tensor> out = call_op(KILN_OP("top_k"), std::span<const Tensor>(&x, 1), {{"k", k}, {"sorted", sorted}});
  return {std::move(out[0]), std::move(out[1])};
}

}  // namespace kiln::ops
