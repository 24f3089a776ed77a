#pragma once
// Kernels composed of other ops' kernels (through run_kernel), for every device: what a
// backend registers where it has no fused kernel of its own, or falls back to.
#include "kiln/core/kernel.h"

namespace kiln::backends {

// fused_conv2d_backward_filter (kiln/ops/fused.h) as the ops it fuses, on the inputs'
// device: dy into a temporary by max_pool2d_backward's (or _mask's) kernel (with the
// bias sum), then conv2d_backward_filter's. The CUDA kernel, and the CPU kernel's
// fallback.
void fused_conv2d_backward_filter_unfused(OpContext& ctx);

}  // namespace kiln::backends
