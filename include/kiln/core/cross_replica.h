#pragma once
// The collective behind ops that need every replica of a distribution strategy's step
// (ops::cross_replica_sum, which synchronized BatchNormalization uses): the distribute
// layer installs one on each replica thread while Strategy::run runs a step
// (kiln/distribute/strategy.h). It sums a tensor over the replicas of the job; every
// replica must call it the same number of times with the same shapes, as they do when
// they run the same model. Without one installed (one device, no strategy) the sum over
// the only replica is the tensor itself.
//
// Thread-safety: the installed function is the calling thread's own.
#include <functional>

#include "kiln/core/tensor.h"

namespace kiln {

using CrossReplicaSumFn = std::function<Tensor(const Tensor&)>;

// The function installed on this thread, or null.
const CrossReplicaSumFn* cross_replica_sum_fn();

// Installs `fn` on this thread while it lives (scopes nest).
class CrossReplicaSumScope {
 public:
  explicit CrossReplicaSumScope(CrossReplicaSumFn fn);
  ~CrossReplicaSumScope();
  CrossReplicaSumScope(const CrossReplicaSumScope&) = delete;
  CrossReplicaSumScope& operator=(const CrossReplicaSumScope&) = delete;

 private:
  CrossReplicaSumFn fn_;
  const CrossReplicaSumFn* previous_;
};

}  // namespace kiln
