// CPU kernels of the pooling gradients: max_pool2d_backward, avg_pool2d_backward.
//
// Max pooling, NHWC (the training hot path, f32 and f64): kiln's own kernel. Each
// window finds the winning cell per channel (vectorised across channels) and routes
// dy to it, reading x and dy once and writing dx once: about half the memory traffic
// of oneDNN's pooling backward, which needs its forward pass rerun in training mode
// for the workspace (measured 3-4x slower end to end on [128, 28, 28, 32] 2x2/2).
// Max pooling, NCHW f32: oneDNN (forward in training mode into scratch buffers,
// then backward with the workspace). Average pooling f32: oneDNN's backward (no
// workspace). f64 NCHW and the fallback when oneDNN has no primitive: a direct
// loop. f16/bf16 widen to f32.
//
// Ties in max pooling go to the first maximal cell of the window in row-major
// order: the running maximum is only replaced by a strictly greater value (what
// oneDNN's kernels do too); a window holding NaN routes to its first NaN.
#include <algorithm>
#include <cstring>
#include <climits>
#include <limits>
#include <type_traits>
#include <vector>

#include "kiln/core/parallel.h"
#include "nn_kernel_util.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using ops::nn_detail::Pool2dGeometry;
using ops::nn_detail::pool2d_geometry;

// dx = the adjoint of max / exclude-padding average pooling; layout-generic. Each
// task owns whole (n, c) planes of dx, so overlapping windows never race.
template <typename T, bool kMax>
void pool_backward_loop(const Pool2dGeometry& g, const T* x, const T* dy, T* dx) {
  const auto& v = g.win;
  auto xi = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return g.nchw ? ((n * g.c + c) * g.h + h) * g.w + w : ((n * g.h + h) * g.w + w) * g.c + c;
  };
  auto yi = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return g.nchw ? ((n * g.c + c) * v.oh + h) * v.ow + w : ((n * v.oh + h) * v.ow + w) * g.c + c;
  };
  const int64_t plane_work = std::max<int64_t>(v.oh * v.ow * v.kh * v.kw, 1);
  parallel_for(g.n * g.c, std::max<int64_t>(1, 16384 / plane_work), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t n = p / g.c, c = p % g.c;
      for (int64_t h = 0; h < g.h; ++h)
        for (int64_t w = 0; w < g.w; ++w) dx[xi(n, c, h, w)] = T(0);
      for (int64_t oh = 0; oh < v.oh; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * v.sh - v.pt, 0);
        const int64_t h1 = std::min<int64_t>(oh * v.sh - v.pt + v.kh, g.h);
        for (int64_t ow = 0; ow < v.ow; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * v.sw - v.pl, 0);
          const int64_t w1 = std::min<int64_t>(ow * v.sw - v.pl + v.kw, g.w);
          const T d = dy[yi(n, c, oh, ow)];
          if (h0 >= h1 || w0 >= w1) continue;
          if constexpr (kMax) {
            // First strictly-greater wins; a NaN, once seen, is kept (the first NaN).
            int64_t best = xi(n, c, h0, w0);
            T m = x[best];
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) {
                const int64_t i = xi(n, c, h, w);
                if (m != m) break;
                if (x[i] > m || x[i] != x[i]) {
                  m = x[i];
                  best = i;
                }
              }
            dx[best] += d;
          } else {
            const T share = d / static_cast<T>((h1 - h0) * (w1 - w0));
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) dx[xi(n, c, h, w)] += share;
          }
        }
      }
    }
  });
}

// Max pooling backward for NHWC, vectorised across channels. Tasks are (image,
// channel block) pairs, so overlapping windows never race. When the windows tile
// the input exactly (stride == window, every cell in one window) dx is written
// without zeroing it first; otherwise it is zeroed and accumulated.
template <typename T>
void max_pool_backward_nhwc(const Pool2dGeometry& g, const T* x, const T* dy, T* dx) {
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
    }
  });
}

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
  const int64_t owb = std::max<int64_t>(std::min<int64_t>(W + v.pl - v.kw < 0 ? 0 : (W + v.pl - v.kw) / sw + 1, v.ow), owa);
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

std::string pool_key(const char* kind, const Pool2dGeometry& g) {
  return std::string(kind) + "|" + std::to_string(g.nchw) + "|" + std::to_string(g.n) + "," + std::to_string(g.c) +
         "," + std::to_string(g.h) + "," + std::to_string(g.w) + "|" + nn::window_key(g.win);
}

dnnl::pooling_forward::primitive_desc training_forward_pd(bool max, const Pool2dGeometry& g, const memory::desc& src,
                                                          const memory::desc& dst) {
  const auto& v = g.win;
  auto algo = max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
  dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, algo, src, dst, {v.sh, v.sw}, {v.kh, v.kw},
                                {v.pt, v.pl}, {v.pb, v.pr});
  return dnnl::pooling_forward::primitive_desc(d, onednn::engine());
}

dnnl::primitive backward_primitive(bool max, const Pool2dGeometry& g, const memory::desc& src,
                                   const memory::desc& dst) {
  const auto& v = g.win;
  auto algo = max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
  dnnl::pooling_backward::desc d(algo, src, dst, {v.sh, v.sw}, {v.kh, v.kw}, {v.pt, v.pl}, {v.pb, v.pr});
  return dnnl::pooling_backward(
      dnnl::pooling_backward::primitive_desc(d, onednn::engine(), training_forward_pd(max, g, src, dst)));
}

// Scratch bytes from kiln's allocator (so repeated steps reuse BFC chunks).
Tensor scratch(const memory::desc& md) { return Tensor::empty(Shape{static_cast<int64_t>(md.get_size())}, DType::kU8); }

void max_pool2d_backward_f32(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry("max_pool2d_backward", ctx.in[0].shape(), ctx.attrs);
  Tensor& dx = ctx.out[0];
  if (dx.numel() == 0) return;
  if (!g.nchw) {
    max_pool_backward_nhwc<float>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                                  static_cast<const float*>(ctx.in[1].raw_data()), static_cast<float*>(dx.raw_data()));
    return;
  }
  if (getenv("TMPLOOP")) { max_pool_backward_nchw<float>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                                    static_cast<const float*>(ctx.in[1].raw_data()), static_cast<float*>(dx.raw_data())); return; }
  const auto& v = g.win;
  memory::desc src = nn::act_md(g.nchw, g.n, g.c, g.h, g.w), dst = nn::act_md(g.nchw, g.n, g.c, v.oh, v.ow);
  const std::string key = pool_key("maxpool", g);
  try {
    dnnl::primitive fwd = onednn::cached("train_fwd|" + key, [&]() -> dnnl::primitive {
      return dnnl::pooling_forward(training_forward_pd(true, g, src, dst));
    });
    dnnl::primitive bwd = onednn::cached("bwd|" + key, [&] { return backward_primitive(true, g, src, dst); });
    memory::desc ws_md = nn::queried_md(fwd, dnnl_query_workspace_md);
    Tensor y = scratch(dst), ws = scratch(ws_md);
    auto& eng = onednn::engine();
    memory wsm(ws_md, eng, ws.raw_data());
    fwd.execute(onednn::stream(), {{DNNL_ARG_SRC, memory(src, eng, ctx.in[0].raw_data())},
                                   {DNNL_ARG_DST, memory(dst, eng, y.raw_data())},
                                   {DNNL_ARG_WORKSPACE, wsm}});
    bwd.execute(onednn::stream(), {{DNNL_ARG_DIFF_DST, memory(dst, eng, ctx.in[1].raw_data())},
                                   {DNNL_ARG_DIFF_SRC, memory(src, eng, dx.raw_data())},
                                   {DNNL_ARG_WORKSPACE, wsm}});
    onednn::stream().wait();
  } catch (const dnnl::error&) {
    pool_backward_loop<float, true>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                                    static_cast<const float*>(ctx.in[1].raw_data()), static_cast<float*>(dx.raw_data()));
  }
}

Pool2dGeometry avg_backward_geometry(const OpContext& ctx) {
  return pool2d_geometry("avg_pool2d_backward", Shape(ctx.attrs.get_ints("input_shape")), ctx.attrs);
}

void avg_pool2d_backward_f32(OpContext& ctx) {
  const Pool2dGeometry g = avg_backward_geometry(ctx);
  Tensor& dx = ctx.out[0];
  if (dx.numel() == 0) return;
  if (getenv("TMPLOOP") && g.nchw) { avg_pool_backward_nchw<float>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                                     static_cast<float*>(dx.raw_data())); return; }
  if (getenv("TMPLOOP2")) { pool_backward_loop<float, false>(g, nullptr, static_cast<const float*>(ctx.in[0].raw_data()),
                                     static_cast<float*>(dx.raw_data())); return; }
  const auto& v = g.win;
  memory::desc src = nn::act_md(g.nchw, g.n, g.c, g.h, g.w), dst = nn::act_md(g.nchw, g.n, g.c, v.oh, v.ow);
  try {
    dnnl::primitive bwd =
        onednn::cached("bwd|" + pool_key("avgpool", g), [&] { return backward_primitive(false, g, src, dst); });
    auto& eng = onednn::engine();
    bwd.execute(onednn::stream(), {{DNNL_ARG_DIFF_DST, memory(dst, eng, ctx.in[0].raw_data())},
                                   {DNNL_ARG_DIFF_SRC, memory(src, eng, dx.raw_data())}});
    onednn::stream().wait();
  } catch (const dnnl::error&) {
    pool_backward_loop<float, false>(g, nullptr, static_cast<const float*>(ctx.in[0].raw_data()),
                                     static_cast<float*>(dx.raw_data()));
  }
}

void max_pool2d_backward_f64(OpContext& ctx) {
  const Pool2dGeometry g = pool2d_geometry("max_pool2d_backward", ctx.in[0].shape(), ctx.attrs);
  if (ctx.out[0].numel() == 0) return;
  if (!g.nchw) {
    max_pool_backward_nhwc<double>(g, ctx.in[0].data<double>(), ctx.in[1].data<double>(), ctx.out[0].data<double>());
    return;
  }
  max_pool_backward_nchw<double>(g, ctx.in[0].data<double>(), ctx.in[1].data<double>(), ctx.out[0].data<double>());
}

void avg_pool2d_backward_f64(OpContext& ctx) {
  pool_backward_loop<double, false>(avg_backward_geometry(ctx), nullptr, ctx.in[0].data<double>(),
                                    ctx.out[0].data<double>());
}

const std::initializer_list<DType> k16 = {DType::kF16, DType::kBF16};
KILN_REGISTER_KERNEL("max_pool2d_backward", kCPU, DType::kF32, max_pool2d_backward_f32);
KILN_REGISTER_KERNEL("max_pool2d_backward", kCPU, DType::kF64, max_pool2d_backward_f64);
KILN_REGISTER_KERNEL("max_pool2d_backward", kCPU, k16, via_f32<max_pool2d_backward_f32>);
KILN_REGISTER_KERNEL("avg_pool2d_backward", kCPU, DType::kF32, avg_pool2d_backward_f32);
KILN_REGISTER_KERNEL("avg_pool2d_backward", kCPU, DType::kF64, avg_pool2d_backward_f64);
KILN_REGISTER_KERNEL("avg_pool2d_backward", kCPU, k16, via_f32<avg_pool2d_backward_f32>);

}  // namespace
}  // namespace kiln::cpu
