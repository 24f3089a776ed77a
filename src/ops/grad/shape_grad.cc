// Vjps of the shape ops. Each routes the cotangent back to the positions the op read:
// inverse layouts (reshape, transpose), slices of the cotangent (concat, stack, pad
// constant), sums over copies (broadcast_to, tile), and for general index maps
// (strided_slice with strides != 1, pad reflect/edge) a scatter_add of the cotangent
// at the flat input positions obtained by running the op itself on an iota.
#include "../op_util.h"
#include "../shape_util.h"
#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;

Tensor strided_slice_canonical(const Tensor& x, const std::vector<int64_t>& begin, const std::vector<int64_t>& size,
                               const std::vector<int64_t>& strides) {
  return detail::call1(KILN_OP("strided_slice"), {x}, {{"begin", begin}, {"size", size}, {"strides", strides}});
}

V reshape_vjp(const VjpContext& c) { return {ops::reshape(c.cotangents[0], c.inputs[0].shape().vec())}; }

V transpose_vjp(const VjpContext& c) {
  std::vector<int> p = shape_detail::resolve_perm(c.attrs.get_ints("perm", {}), c.inputs[0].rank());
  std::vector<int64_t> inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[p[i]] = static_cast<int64_t>(i);
  return {ops::transpose(c.cotangents[0], inv)};
}

V broadcast_to_vjp(const VjpContext& c) { return {sum_to(c.cotangents[0], c.inputs[0].shape())}; }

V concat_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  const int axis = normalize_axis(c.attrs.get_int("axis"), g.rank(), "concat axis");
  V r(c.inputs.size());
  std::vector<int64_t> begin(g.rank(), 0);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& x = c.inputs[i];
    if (c.needs(i)) r[i] = ops::slice(g, begin, x.shape().vec());
    begin[axis] += x.dim(axis);
  }
  return r;
}

V stack_vjp(const VjpContext& c) {
  const Tensor& g = c.cotangents[0];
  const int axis = normalize_axis(c.attrs.get_int("axis"), g.rank(), "stack axis");
  V r(c.inputs.size());
  std::vector<int64_t> begin(g.rank(), 0), size = g.shape().vec();
  size[axis] = 1;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    begin[axis] = static_cast<int64_t>(i);
    if (c.needs(i)) r[i] = ops::reshape(ops::slice(g, begin, size), c.inputs[i].shape().vec());
  }
  return r;
}

// The tape hands zeros for parts that got no cotangent, so all parts are defined.
V split_vjp(const VjpContext& c) {
  return {ops::concat(std::vector<Tensor>(c.cotangents.begin(), c.cotangents.end()), c.attrs.get_int("axis"))};
}

V strided_slice_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &g = c.cotangents[0];
  const auto &begin = c.attrs.get_ints("begin"), &size = c.attrs.get_ints("size"),
             &strides = c.attrs.get_ints("strides");
  if (g.numel() == 0) return {ops::zeros_like(x, g.dtype())};
  bool unit = true;
  for (int64_t s : strides) unit = unit && s == 1;
  if (unit) {  // a block: pad the cotangent back out with zeros
    std::vector<std::pair<int64_t, int64_t>> p;
    for (int d = 0; d < x.rank(); ++d) p.emplace_back(begin[d], x.dim(d) - begin[d] - size[d]);
    return {ops::pad(g, p)};
  }
  return {scatter_flat(x, strided_slice_canonical(iota_like(x), begin, size, strides), g)};
}

V pad_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &g = c.cotangents[0];
  const std::vector<int64_t>& p = c.attrs.get_ints("paddings");
  const std::string mode = c.attrs.get_string("mode", "constant");
  if (mode == "constant") {  // the padded cells are constants: the gradient is the inner block
    std::vector<int64_t> begin(x.rank());
    for (int d = 0; d < x.rank(); ++d) begin[d] = p[2 * d];
    return {ops::slice(g, begin, x.shape().vec())};
  }
  // reflect / edge: every output cell is a copy of some input cell; pad the iota the
  // same way to find which.
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int d = 0; d < x.rank(); ++d) pairs.emplace_back(p[2 * d], p[2 * d + 1]);
  return {scatter_flat(x, ops::pad(iota_like(x), pairs, mode), g)};
}

// out[k * s + j] = x[j] per dimension: view each tiled dimension as (reps, s) and sum
// the reps, one dimension at a time (keeps the rank <= 4 whatever x's rank).
V tile_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const std::vector<int64_t>& reps = c.attrs.get_ints("reps");
  Tensor g = c.cotangents[0];
  Shape cur = g.shape();
  for (int d = 0; d < x.rank(); ++d) {
    if (reps[d] == 1) continue;
    int64_t before = 1, after = 1;
    for (int i = 0; i < d; ++i) before *= cur[i];
    for (int i = d + 1; i < cur.rank(); ++i) after *= cur[i];
    g = ops::sum(ops::reshape(g, {before, reps[d], x.dim(d), after}), {1});
    cur[d] = x.dim(d);
    g = ops::reshape(g, cur.vec());
  }
  return {g};
}

KILN_REGISTER_VJP("reshape", reshape_vjp);
KILN_REGISTER_VJP("transpose", transpose_vjp);
KILN_REGISTER_VJP("broadcast_to", broadcast_to_vjp);
KILN_REGISTER_VJP("concat", concat_vjp);
KILN_REGISTER_VJP("stack", stack_vjp);
KILN_REGISTER_VJP("split", split_vjp);
KILN_REGISTER_VJP("strided_slice", strided_slice_vjp);
KILN_REGISTER_VJP("pad", pad_vjp);
KILN_REGISTER_VJP("tile", tile_vjp);

}  // namespace
}  // namespace kiln::ops::grad
