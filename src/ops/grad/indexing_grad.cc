// Vjps of the indexing ops. Gathers scatter_add their cotangent back (repeated indices
// accumulate); where the index map is more than one axis (gather with batch_dims,
// gather_nd, top_k) the flat source positions come from running the gather on an
// iota of the input, and the cotangent is scatter_added at those positions. Index
// inputs get no gradient; one_hot is not differentiable.
#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;

V gather_vjp(const VjpContext& c) {
  if (!c.needs(0)) return {Tensor(), Tensor()};
  const Tensor &p = c.inputs[0], &idx = c.inputs[1], &g = c.cotangents[0];
  const int64_t axis = c.attrs.get_int("axis", 0);
  int64_t bd = c.attrs.get_int("batch_dims", 0);
  if (bd < 0) bd += idx.rank();
  // scatter_add is exactly gather's transpose when there are no batch dimensions.
  if (bd == 0) return {ops::scatter_add(ops::zeros_like(p, g.dtype()), idx, g, axis), Tensor()};
  return {scatter_flat(p, ops::gather(iota_like(p), idx, axis, bd), g), Tensor()};
}

V gather_nd_vjp(const VjpContext& c) {
  if (!c.needs(0)) return {Tensor(), Tensor()};
  const Tensor &p = c.inputs[0], &idx = c.inputs[1];
  return {scatter_flat(p, ops::gather_nd(iota_like(p), idx), c.cotangents[0]), Tensor()};
}

// out = x + scatter(updates): x passes the cotangent through, updates read it back
// at the scattered positions.
V scatter_add_vjp(const VjpContext& c) {
  const Tensor &idx = c.inputs[1], &g = c.cotangents[0];
  return {c.needs(0) ? g : Tensor(), Tensor(),
          c.needs(2) ? ops::gather(g, idx, c.attrs.get_int("axis", 0)) : Tensor()};
}

// out = x with rows replaced: x's cotangent is the output's with those rows zeroed, the
// rows' is the output's at the indices.
V index_copy_vjp(const VjpContext& c) {
  const Tensor &idx = c.inputs[1], &g = c.cotangents[0];
  return {c.needs(0) ? ops::index_copy(g, idx, ops::zeros_like(c.inputs[2], g.dtype())) : Tensor(), Tensor(),
          c.needs(2) ? ops::gather(g, idx) : Tensor()};
}

// Only the values output carries a gradient; it goes to the selected positions.
V top_k_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &g = c.cotangents[0], &idx = c.outputs[1];
  if (g.numel() == 0) return {ops::zeros_like(x, g.dtype())};
  const int64_t n = x.dim(x.rank() - 1), k = g.dim(g.rank() - 1), rows = x.numel() / n;
  Tensor pos = ops::gather(ops::reshape(iota_like(x), {rows, n}), ops::reshape(idx, {rows, k}), 1, 1);
  return {scatter_flat(x, pos, g)};
}

KILN_REGISTER_VJP("gather", gather_vjp);
KILN_REGISTER_VJP("gather_nd", gather_nd_vjp);
KILN_REGISTER_VJP("scatter_add", scatter_add_vjp);
KILN_REGISTER_VJP("index_copy", index_copy_vjp);
KILN_REGISTER_VJP("top_k", top_k_vjp);

}  // namespace
}  // namespace kiln::ops::grad
