// CPU kernels for the fused optimizer updates (sgd_update, adam_update,
// rmsprop_update): one pass over param, grad and the slots, parallel over elements.
// An output may be its input's buffer (OpDef::overwritable: updates in place), so
// param, the slots and their results are not __restrict; element i is read before it
// is written and `omp simd` vectorises the loops all the same.
// f16/bf16 compute in float, converted in L1-sized chunks (no whole-tensor passes).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernel_util.h"
#include "loops.h"
#include "kiln/core/kernel.h"

namespace kiln::cpu {
namespace {


template <typename T>
inline void load(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, half>)
    convert_half_to_float(src, dst, static_cast<size_t>(n));
  else
    convert_bf16_to_float(src, dst, static_cast<size_t>(n));
}
template <typename T>
inline void store(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, half>)
    convert_float_to_half(src, dst, static_cast<size_t>(n));
  else
    convert_float_to_bf16(src, dst, static_cast<size_t>(n));
}

// n contiguous elements of every input and output, in the compute type.
template <typename C, int NIn, int NOut>
struct Block {
  using value_type = C;
  const C* in[NIn];
  C* out[NOut];
  int64_t n;
};

// An update costs a square root and a division per element (Adam, RMSprop) or reads
// and writes three or four arrays: a quarter of an elementwise op's grain, so a 256x128
// kernel (32768 elements) runs on every core.
constexpr int64_t kUpdateGrain = kElementwiseGrain / 4;

// Runs f(Block) over [0, numel) split across the pool; inputs and outputs all have
// the param's shape (checked by inference).
template <typename T, int NIn, int NOut, typename F>
void fused(OpContext& ctx, F f) {
  using C = compute_t<T>;
  const T* in[NIn];
  T* out[NOut];
  for (int k = 0; k < NIn; ++k) in[k] = static_cast<const T*>(ctx.in[k].raw_data());
  for (int k = 0; k < NOut; ++k) out[k] = static_cast<T*>(ctx.out[k].raw_data());
  parallel_for(ctx.in[0].numel(), kUpdateGrain, [&](int64_t b, int64_t e) {
    if constexpr (kIs16<T>) {
      float ib[NIn][kChunk], ob[NOut][kChunk];
      for (int64_t i = b; i < e; i += kChunk) {
        const int64_t m = std::min(kChunk, e - i);
        Block<float, NIn, NOut> blk;
        for (int k = 0; k < NIn; ++k) {
          load(in[k] + i, ib[k], m);
          blk.in[k] = ib[k];
        }
        for (int k = 0; k < NOut; ++k) blk.out[k] = ob[k];
        blk.n = m;
        f(blk);
        for (int k = 0; k < NOut; ++k) store(ob[k], out[k] + i, m);
      }
    } else {
      Block<C, NIn, NOut> blk;
      for (int k = 0; k < NIn; ++k) blk.in[k] = in[k] + b;
      for (int k = 0; k < NOut; ++k) blk.out[k] = out[k] + b;
      blk.n = e - b;
      f(blk);
    }
  });
}

// The learning rate and step: from the attrs, or from the last input (f64 [2]) when
// the op was given one (attr hyper).
struct Hyper {
  double lr;
  double step;
};
Hyper hyper_of(const OpContext& ctx) {
  if (ctx.attrs.get_bool("hyper", false)) {
    const double* h = static_cast<const double*>(ctx.in.back().raw_data());
    return {h[0], h[1]};
  }
  return {ctx.attrs.get_float("lr"), static_cast<double>(ctx.attrs.get_int("step", 1))};
}

// 1 - lr * weight_decay: decoupled weight decay as a factor on param.
double decay_factor(const Attrs& a, double lr) { return 1.0 - lr * a.get_float("weight_decay", 0); }

template <typename T>
void k_sgd(OpContext& ctx) {
  const double lr_d = hyper_of(ctx).lr, mu_d = ctx.attrs.get_float("momentum", 0);
  const double decay_d = decay_factor(ctx.attrs, lr_d);
  if (mu_d == 0) {
    fused<T, 2, 1>(ctx, [=](auto& blk) {
      using C = typename std::remove_reference_t<decltype(blk)>::value_type;
      const C lr = static_cast<C>(lr_d), decay = static_cast<C>(decay_d);
      const C* p = blk.in[0];
      const C* __restrict g = blk.in[1];
      C* po = blk.out[0];
#pragma omp simd
      for (int64_t i = 0; i < blk.n; ++i) po[i] = p[i] * decay - lr * g[i];
    });
  } else {
    const bool nesterov = ctx.attrs.get_bool("nesterov", false);
    fused<T, 3, 2>(ctx, [=](auto& blk) {
      using C = typename std::remove_reference_t<decltype(blk)>::value_type;
      const C lr = static_cast<C>(lr_d), mu = static_cast<C>(mu_d), decay = static_cast<C>(decay_d);
      const C* p = blk.in[0];
      const C* __restrict g = blk.in[1];
      const C* m = blk.in[2];
      C* po = blk.out[0];
      C* mo = blk.out[1];
      if (nesterov) {
#pragma omp simd
        for (int64_t i = 0; i < blk.n; ++i) {
          const C step = -lr * g[i];
          const C mn = mu * m[i] + step;
          mo[i] = mn;
          po[i] = p[i] * decay + (mu * mn + step);
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < blk.n; ++i) {
          const C mn = mu * m[i] - lr * g[i];
          mo[i] = mn;
          po[i] = p[i] * decay + mn;
        }
      }
    });
  }
}

template <typename T>
void k_adam(OpContext& ctx) {
  const Attrs& a = ctx.attrs;
  const Hyper h = hyper_of(ctx);
  const double lr = h.lr, t = h.step;
  const double b1 = a.get_float("beta_1"), b2 = a.get_float("beta_2");
  const double alpha_d = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
  const double decay_d = decay_factor(a, lr), eps_d = a.get_float("epsilon");
  fused<T, 4, 3>(ctx, [=](auto& blk) {
    using C = typename std::remove_reference_t<decltype(blk)>::value_type;
    const C alpha = static_cast<C>(alpha_d), decay = static_cast<C>(decay_d), eps = static_cast<C>(eps_d);
    const C c1 = static_cast<C>(1 - b1), c2 = static_cast<C>(1 - b2);
    const C* p = blk.in[0];
    const C* __restrict g = blk.in[1];
    const C* m = blk.in[2];
    const C* v = blk.in[3];
    C* po = blk.out[0];
    C* mo = blk.out[1];
    C* vo = blk.out[2];
#pragma omp simd
    for (int64_t i = 0; i < blk.n; ++i) {
      const C gi = g[i];
      const C mn = m[i] + (gi - m[i]) * c1;
      const C vn = v[i] + (gi * gi - v[i]) * c2;
      mo[i] = mn;
      vo[i] = vn;
      po[i] = p[i] * decay - alpha * mn / (std::sqrt(vn) + eps);
    }
  });
}

// Slots after velocity: momentum (MOM) then average_grad (CENTERED).
template <typename T, bool MOM, bool CENTERED>
void rmsprop(OpContext& ctx) {
  const Attrs& a = ctx.attrs;
  const double lr_d = hyper_of(ctx).lr, rho_d = a.get_float("rho"), mu_d = a.get_float("momentum", 0);
  const double eps_d = a.get_float("epsilon"), decay_d = decay_factor(a, lr_d);
  constexpr int kIn = 3 + MOM + CENTERED;
  fused<T, kIn, kIn - 1>(ctx, [=](auto& blk) {
    using C = typename std::remove_reference_t<decltype(blk)>::value_type;
    const C lr = static_cast<C>(lr_d), rho = static_cast<C>(rho_d), c = static_cast<C>(1 - rho_d);
    const C mu = static_cast<C>(mu_d), eps = static_cast<C>(eps_d), decay = static_cast<C>(decay_d);
    const C* p = blk.in[0];
    const C* __restrict g = blk.in[1];
    const C* v = blk.in[2];
    const C* mom = blk.in[MOM ? 3 : 0];
    const C* mg = blk.in[CENTERED ? 3 + MOM : 0];
    C* po = blk.out[0];
    C* vo = blk.out[1];
    C* momo = blk.out[MOM ? 2 : 0];
    C* mgo = blk.out[CENTERED ? 2 + MOM : 0];
#pragma omp simd
    for (int64_t i = 0; i < blk.n; ++i) {
      const C gi = g[i];
      const C vn = rho * v[i] + c * (gi * gi);
      vo[i] = vn;
      C denom;
      if constexpr (CENTERED) {
        const C mgn = rho * mg[i] + c * gi;
        mgo[i] = mgn;
        denom = vn - mgn * mgn + eps;
      } else {
        denom = vn + eps;
      }
      const C inc = lr * gi / std::sqrt(denom);
      if constexpr (MOM) {
        const C mn = mu * mom[i] + inc;
        momo[i] = mn;
        po[i] = p[i] * decay - mn;
      } else {
        po[i] = p[i] * decay - inc;
      }
    }
  });
}

template <typename T>
void k_rmsprop(OpContext& ctx) {
  const bool mom = ctx.attrs.get_float("momentum", 0) > 0, centered = ctx.attrs.get_bool("centered", false);
  if (mom && centered)
    rmsprop<T, true, true>(ctx);
  else if (mom)
    rmsprop<T, true, false>(ctx);
  else if (centered)
    rmsprop<T, false, true>(ctx);
  else
    rmsprop<T, false, false>(ctx);
}

#define KILN_REG_OPTIM(op, K)                             \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF32, K<float>);  \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF64, K<double>); \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kF16, K<half>);   \
  KILN_REGISTER_KERNEL(op, kCPU, DType::kBF16, K<bfloat16>)

KILN_REG_OPTIM("sgd_update", k_sgd);
KILN_REG_OPTIM("adam_update", k_adam);
KILN_REG_OPTIM("rmsprop_update", k_rmsprop);

}  // namespace
}  // namespace kiln::cpu
