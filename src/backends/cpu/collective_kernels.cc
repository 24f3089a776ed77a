// CPU kernels of the ops across replicas (kiln/ops/collective.h): the sum goes through
// the collective the distribute layer installs on a replica thread
// (kiln/core/cross_replica.h).
#include <cstring>

#include "kernel_util.h"
#include "kiln/core/cross_replica.h"
#include "kiln/core/error.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {
namespace {

void k_cross_replica_sum(OpContext& ctx) {
  const Tensor& x = ctx.in[0];
  Tensor& y = ctx.out[0];
  const CrossReplicaSumFn* sum = cross_replica_sum_fn();
  if (!sum) {  // one replica
    std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
    return;
  }
  const Tensor s = (*sum)(x).to(Device::cpu());
  KILN_CHECK_INTERNAL(s.shape() == x.shape() && s.dtype() == x.dtype(), "cross_replica_sum: the collective returned ",
                      s.desc(), " for ", x.desc());
  std::memcpy(y.raw_data(), s.raw_data(), s.nbytes());
}

KILN_REGISTER_KERNEL("cross_replica_sum", kCPU, DType::kF32, k_cross_replica_sum);
KILN_REGISTER_KERNEL("cross_replica_sum", kCPU, DType::kF64, k_cross_replica_sum);

}  // namespace
}  // namespace kiln::cpu
