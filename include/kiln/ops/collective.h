#pragma once
// Ops across the replicas of a distribution strategy's step.
#include "kiln/core/tensor.h"

namespace kiln::ops {

// x summed over every replica of the step (tf.distribute's ReplicaContext.all_reduce
// inside a model; synchronized BatchNormalization sums its statistics with it): every
// replica calls it with the same shape, in the same order (kiln/core/cross_replica.h).
// Outside a strategy's replica it is x. f32 or f64, on the CPU. Its gradient is the sum
// of the upstream gradients over the replicas (each replica's objective depends on
// every replica's x).
Tensor cross_replica_sum(const Tensor& x);

}  // namespace kiln::ops
