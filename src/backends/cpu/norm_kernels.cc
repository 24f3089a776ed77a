// CPU normalisation kernels: batch norm (given or batch statistics), layer norm,
// RMS norm. Two-pass statistics (mean, then squared deviations), vectorised with
// `omp simd`, accumulated in the compute type (f32 for f32/f16/bf16) within
// blocks and in double across blocks. Block boundaries depend only on the shape,
// so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../common/axis_view.h"
#include "kiln/core/kernel.h"
#include "kiln/core/parallel.h"
#include "loops.h"
#include "nn_kernel_util.h"

namespace kiln::cpu {
namespace {

using backends::ChannelView;

template <typename T>
const T* in_ptr(const OpContext& ctx, int i) {
  return static_cast<const T*>(ctx.in[i].raw_data());
}

// y = x * scale[c] + shift[c] over the channel view.
template <typename T>
void apply_affine(const ChannelView& v, const T* x, const T* scale, const T* shift, T* y) {
  if (v.inner == 1) {
    parallel_for(v.outer, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(v.c, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t o = lo; o < hi; ++o) {
                     const T* xr = x + o * v.c;
                     T* yr = y + o * v.c;
#pragma omp simd
                     for (int64_t c = 0; c < v.c; ++c) yr[c] = xr[c] * scale[c] + shift[c];
                   }
                 });
    return;
  }
  parallel_for(v.outer * v.c, std::max<int64_t>(1, kElementwiseGrain / v.inner), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T s = scale[r % v.c], b = shift[r % v.c];
      const T* xr = x + r * v.inner;
      T* yr = y + r * v.inner;
#pragma omp simd
      for (int64_t i = 0; i < v.inner; ++i) yr[i] = xr[i] * s + b;
    }
  });
}

template <typename T>
void batch_norm_inference(OpContext& ctx) {
  const Tensor& xt = ctx.in[0];
  ChannelView v(xt.shape(), normalize_axis(ctx.attrs.get_int("axis"), xt.rank()));
  const double eps = ctx.attrs.get_float("eps");
  const T *mean = in_ptr<T>(ctx, 1), *var = in_ptr<T>(ctx, 2), *gamma = in_ptr<T>(ctx, 3), *beta = in_ptr<T>(ctx, 4);
  std::vector<T> scale(v.c), shift(v.c);
  for (int64_t c = 0; c < v.c; ++c) {
    double s = static_cast<double>(gamma[c]) / std::sqrt(static_cast<double>(var[c]) + eps);
    scale[c] = static_cast<T>(s);
    shift[c] = static_cast<T>(static_cast<double>(beta[c]) - static_cast<double>(mean[c]) * s);
  }
  if (xt.numel() == 0) return;
  apply_affine<T>(v, in_ptr<T>(ctx, 0), scale.data(), shift.data(), static_cast<T*>(ctx.out[0].raw_data()));
}

// Per-channel sums of f(x) over outer and inner, in double (blocks accumulate in T).
template <typename T, typename F>
std::vector<double> channel_sums(const ChannelView& v, const T* x, F f) {
  std::vector<double> total(v.c, 0.0);
  if (v.inner == 1) {
    // Rows of C channels: fixed blocks of rows, one partial vector per block.
    const int64_t rows_per_block = std::max<int64_t>(16, (v.outer + 255) / 256);
    const int64_t nblk = (v.outer + rows_per_block - 1) / rows_per_block;
    std::vector<T> part(static_cast<size_t>(nblk * v.c), T(0));
    parallel_for(nblk, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        T* acc = part.data() + b * v.c;
        for (int64_t o = b * rows_per_block; o < std::min(v.outer, (b + 1) * rows_per_block); ++o) {
          const T* xr = x + o * v.c;
#pragma omp simd
          for (int64_t c = 0; c < v.c; ++c) acc[c] += f(xr[c], c);
        }
      }
    });
    for (int64_t b = 0; b < nblk; ++b)
      for (int64_t c = 0; c < v.c; ++c) total[c] += part[b * v.c + c];
    return total;
  }
  // Contiguous runs of `inner` per (outer, channel): one partial per run.
  std::vector<double> part(static_cast<size_t>(v.outer * v.c));
  parallel_for(v.outer * v.c, std::max<int64_t>(1, kElementwiseGrain / v.inner), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t c = r % v.c;
      const T* xr = x + r * v.inner;
      T acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < v.inner; ++i) acc += f(xr[i], c);
      part[r] = acc;
    }
  });
  for (int64_t r = 0; r < v.outer * v.c; ++r) total[r % v.c] += part[r];
  return total;
}

template <typename T>
void batch_norm_training(OpContext& ctx) {
  const Tensor& xt = ctx.in[0];
  ChannelView v(xt.shape(), normalize_axis(ctx.attrs.get_int("axis"), xt.rank()));
  const double eps = ctx.attrs.get_float("eps");
  const T *x = in_ptr<T>(ctx, 0), *gamma = in_ptr<T>(ctx, 1), *beta = in_ptr<T>(ctx, 2);
  const double count = static_cast<double>(v.outer * v.inner);
  std::vector<double> sum = channel_sums<T>(v, x, [](T e, int64_t) { return e; });
  std::vector<T> mean(v.c);
  for (int64_t c = 0; c < v.c; ++c) mean[c] = static_cast<T>(sum[c] / count);
  const T* m = mean.data();
  std::vector<double> sq = channel_sums<T>(v, x, [m](T e, int64_t c) { return (e - m[c]) * (e - m[c]); });
  T* out_mean = static_cast<T*>(ctx.out[1].raw_data());
  T* out_var = static_cast<T*>(ctx.out[2].raw_data());
  std::vector<T> scale(v.c), shift(v.c);
  for (int64_t c = 0; c < v.c; ++c) {
    double var = sq[c] / count, mu = sum[c] / count;
    double s = static_cast<double>(gamma[c]) / std::sqrt(var + eps);
    out_mean[c] = static_cast<T>(mu);
    out_var[c] = static_cast<T>(var);
    scale[c] = static_cast<T>(s);
    shift[c] = static_cast<T>(static_cast<double>(beta[c]) - mu * s);
  }
  if (xt.numel() == 0) return;
  apply_affine<T>(v, x, scale.data(), shift.data(), static_cast<T*>(ctx.out[0].raw_data()));
}

// ---- layer norm / RMS norm: one row at a time -----------------------------------------

template <typename T>
void layer_norm(OpContext& ctx) {
  const Tensor& xt = ctx.in[0];
  const int begin = normalize_axis(ctx.attrs.get_int("begin_axis"), xt.rank());
  int64_t d = 1;
  for (int i = begin; i < xt.rank(); ++i) d *= xt.dim(i);
  if (xt.numel() == 0) return;
  const int64_t rows = xt.numel() / d;
  const T eps = static_cast<T>(ctx.attrs.get_float("eps"));
  const T *x = in_ptr<T>(ctx, 0), *gamma = in_ptr<T>(ctx, 1), *beta = in_ptr<T>(ctx, 2);
  T* y = static_cast<T*>(ctx.out[0].raw_data());
  parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / d), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < d; ++i) s += xr[i];
      const T mean = s / static_cast<T>(d);
      T q = 0;
#pragma omp simd reduction(+ : q)
      for (int64_t i = 0; i < d; ++i) q += (xr[i] - mean) * (xr[i] - mean);
      const T rstd = T(1) / std::sqrt(q / static_cast<T>(d) + eps);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - mean) * rstd * gamma[i] + beta[i];
    }
  });
}

template <typename T>
void rms_norm(OpContext& ctx) {
  const Tensor& xt = ctx.in[0];
  const int64_t d = xt.dim(-1);
  if (xt.numel() == 0) return;
  const int64_t rows = xt.numel() / d;
  const T eps = static_cast<T>(ctx.attrs.get_float("eps"));
  const T *x = in_ptr<T>(ctx, 0), *gamma = in_ptr<T>(ctx, 1);
  T* y = static_cast<T*>(ctx.out[0].raw_data());
  parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / d), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      T q = 0;
#pragma omp simd reduction(+ : q)
      for (int64_t i = 0; i < d; ++i) q += xr[i] * xr[i];
      const T rr = T(1) / std::sqrt(q / static_cast<T>(d) + eps);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * rr * gamma[i];
    }
  });
}

KILN_NN_REG_FLOAT("batch_norm_inference", batch_norm_inference);
KILN_NN_REG_FLOAT("batch_norm_training", batch_norm_training);
KILN_NN_REG_FLOAT("layer_norm", layer_norm);
KILN_NN_REG_FLOAT("rms_norm", rms_norm);

}  // namespace
}  // namespace kiln::cpu
