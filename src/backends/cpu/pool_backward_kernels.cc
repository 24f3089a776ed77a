// CPU kernels of the pooling gradients: max_pool2d_backward, avg_pool2d_backward.
//
// Max pooling is kiln's own kernels (f32 and f64; f16/bf16 widen to f32): NHWC
// vectorised across channels, NCHW across output columns, each reading x and dy
// once and writing dx once. oneDNN's max-pooling backward needs the forward pass's
// workspace, i.e. a rerun of the forward in training mode, and was 3-6x slower on
// this project's AVX2 machine (NHWC [128, 28, 28, 32] 2x2/2: ~26 ms vs ~6.5 ms,
// NCHW: ~67 ms vs ~11 ms, one thread; PyTorch 1.13 ~7 ms / ~4 ms for its backward
// from saved indices). Average pooling f32 NHWC runs oneDNN's backward (no
// workspace, as fast as a hand loop); NCHW, f64 and the fallback when oneDNN has no
// primitive use kiln's loops.
//
// Ties in max pooling go to the first maximal cell of the window in row-major
// order (the running maximum is only replaced by a strictly greater value), as in
// TensorFlow and PyTorch; a window holding NaN routes to its first NaN.
#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "kiln/core/dispatch.h"
#include "kiln/core/kernel.h"
#include "kiln/core/parallel.h"
#include "loops.h"
#include "nn_kernel_util.h"
#include "pool_2x2.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using nn_geometry::pool2d_geometry;
using nn_geometry::Pool2dGeometry;

// Max pooling backward for NHWC, vectorised across channels. Tasks are (image,
// channel block) pairs, so overlapping windows never race. When the windows tile
// the input exactly (stride == window, every cell in one window) dx is written
// without zeroing it first; otherwise it is zeroed and accumulated.
// relu: dx is also zeroed where x <= 0 (the fused relu_grad), per task while its part
// of dx is still in cache.
template <typename T>
void max_pool_backward_nhwc(const Pool2dGeometry& g, const T* x, const T* dy, T* dx, bool relu) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;  // lane-width window index
  const auto& v = g.win;
  const int64_t C = g.c, HW = g.h * g.w, OHW = v.oh * v.ow;
  const bool overlap = v.sh < v.kh || v.sw < v.kw;
  const bool tiles = v.sh == v.kh && v.sw == v.kw && v.oh * v.sh - v.pt >= g.h && v.ow * v.sw - v.pl >= g.w;
  // Channel blocks: whole rows of C when there are enough images to go round.
  int64_t cb = std::min<int64_t>(C, 512);
  if (g.n < 4 * num_threads()) cb = std::min<int64_t>(C, 64);
  const int64_t nblk = (C + cb - 1) / cb;
  const int64_t work = std::max<int64_t>(HW * cb, 1);
  parallel_for(g.n * nblk, std::max<int64_t>(1, 65536 / work), [&](int64_t lo, int64_t hi) {
    std::vector<T> best(static_cast<size_t>(cb));
    std::vector<I> arg(static_cast<size_t>(cb));
    T* bp = best.data();
    I* ap = arg.data();
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t n = t / nblk, c0 = t % nblk * cb, len = std::min(cb, C - c0);
      const T* xn = x + n * HW * C + c0;
      T* dxn = dx + n * HW * C + c0;
      const T* dyn = dy + n * OHW * C + c0;
      if (!tiles)
        for (int64_t p = 0; p < HW; ++p) std::fill(dxn + p * C, dxn + p * C + len, T(0));
      for (int64_t oh = 0; oh < v.oh; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * v.sh - v.pt, 0);
        const int64_t h1 = std::min<int64_t>(oh * v.sh - v.pt + v.kh, g.h);
        for (int64_t ow = 0; ow < v.ow; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * v.sw - v.pl, 0);
          const int64_t w1 = std::min<int64_t>(ow * v.sw - v.pl + v.kw, g.w);
          const T* d = dyn + (oh * v.ow + ow) * C;
          {
            const T* xp = xn + (h0 * g.w + w0) * C;
#pragma omp simd
            for (int64_t c = 0; c < len; ++c) {
              bp[c] = xp[c];
              ap[c] = 0;
            }
          }
          I k = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w, ++k) {
              if (k == 0) continue;
              const T* xp = xn + (h * g.w + w) * C;
#pragma omp simd
              for (int64_t c = 0; c < len; ++c) {
                const T e = xp[c], b = bp[c];
                const bool take = e > b || (e != e && b == b);
                bp[c] = take ? e : b;
                ap[c] = take ? k : ap[c];
              }
            }
          k = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w, ++k) {
              T* o = dxn + (h * g.w + w) * C;
              if (overlap) {
#pragma omp simd
                for (int64_t c = 0; c < len; ++c) o[c] += ap[c] == k ? d[c] : T(0);
              } else {
#pragma omp simd
                for (int64_t c = 0; c < len; ++c) o[c] = ap[c] == k ? d[c] : T(0);
              }
            }
        }
      }
      if (relu)
        for (int64_t p = 0; p < HW; ++p) {
          const T* xp = xn + p * C;
          T* o = dxn + p * C;
#pragma omp simd
          for (int64_t c = 0; c < len; ++c) o[c] = xp[c] > T(0) ? o[c] : T(0);
        }
    }
  });
}

#if defined(__AVX2__)
// The common case of a CNN, 2x2 windows at stride 2 tiling an f32 NHWC input with
// channels in multiples of 8, as one streaming pass over output rows
// (max_pool_backward_2x2_row, pool_2x2.h).
// 3.7 -> 1.4 ms on the cnn's [128, 28, 28, 32] in its training step (docs/benchmarks.md).
// row_sums (attr bias_grad): per output row r = n * oh + row, the sum over its cells
// of what went to dx, C floats each (summed in order by the caller).
bool max_pool_backward_2x2_applies(const Pool2dGeometry& g) {
  return g.nhwc_2x2_stride_2() && g.h == 2 * g.win.oh && g.w == 2 * g.win.ow && g.c % 8 == 0;
}

template <typename T>
void max_pool_backward_2x2(const Pool2dGeometry& g, const T* x, const T* dy, T* dx, bool relu, float* row_sums) {
  const auto& v = g.win;
  const int64_t C = g.c, W = g.w, OW = v.ow;
  parallel_for(g.n * v.oh, std::max<int64_t>(1, 16384 / std::max<int64_t>(OW * C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {  // r = n * oh + output row
      const int64_t n = r / v.oh, oh = r % v.oh;
      const T* x0 = x + ((n * g.h + 2 * oh) * W) * C;
      const T* x1 = x0 + W * C;
      T* d0 = dx + ((n * g.h + 2 * oh) * W) * C;
      T* d1 = d0 + W * C;
      max_pool_backward_2x2_row(x0, x1, dy + r * OW * C, d0, d1, OW, C, relu, row_sums ? row_sums + r * C : nullptr);
    }
  });
}
#endif

// NCHW: one (n, c) plane per task (contiguous), dx zeroed then accumulated.
//
// Max: per output row, the windows fully inside the row (all but at most a few at
// the edges) run branch-free and vectorised across ow: a running maximum and the
// plane offset of its cell per window, then one scattered add per window. SW is the
// width stride when known at compile time (1 or 2: contiguous or shuffled loads
// instead of gathers), 0 otherwise. Edge windows use a scalar loop.
template <typename T, typename I, int SW>
void max_pool_backward_nchw(const Pool2dGeometry& g, const T* x, const T* dy, T* dx) {
  const auto& v = g.win;
  const int64_t W = g.w, HW = g.h * g.w, OHW = v.oh * v.ow;
  const int64_t sw = SW ? SW : v.sw;
  // Interior columns: ow * sw - pl >= 0 and ow * sw - pl + kw <= W.
  const int64_t owa = std::min<int64_t>((v.pl + sw - 1) / sw, v.ow);
  const int64_t owb =
      std::max<int64_t>(std::min<int64_t>(W + v.pl - v.kw < 0 ? 0 : (W + v.pl - v.kw) / sw + 1, v.ow), owa);
  parallel_for(g.n * g.c, std::max<int64_t>(1, 65536 / std::max<int64_t>(HW, 1)), [&](int64_t lo, int64_t hi) {
    std::vector<T> best(static_cast<size_t>(v.ow));
    std::vector<I> arg(static_cast<size_t>(v.ow));
    T* bp = best.data();
    I* ap = arg.data();
    for (int64_t p = lo; p < hi; ++p) {
      const T* xp = x + p * HW;
      const T* dp = dy + p * OHW;
      T* o = dx + p * HW;
      std::fill(o, o + HW, T(0));
      for (int64_t oh = 0; oh < v.oh; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * v.sh - v.pt, 0);
        const int64_t h1 = std::min<int64_t>(oh * v.sh - v.pt + v.kh, g.h);
        const T* d = dp + oh * v.ow;
        auto edge = [&](int64_t ow) {
          const int64_t w0 = std::max<int64_t>(ow * sw - v.pl, 0);
          const int64_t w1 = std::min<int64_t>(ow * sw - v.pl + v.kw, W);
          int64_t bi = h0 * W + w0;
          T m = xp[bi];
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              const T e = xp[h * W + w];
              if (e > m || (e != e && m == m)) {
                m = e;
                bi = h * W + w;
              }
            }
          o[bi] += d[ow];
        };
        for (int64_t ow = 0; ow < owa; ++ow) edge(ow);
        if (owb > owa) {
          {
            const T* r = xp + h0 * W - v.pl;
            const I base = static_cast<I>(h0 * W - v.pl);
#pragma omp simd
            for (int64_t ow = owa; ow < owb; ++ow) {
              bp[ow] = r[ow * sw];
              ap[ow] = base + static_cast<I>(ow * sw);
            }
          }
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t j = (h == h0 ? 1 : 0); j < v.kw; ++j) {
              const T* r = xp + h * W + j - v.pl;
              const I base = static_cast<I>(h * W + j - v.pl);
#pragma omp simd
              for (int64_t ow = owa; ow < owb; ++ow) {
                const T e = r[ow * sw], b = bp[ow];
                const bool take = e > b || (e != e && b == b);
                bp[ow] = take ? e : b;
                ap[ow] = take ? base + static_cast<I>(ow * sw) : ap[ow];
              }
            }
          for (int64_t ow = owa; ow < owb; ++ow) o[ap[ow]] += d[ow];
        }
        for (int64_t ow = owb; ow < v.ow; ++ow) edge(ow);
      }
    }
  });
}

template <typename T>
void max_pool_backward_nchw(const Pool2dGeometry& g, const T* x, const T* dy, T* dx) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;  // lane width of T
  if (sizeof(I) == 4 && g.h * g.w > INT32_MAX) return max_pool_backward_nchw<T, int64_t, 0>(g, x, dy, dx);
  if (g.win.sw == 1) return max_pool_backward_nchw<T, I, 1>(g, x, dy, dx);
  if (g.win.sw == 2) return max_pool_backward_nchw<T, I, 2>(g, x, dy, dx);
  max_pool_backward_nchw<T, I, 0>(g, x, dy, dx);
}

// Average: each window adds dy / (its real cell count) to its cells.
template <typename T>
void avg_pool_backward_nchw(const Pool2dGeometry& g, const T* dy, T* dx) {
  const auto& v = g.win;
  const int64_t HW = g.h * g.w, OHW = v.oh * v.ow;
  parallel_for(g.n * g.c, std::max<int64_t>(1, 65536 / std::max<int64_t>(HW, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const T* d = dy + p * OHW;
      T* o = dx + p * HW;
      std::fill(o, o + HW, T(0));
      for (int64_t oh = 0; oh < v.oh; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * v.sh - v.pt, 0);
        const int64_t h1 = std::min<int64_t>(oh * v.sh - v.pt + v.kh, g.h);
        for (int64_t ow = 0; ow < v.ow; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * v.sw - v.pl, 0);
          const int64_t w1 = std::min<int64_t>(ow * v.sw - v.pl + v.kw, g.w);
          const T share = d[oh * v.ow + ow] / static_cast<T>((h1 - h0) * (w1 - w0));
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) o[h * g.w + w] += share;
        }
      }
    }
  });
}

// Average pooling backward for NHWC, vectorised across channels; one image per
// task, dx zeroed then accumulated.
template <typename T>
void avg_pool_backward_nhwc(const Pool2dGeometry& g, const T* dy, T* dx) {
  const auto& v = g.win;
  const int64_t C = g.c, HW = g.h * g.w, OHW = v.oh * v.ow;
  parallel_for(g.n, std::max<int64_t>(1, 65536 / std::max<int64_t>(HW * C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      T* dxn = dx + n * HW * C;
      std::fill(dxn, dxn + HW * C, T(0));
      for (int64_t oh = 0; oh < v.oh; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * v.sh - v.pt, 0);
        const int64_t h1 = std::min<int64_t>(oh * v.sh - v.pt + v.kh, g.h);
        for (int64_t ow = 0; ow < v.ow; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * v.sw - v.pl, 0);
          const int64_t w1 = std::min<int64_t>(ow * v.sw - v.pl + v.kw, g.w);
          const T* d = dy + (n * OHW + oh * v.ow + ow) * C;
          const T inv = T(1) / static_cast<T>((h1 - h0) * (w1 - w0));
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              T* o = dxn + (h * g.w + w) * C;
#pragma omp simd
              for (int64_t c = 0; c < C; ++c) o[c] += d[c] * inv;
            }
        }
      }
    }
  });
}

Pool2dGeometry avg_backward_geometry(const OpContext& ctx) {
  return pool2d_geometry("avg_pool2d_backward", Shape(ctx.attrs.get_ints("input_shape")), ctx.attrs);
}

template <typename T>
void avg_pool_backward(const Pool2dGeometry& g, const T* dy, T* dx) {
  if (g.nchw)
    avg_pool_backward_nchw<T>(g, dy, dx);
  else
    avg_pool_backward_nhwc<T>(g, dy, dx);
}

// db = dx summed per channel (attr bias_grad) by the sum op's kernel: the paths that do
// not sum while they write dx.
void channel_sums(OpContext& ctx, const Pool2dGeometry& g) {
  run_kernel("sum", DeviceType::kCPU, ctx.out.first(1), ctx.out.subspan(1, 1),
             Attrs{{"axes", g.non_channel_axes()}, {"keepdims", false}});
}

#if defined(__AVX2__)
// max_pool2d_backward's 2x2 path (max_pool_backward_2x2_applies) for f32 or bf16 tensors;
// the bias gradient (attr bias_grad) is summed in f32, rows in order (the same sums for
// any number of threads), and rounded once.
template <typename T>
void max_pool2d_backward_2x2(OpContext& ctx, const Pool2dGeometry& g, const T* x, const T* dy, T* dx, bool relu) {
  const bool bias_grad = ctx.out.size() > 1;
  const int64_t rows = g.n * g.win.oh, C = g.c;
  thread_local std::vector<float> row_sums;  // (no allocation per call once grown)
  if (bias_grad && row_sums.size() < static_cast<size_t>(rows * C)) row_sums.resize(static_cast<size_t>(rows * C));
  max_pool_backward_2x2(g, x, dy, dx, relu, bias_grad ? row_sums.data() : nullptr);
  if (!bias_grad) return;
  std::vector<float> db(static_cast<size_t>(C), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) db[static_cast<size_t>(c)] += row_sums[static_cast<size_t>(r * C + c)];
  T* out = static_cast<T*>(ctx.out[1].raw_data());
  for (int64_t c = 0; c < C; ++c) out[c] = T(db[static_cast<size_t>(c)]);
}
#endif

template <typename T>
void max_pool2d_backward(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry("max_pool2d_backward", ctx.in[0].shape(), ctx.attrs);
  const bool bias_grad = ctx.out.size() > 1;
  if (ctx.out[0].numel() == 0) {
    if (bias_grad) std::fill_n(static_cast<T*>(ctx.out[1].raw_data()), ctx.out[1].numel(), T(0));
    return;
  }
  const T* x = static_cast<const T*>(ctx.in[0].raw_data());
  const T* dy = static_cast<const T*>(ctx.in[1].raw_data());
  T* dx = static_cast<T*>(ctx.out[0].raw_data());
  const bool relu = ctx.attrs.get_bool("relu", false);
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    if (max_pool_backward_2x2_applies(g)) return max_pool2d_backward_2x2(ctx, g, x, dy, dx, relu);
  }
#endif
  if (g.nchw)
    max_pool_backward_nchw<T>(g, x, dy, dx);
  else
    max_pool_backward_nhwc<T>(g, x, dy, dx, relu);
  if (g.nchw && relu) {  // NHWC masks inside its tasks
    parallel_for(ctx.out[0].numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) dx[i] = x[i] > T(0) ? dx[i] : T(0);
    });
  }
  if (bias_grad) channel_sums(ctx, g);
}

// bf16: the 2x2 path reads and writes bf16 (no widening copies); other windows widen.
void max_pool2d_backward_bf16(OpContext& ctx) {
#if defined(__AVX2__)
  const Pool2dGeometry g = pool2d_geometry("max_pool2d_backward", ctx.in[0].shape(), ctx.attrs);
  if (ctx.out[0].numel() > 0 && max_pool_backward_2x2_applies(g))
    return max_pool2d_backward_2x2(ctx, g, ctx.in[0].data<bfloat16>(), ctx.in[1].data<bfloat16>(),
                                   ctx.out[0].data<bfloat16>(), ctx.attrs.get_bool("relu", false));
#endif
  via_f32<max_pool2d_backward<float>>(ctx);
}

void avg_pool2d_backward_f32(OpContext& ctx) {
  const Pool2dGeometry g = avg_backward_geometry(ctx);
  Tensor& dx = ctx.out[0];
  if (dx.numel() == 0) return;
  const float* dy = static_cast<const float*>(ctx.in[0].raw_data());
  if (!g.nchw) {
    const auto& v = g.win;
    memory::desc src = nn::act_md(false, g.n, g.c, g.h, g.w), dst = nn::act_md(false, g.n, g.c, v.oh, v.ow);
    const std::string key = "avgpool_bwd|" + std::to_string(g.n) + "," + std::to_string(g.c) + "," +
                            std::to_string(g.h) + "," + std::to_string(g.w) + "|" + nn::window_key(v);
    try {
      dnnl::primitive bwd = onednn::cached(key, [&]() -> dnnl::primitive {
        auto algo = dnnl::algorithm::pooling_avg_exclude_padding;
        dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, algo, src, dst, {v.sh, v.sw}, {v.kh, v.kw},
                                       {v.pt, v.pl}, {v.pb, v.pr});
        dnnl::pooling_forward::primitive_desc hint(fd, onednn::engine());
        dnnl::pooling_backward::desc bd(algo, src, dst, {v.sh, v.sw}, {v.kh, v.kw}, {v.pt, v.pl}, {v.pb, v.pr});
        return dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(bd, onednn::engine(), hint));
      });
      auto& eng = onednn::engine();
      bwd.execute(onednn::stream(), {{DNNL_ARG_DIFF_DST, memory(dst, eng, const_cast<float*>(dy))},
                                     {DNNL_ARG_DIFF_SRC, memory(src, eng, dx.raw_data())}});
      onednn::stream().wait();
      return;
    } catch (const dnnl::error&) {
      note_kernel_fallback("avg_pool2d_backward", "oneDNN failed: reference loop");  // the loop below
    }
  }
  avg_pool_backward<float>(g, dy, static_cast<float*>(dx.raw_data()));
}

void avg_pool2d_backward_f64(OpContext& ctx) {
  const Pool2dGeometry g = avg_backward_geometry(ctx);
  if (ctx.out[0].numel() == 0) return;
  avg_pool_backward<double>(g, ctx.in[0].data<double>(), ctx.out[0].data<double>());
}

const std::initializer_list<DType> k16 = {DType::kF16, DType::kBF16};
// max_pool2d_backward_mask: pooled rows split over the pool; db (attr bias_grad) from
// per-row sums added in row order (the same sums for any number of threads).
void max_pool2d_backward_mask_f32(OpContext& ctx) {
  const Shape& m = ctx.in[0].shape();
  const int64_t rows = m[0] * m[1], PW = m[2], C = m[3];
  const bool bias_grad = ctx.out.size() > 1;
  float* db = bias_grad ? static_cast<float*>(ctx.out[1].raw_data()) : nullptr;
  if (bias_grad) std::fill_n(db, C, 0.0f);
  if (ctx.out[0].numel() == 0) return;
  const uint8_t* mask = static_cast<const uint8_t*>(ctx.in[0].raw_data());
  const float* dy = static_cast<const float*>(ctx.in[1].raw_data());
  float* dx = static_cast<float*>(ctx.out[0].raw_data());
  thread_local std::vector<float> row_sums;
  if (bias_grad && row_sums.size() < static_cast<size_t>(rows * C)) row_sums.resize(static_cast<size_t>(rows * C));
  float* sums = row_sums.data();  // (a pointer: pool threads see their own thread_local)
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(PW * C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* d0 = dx + 2 * r * 2 * PW * C;
      mask_pool_backward_2x2_row(mask + r * PW * C, dy + r * PW * C, d0, d0 + 2 * PW * C, PW, C,
                                 bias_grad ? sums + r * C : nullptr);
    }
  });
  if (bias_grad)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) db[c] += sums[r * C + c];
}

KILN_REGISTER_KERNEL("max_pool2d_backward_mask", kCPU, DType::kF32, max_pool2d_backward_mask_f32);
KILN_REGISTER_KERNEL("max_pool2d_backward", kCPU, DType::kF32, max_pool2d_backward<float>);
KILN_REGISTER_KERNEL("max_pool2d_backward", kCPU, DType::kF64, max_pool2d_backward<double>);
KILN_REGISTER_KERNEL("max_pool2d_backward", kCPU, DType::kF16, via_f32<max_pool2d_backward<float>>);
KILN_REGISTER_KERNEL("max_pool2d_backward", kCPU, DType::kBF16, max_pool2d_backward_bf16);
KILN_REGISTER_KERNEL("avg_pool2d_backward", kCPU, DType::kF32, avg_pool2d_backward_f32);
KILN_REGISTER_KERNEL("avg_pool2d_backward", kCPU, DType::kF64, avg_pool2d_backward_f64);
KILN_REGISTER_KERNEL("avg_pool2d_backward", kCPU, k16, via_f32<avg_pool2d_backward_f32>);

}  // namespace
}  // namespace kiln::cpu
