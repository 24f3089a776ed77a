// CPU pooling kernels: max/avg 2-d pooling (NHWC f32 max: kiln's own channel-vectorised loop;
// other f32 cases: oneDNN; f64: a direct loop) and global average/max pooling (kiln's own
// vectorised loops).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kiln/core/kernel.h"
#include "kiln/core/parallel.h"
#include "loops.h"
#include "nn_kernel_util.h"
#include "pool_2x2.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using nn_geometry::Pool2dGeometry;
using nn_geometry::pool2d_geometry;

// Max / exclude-padding average over each window; layout-generic reference loop.
template <typename T, bool kMax>
void pool_loop(const Pool2dGeometry& g, const T* x, T* y) {
  const auto& v = g.win;
  auto xi = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return g.nchw ? ((n * g.c + c) * g.h + h) * g.w + w : ((n * g.h + h) * g.w + w) * g.c + c;
  };
  auto yi = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return g.nchw ? ((n * g.c + c) * v.oh + h) * v.ow + w : ((n * v.oh + h) * v.ow + w) * g.c + c;
  };
  parallel_for(g.n * v.oh * v.ow, std::max<int64_t>(1, 4096 / std::max<int64_t>(g.c * v.kh * v.kw, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t p = lo; p < hi; ++p) {
                   const int64_t n = p / (v.oh * v.ow), oh = p / v.ow % v.oh, ow = p % v.ow;
                   const int64_t h0 = std::max<int64_t>(oh * v.sh - v.pt, 0);
                   const int64_t h1 = std::min<int64_t>(oh * v.sh - v.pt + v.kh, g.h);
                   const int64_t w0 = std::max<int64_t>(ow * v.sw - v.pl, 0);
                   const int64_t w1 = std::min<int64_t>(ow * v.sw - v.pl + v.kw, g.w);
                   for (int64_t c = 0; c < g.c; ++c) {
                     T acc = kMax ? -std::numeric_limits<T>::infinity() : T(0);
                     for (int64_t h = h0; h < h1; ++h)
                       for (int64_t w = w0; w < w1; ++w) {
                         T e = x[xi(n, c, h, w)];
                         if constexpr (kMax)
                           acc = (e > acc || e != e) ? e : acc;
                         else
                           acc += e;
                       }
                     if constexpr (!kMax) acc /= static_cast<T>((h1 - h0) * (w1 - w0));
                     y[yi(n, c, oh, ow)] = acc;
                   }
                 }
               });
}

// NHWC max pooling, vectorised over the contiguous channels: one pass over the input.
// oneDNN 2.6 runs plain-NHWC pooling through a slow path (1.05 ms for 64x28x28x32 ->
// 14x14 with a 2x2 window, against ~0.1 ms here). NaN propagates, as in pool_loop.
// T: float, or uint8_t (quantised activations of int8 graphs).
template <typename T>
void max_pool_nhwc(const Pool2dGeometry& g, const T* x, T* y) {
  constexpr T kLowest = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                             : std::numeric_limits<T>::lowest();
  const auto& v = g.win;
  const int64_t C = g.c;
  parallel_for(g.n * v.oh, std::max<int64_t>(1, 16384 / std::max<int64_t>(v.ow * C * v.kh * v.kw, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t r = lo; r < hi; ++r) {
                   const int64_t n = r / v.oh, oh = r % v.oh;
                   const int64_t h0 = std::max<int64_t>(oh * v.sh - v.pt, 0);
                   const int64_t h1 = std::min<int64_t>(oh * v.sh - v.pt + v.kh, g.h);
                   for (int64_t ow = 0; ow < v.ow; ++ow) {
                     const int64_t w0 = std::max<int64_t>(ow * v.sw - v.pl, 0);
                     const int64_t w1 = std::min<int64_t>(ow * v.sw - v.pl + v.kw, g.w);
                     T* out = y + ((n * v.oh + oh) * v.ow + ow) * C;
                     for (int64_t c = 0; c < C; ++c) out[c] = kLowest;
                     for (int64_t h = h0; h < h1; ++h)
                       for (int64_t w = w0; w < w1; ++w) {
                         const T* in = x + ((n * g.h + h) * g.w + w) * C;
                         if constexpr (std::is_integral_v<T>) {
#pragma omp simd
                           for (int64_t c = 0; c < C; ++c) out[c] = std::max(out[c], in[c]);
                         } else {
                           for (int64_t c = 0; c < C; ++c) {
                             const T e = in[c], a = out[c];
                             out[c] = (e > a || e != e) ? e : a;
                           }
                         }
                       }
                   }
                 }
               });
}

// NHWC 2x2 windows with stride 2 and no padding (the usual downsampling): each output
// pixel is the elementwise max of four contiguous channel runs, one streaming pass with
// no per-window bookkeeping (the generic loop is bound by it: 2x slower for u8; f32
// [64,28,28,32] 387 -> 183 us). f32 keeps the loop's rule: a NaN in a window wins.
template <typename T>
bool max_pool_nhwc_2x2(const Pool2dGeometry& g, const T* x, T* y) {
  const auto& v = g.win;
  if (g.nchw || v.kh != 2 || v.kw != 2 || v.sh != 2 || v.sw != 2 || v.pt != 0 || v.pl != 0 || v.dh != 1 ||
      v.dw != 1 || v.oh * 2 > g.h || v.ow * 2 > g.w)
    return false;
  const int64_t C = g.c, row = g.w * C;
  const int64_t grain = std::max<int64_t>(1, 65536 / static_cast<int64_t>(sizeof(T)) / std::max<int64_t>(v.ow * C * 4, 1));
  parallel_for(g.n * v.oh, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t n = r / v.oh, oh = r % v.oh;
      const T* r0 = x + (n * g.h + 2 * oh) * row;
      max_pool_2x2_row(r0, r0 + row, v.ow, C, y + r * v.ow * C);
    }
  });
  return true;
}

template <bool kMax>
void pool_f32(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry(kMax ? "max_pool2d" : "avg_pool2d", ctx.in[0].shape(), ctx.attrs);
  if (ctx.out[0].numel() == 0) return;
  if (kMax && !g.nchw) {
    const float* x = static_cast<const float*>(ctx.in[0].raw_data());
    float* y = static_cast<float*>(ctx.out[0].raw_data());
    if (!max_pool_nhwc_2x2(g, x, y)) max_pool_nhwc<float>(g, x, y);
    return;
  }
  const auto& v = g.win;
  memory::desc src = nn::act_md(g.nchw, g.n, g.c, g.h, g.w), dst = nn::act_md(g.nchw, g.n, g.c, v.oh, v.ow);
  std::string key = std::string(kMax ? "maxpool|" : "avgpool|") + std::to_string(g.nchw) + "|" +
                    std::to_string(g.n) + "," + std::to_string(g.c) + "," + std::to_string(g.h) + "," +
                    std::to_string(g.w) + "|" + nn::window_key(v);
  try {
    dnnl::primitive p = onednn::cached(key, [&]() -> dnnl::primitive {
      auto algo = kMax ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
      dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_inference, algo, src, dst, {v.sh, v.sw}, {v.kh, v.kw},
                                    {v.pt, v.pl}, {v.pb, v.pr});
      return dnnl::pooling_forward(dnnl::pooling_forward::primitive_desc(d, onednn::engine()));
    });
    auto& eng = onednn::engine();
    p.execute(onednn::stream(), {{DNNL_ARG_SRC, memory(src, eng, ctx.in[0].raw_data())},
                                 {DNNL_ARG_DST, memory(dst, eng, ctx.out[0].raw_data())}});
    onednn::stream().wait();
  } catch (const dnnl::error&) {
    note_kernel_fallback(kMax ? "max_pool2d" : "avg_pool2d", "oneDNN failed: reference loop");
    pool_loop<float, kMax>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                           static_cast<float*>(ctx.out[0].raw_data()));
  }
}

// bf16: NHWC 2x2 windows read and write bf16 (no widening copies); others widen.
void max_pool_bf16(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry("max_pool2d", ctx.in[0].shape(), ctx.attrs);
  if (ctx.out[0].numel() == 0) return;
  if (max_pool_nhwc_2x2(g, ctx.in[0].data<bfloat16>(), ctx.out[0].data<bfloat16>())) return;
  via_f32<pool_f32<true>>(ctx);
}

void max_pool_u8(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry("max_pool2d", ctx.in[0].shape(), ctx.attrs);
  if (ctx.out[0].numel() == 0) return;
  const uint8_t* x = ctx.in[0].data<uint8_t>();
  uint8_t* y = ctx.out[0].data<uint8_t>();
  if (max_pool_nhwc_2x2(g, x, y)) return;
  if (g.nchw) pool_loop<uint8_t, true>(g, x, y);
  else max_pool_nhwc<uint8_t>(g, x, y);
}

template <bool kMax>
void pool_f64(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry(kMax ? "max_pool2d" : "avg_pool2d", ctx.in[0].shape(), ctx.attrs);
  pool_loop<double, kMax>(g, ctx.in[0].data<double>(), ctx.out[0].data<double>());
}

// ---- global pooling ------------------------------------------------------------------

// Reduces over H*W per (n, c). Averages accumulate in double; max propagates NaN.
template <typename T, bool kMax>
void global_pool(OpContext& ctx) {
  const Tensor& xt = ctx.in[0];
  const bool nchw = ctx.attrs.get_string("data_format", "NHWC") == "NCHW" ||
                    ctx.attrs.get_string("data_format", "NHWC") == "nchw";
  const int64_t N = xt.dim(0), C = nchw ? xt.dim(1) : xt.dim(3), HW = nchw ? xt.dim(2) * xt.dim(3)
                                                                           : xt.dim(1) * xt.dim(2);
  const T* x = static_cast<const T*>(xt.raw_data());
  T* y = static_cast<T*>(ctx.out[0].raw_data());
  using Acc = std::conditional_t<kMax, T, double>;
  const Acc init = kMax ? -std::numeric_limits<Acc>::infinity() : Acc(0);
  auto finish = [HW](Acc a) -> T { return kMax ? static_cast<T>(a) : static_cast<T>(a / static_cast<double>(HW)); };
  if (nchw) {
    // Each (n, c) reduces a contiguous run of HW values.
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(HW, 1));
    parallel_for(N * C, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* p = x + r * HW;
        Acc a = init;
        if constexpr (kMax) {
          for (int64_t i = 0; i < HW; ++i) a = (p[i] > a || p[i] != p[i]) ? p[i] : a;
        } else {
#pragma omp simd reduction(+ : a)
          for (int64_t i = 0; i < HW; ++i) a += p[i];
        }
        y[r] = finish(a);
      }
    });
    return;
  }
  // NHWC: accumulate rows of C channels, vectorised across channels, in blocks of channels.
  const int64_t cb = std::min<int64_t>(C, 512), nblk = (C + cb - 1) / cb;
  parallel_for(N * nblk, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(HW * cb, 1)),
               [&](int64_t lo, int64_t hi) {
                 std::vector<Acc> acc(static_cast<size_t>(cb));
                 for (int64_t t = lo; t < hi; ++t) {
                   const int64_t n = t / nblk, c0 = t % nblk * cb, len = std::min(cb, C - c0);
                   std::fill(acc.begin(), acc.end(), init);
                   Acc* a = acc.data();
                   for (int64_t i = 0; i < HW; ++i) {
                     const T* p = x + (n * HW + i) * C + c0;
                     if constexpr (kMax) {
#pragma omp simd
                       for (int64_t c = 0; c < len; ++c) a[c] = (p[c] > a[c] || p[c] != p[c]) ? p[c] : a[c];
                     } else {
#pragma omp simd
                       for (int64_t c = 0; c < len; ++c) a[c] += p[c];
                     }
                   }
                   for (int64_t c = 0; c < len; ++c) y[n * C + c0 + c] = finish(a[c]);
                 }
               });
}

template <typename T>
void global_avg(OpContext& ctx) {
  global_pool<T, false>(ctx);
}
template <typename T>
void global_max(OpContext& ctx) {
  global_pool<T, true>(ctx);
}

const std::initializer_list<DType> k16 = {DType::kF16, DType::kBF16};
KILN_REGISTER_KERNEL("max_pool2d", kCPU, DType::kF32, pool_f32<true>);
KILN_REGISTER_KERNEL("max_pool2d", kCPU, DType::kF64, pool_f64<true>);
KILN_REGISTER_KERNEL("max_pool2d", kCPU, DType::kF16, via_f32<pool_f32<true>>);
KILN_REGISTER_KERNEL("max_pool2d", kCPU, DType::kBF16, max_pool_bf16);
KILN_REGISTER_KERNEL("max_pool2d", kCPU, DType::kU8, max_pool_u8);
KILN_REGISTER_KERNEL("avg_pool2d", kCPU, DType::kF32, pool_f32<false>);
KILN_REGISTER_KERNEL("avg_pool2d", kCPU, DType::kF64, pool_f64<false>);
KILN_REGISTER_KERNEL("avg_pool2d", kCPU, k16, via_f32<pool_f32<false>>);
KILN_NN_REG_FLOAT("global_avg_pool2d", global_avg);
KILN_NN_REG_FLOAT("global_max_pool2d", global_max);

}  // namespace
}  // namespace kiln::cpu
