// Gradients of the ops across replicas (kiln/ops/collective.h).
#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

// y = sum_r x_r on every replica: d(sum over replicas of their objectives)/dx_r is the
// sum over the replicas of their upstream gradients.
std::vector<Tensor> cross_replica_sum_vjp(const VjpContext& c) {
  return {c.needs(0) ? ops::cross_replica_sum(c.cotangents[0]) : Tensor()};
}

KILN_REGISTER_VJP("cross_replica_sum", cross_replica_sum_vjp);

}  // namespace
}  // namespace kiln::ops::grad
