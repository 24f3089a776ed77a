// Fused optimizer updates on CUDA: sgd_update, adam_update, rmsprop_update (f32, f64,
// f16, bf16). Semantics: src/backends/cpu/optim_kernels.cc and src/ops/optim.cc.
//
// With attr hyper, the last input is f64[2] = (lr, step). A traced training step may
// keep it on the host while the variables live on the GPU: then it is read here; on
// the device, its pointer goes to the kernel, which reads it (no synchronisation).
#include "kernel_util.h"
#include "optim_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

// The tensors, n, weight decay and (lr, step), common to every update.
OptimArgs common(const OpContext& ctx) {
  OptimArgs a;
  const Attrs& at = ctx.attrs;
  size_t n_in = ctx.in.size();
  if (at.get_bool("hyper", false)) {
    const Tensor& h = ctx.in.back();
    --n_in;
    if (h.device().type == DeviceType::kCPU) {
      const double* v = static_cast<const double*>(h.raw_data());
      a.lr = v[0];
      a.step = v[1];
    } else {
      a.hyper = static_cast<const double*>(h.raw_data());
    }
  } else {
    a.lr = at.get_float("lr");
    a.step = static_cast<double>(at.get_int("step", 1));
  }
  KILN_CHECK_INTERNAL(n_in <= 5 && ctx.out.size() <= 4, "optimizer update: unexpected arity");
  for (size_t i = 0; i < n_in; ++i) a.in[i] = ctx.in[i].raw_data();
  for (size_t o = 0; o < ctx.out.size(); ++o) a.out[o] = ctx.out[o].raw_data();
  a.n = ctx.in[0].numel();
  a.weight_decay = at.get_float("weight_decay", 0);
  return a;
}

void run(const OpContext& ctx, const OptimArgs& a) {
  if (a.n == 0) return;
  KernelScope s(ctx.out[0]);
  launch_optim(a, ctx.in[0].dtype(), s.stream);
}

void k_sgd(OpContext& ctx) {
  OptimArgs a = common(ctx);
  a.momentum = ctx.attrs.get_float("momentum", 0);
  if (a.momentum == 0)
    a.kind = OptimKind::kSgd;
  else
    a.kind = ctx.attrs.get_bool("nesterov", false) ? OptimKind::kSgdNesterov : OptimKind::kSgdMomentum;
  run(ctx, a);
}

void k_adam(OpContext& ctx) {
  OptimArgs a = common(ctx);
  a.kind = OptimKind::kAdam;
  a.beta_1 = ctx.attrs.get_float("beta_1");
  a.beta_2 = ctx.attrs.get_float("beta_2");
  a.epsilon = ctx.attrs.get_float("epsilon");
  run(ctx, a);
}

void k_rmsprop(OpContext& ctx) {
  OptimArgs a = common(ctx);
  a.kind = OptimKind::kRmsprop;
  a.rho = ctx.attrs.get_float("rho");
  a.momentum = ctx.attrs.get_float("momentum", 0);
  a.epsilon = ctx.attrs.get_float("epsilon");
  a.rms_momentum = a.momentum > 0;
  a.centered = ctx.attrs.get_bool("centered", false);
  run(ctx, a);
}

KILN_REGISTER_KERNEL("sgd_update", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_sgd);
KILN_REGISTER_KERNEL("adam_update", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_adam);
KILN_REGISTER_KERNEL("rmsprop_update", kCUDA, KILN_CUDA_FLOAT_DTYPES, k_rmsprop);

}  // namespace
}  // namespace kiln::cuda
