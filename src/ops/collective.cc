// Ops across the replicas of a distribution strategy's step (kiln/ops/collective.h).
#include "kiln/core/op_def.h"
#include "kiln/ops/collective.h"
#include "op_util.h"

namespace kiln::ops {
namespace {

std::vector<TensorMeta> infer_cross_replica_sum(std::span<const TensorMeta> in, const Attrs& attrs) {
  detail::require_floating("cross_replica_sum", in[0]);
  return detail::infer_same(in, attrs);
}

KILN_REGISTER_OP([] {
  OpDef o = detail::make_def("cross_replica_sum", "x summed over the replicas of a distribution strategy's step", 1,
                             infer_cross_replica_sum);
  // Its value depends on the other replicas, not on its input alone: a (no-op) redraw
  // marks it stateful, so graph passes never fold it into a constant, merge or
  // duplicate it (OpDef::redraw).
  o.redraw = [](Attrs&) {};
  return o;
}());

}  // namespace

Tensor cross_replica_sum(const Tensor& x) { return detail::call1(KILN_OP("cross_replica_sum"), {x}); }

}  // namespace kiln::ops
