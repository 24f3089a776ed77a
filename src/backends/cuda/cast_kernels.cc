// cast on CUDA.
#include "cast_launch.h"
#include "kernel_util.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

void k_cast(OpContext& ctx) {
  KernelScope s(ctx.out[0]);
  launch_cast(ctx.in[0].raw_data(), ctx.in[0].dtype(), ctx.out[0].raw_data(), ctx.out[0].dtype(),
              ctx.out[0].numel(), s.stream);
}

KILN_REGISTER_KERNEL("cast", kCUDA, KILN_CUDA_ALL_DTYPES, k_cast);

}  // namespace
}  // namespace kiln::cuda
