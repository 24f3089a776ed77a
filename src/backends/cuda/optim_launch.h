#pragma once
// Launchers of optim_kernels.cu (internal).
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

enum class OptimKind : int32_t { kSgd, kSgdMomentum, kSgdNesterov, kAdam, kRmsprop };

// One fused optimizer update over n elements; every input and output has one floating
// dtype. Inputs and outputs in the op's order:
//   kSgd:          (param, grad)            -> (param')
//   kSgdMomentum,
//   kSgdNesterov:  (param, grad, momentum)  -> (param', momentum')
//   kAdam:         (param, grad, m, v)      -> (param', m', v')
//   kRmsprop:      (param, grad, velocity[, momentum][, average_grad]) -> (param', velocity'[, ...])
// The learning rate and step come from `lr`/`step`, or, when `hyper` is set, from the
// device array hyper = (lr, step) (f64), read by the kernel (no host synchronisation).
struct OptimArgs {
  OptimKind kind = OptimKind::kSgd;
  int64_t n = 0;
  const void* in[5] = {};
  void* out[4] = {};
  const double* hyper = nullptr;
  double lr = 0, step = 1;
  double momentum = 0, weight_decay = 0;
  double beta_1 = 0, beta_2 = 0, epsilon = 0, rho = 0;
  bool rms_momentum = false, centered = false;
};
void launch_optim(const OptimArgs& args, DType dtype, cudaStream_t stream);

}  // namespace kiln::cuda
