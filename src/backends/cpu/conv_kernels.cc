// CPU conv2d kernels: forward, backward data, backward filter.
//
// f32 runs on oneDNN. Activations stay in the user's plain layout (NHWC or NCHW);
// filters are given to oneDNN as `any` so that it can pick its blocked AVX2
// kernels (the plain-layout alternative is its im2col+GEMM path, up to 30x slower
// for depthwise filters), and the filter is reordered to/from the user's HWIO/OIHW
// layout by a cached reorder primitive (cheap: filters are small next to the
// activations). f64 uses direct loops (reference grade); bf16 runs on oneDNN's native
// bf16 kernels where it has them (below), f16 and the rest widen to f32.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>

#include "direct_conv.h"
#include "kiln/core/kernel.h"
#include "kernel_selection.h"
#include "kiln/core/parallel.h"
#include "nn_kernel_util.h"
#include "pool_2x2.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using nn_geometry::Conv2dGeometry;
using nn_geometry::conv2d_geometry;

// ---- layout indexing -------------------------------------------------------------------

struct ConvIndex {
  const Conv2dGeometry& g;
  int64_t x(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return g.nchw ? ((n * g.c + c) * g.h + h) * g.w + w : ((n * g.h + h) * g.w + w) * g.c + c;
  }
  int64_t y(int64_t n, int64_t o, int64_t h, int64_t w) const {
    return g.nchw ? ((n * g.o + o) * g.win.oh + h) * g.win.ow + w : ((n * g.win.oh + h) * g.win.ow + w) * g.o + o;
  }
  // Filter element (output channel o, in-group input channel i, kh, kw).
  int64_t f(int64_t o, int64_t i, int64_t kh, int64_t kw) const {
    const int64_t I = g.cin_per_group();
    return g.nchw ? ((o * I + i) * g.win.kh + kh) * g.win.kw + kw : ((kh * g.win.kw + kw) * I + i) * g.o + o;
  }
};

// ---- f64 (and fallback) direct loops -----------------------------------------------------

template <typename T>
void conv_forward_loop(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y) {
  const ConvIndex ix{g};
  const auto& v = g.win;
  const int64_t I = g.cin_per_group(), OG = g.cout_per_group();
  parallel_for(g.n * v.oh * v.ow, std::max<int64_t>(1, 4096 / std::max<int64_t>(g.o * I * v.kh * v.kw, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t p = lo; p < hi; ++p) {
                   const int64_t n = p / (v.oh * v.ow), oh = p / v.ow % v.oh, ow = p % v.ow;
                   for (int64_t o = 0; o < g.o; ++o) {
                     const int64_t c0 = o / OG * I;
                     T acc = bias ? bias[o] : T(0);
                     for (int64_t kh = 0; kh < v.kh; ++kh) {
                       const int64_t ih = oh * v.sh - v.pt + kh * v.dh;
                       if (ih < 0 || ih >= g.h) continue;
                       for (int64_t kw = 0; kw < v.kw; ++kw) {
                         const int64_t iw = ow * v.sw - v.pl + kw * v.dw;
                         if (iw < 0 || iw >= g.w) continue;
                         for (int64_t i = 0; i < I; ++i) acc += x[ix.x(n, c0 + i, ih, iw)] * w[ix.f(o, i, kh, kw)];
                       }
                     }
                     y[ix.y(n, o, oh, ow)] = acc;
                   }
                 }
               });
}

template <typename T>
void conv_backward_data_loop(const Conv2dGeometry& g, const T* dy, const T* w, T* dx) {
  const ConvIndex ix{g};
  const auto& v = g.win;
  const int64_t I = g.cin_per_group(), OG = g.cout_per_group();
  parallel_for(g.n * g.h * g.w, std::max<int64_t>(1, 4096 / std::max<int64_t>(g.c * OG * v.kh * v.kw, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t p = lo; p < hi; ++p) {
                   const int64_t n = p / (g.h * g.w), ih = p / g.w % g.h, iw = p % g.w;
                   for (int64_t c = 0; c < g.c; ++c) {
                     const int64_t o0 = c / I * OG, i = c % I;
                     T acc = 0;
                     for (int64_t kh = 0; kh < v.kh; ++kh) {
                       const int64_t th = ih + v.pt - kh * v.dh;
                       if (th < 0 || th % v.sh != 0 || th / v.sh >= v.oh) continue;
                       for (int64_t kw = 0; kw < v.kw; ++kw) {
                         const int64_t tw = iw + v.pl - kw * v.dw;
                         if (tw < 0 || tw % v.sw != 0 || tw / v.sw >= v.ow) continue;
                         for (int64_t og = 0; og < OG; ++og)
                           acc += dy[ix.y(n, o0 + og, th / v.sh, tw / v.sw)] * w[ix.f(o0 + og, i, kh, kw)];
                       }
                     }
                     dx[ix.x(n, c, ih, iw)] = acc;
                   }
                 }
               });
}

template <typename T>
void conv_backward_filter_loop(const Conv2dGeometry& g, const T* x, const T* dy, T* dw) {
  const ConvIndex ix{g};
  const auto& v = g.win;
  const int64_t I = g.cin_per_group(), OG = g.cout_per_group();
  parallel_for(g.o * I * v.kh * v.kw, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t e = lo; e < hi; ++e) {
      const int64_t o = e / (I * v.kh * v.kw), i = e / (v.kh * v.kw) % I, kh = e / v.kw % v.kh, kw = e % v.kw;
      const int64_t c = o / OG * I + i;
      T acc = 0;
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t oh = 0; oh < v.oh; ++oh) {
          const int64_t ih = oh * v.sh - v.pt + kh * v.dh;
          if (ih < 0 || ih >= g.h) continue;
          for (int64_t ow = 0; ow < v.ow; ++ow) {
            const int64_t iw = ow * v.sw - v.pl + kw * v.dw;
            if (iw < 0 || iw >= g.w) continue;
            acc += x[ix.x(n, c, ih, iw)] * dy[ix.y(n, o, oh, ow)];
          }
        }
      dw[ix.f(o, i, kh, kw)] = acc;
    }
  });
}

// ---- direct NHWC kernel (f32; direct_conv.h) ----------------------------------------------

// The filter in the direct kernel's layout. backward: the backward-data problem's
// filter (flipped, channels swapped).
size_t direct_filter_size(const direct_conv::Problem& p, bool backward) {
  return direct_conv::packed_size(backward ? direct_conv::backward_data_problem(p) : p);
}
void pack_direct_filter(const direct_conv::Problem& p, const float* hwio, bool backward, float* dst) {
  backward ? direct_conv::pack_filter_backward(p, hwio, dst) : direct_conv::pack_filter(p, hwio, dst);
}
// A filter known only at run time, packed into a per-thread scratch buffer (a few us).
const float* scratch_direct_filter(const direct_conv::Problem& p, const float* hwio, bool backward) {
  thread_local std::vector<float> scratch;
  scratch.resize(direct_filter_size(p, backward));
  pack_direct_filter(p, hwio, backward, scratch.data());
  return scratch.data();
}

// ---- oneDNN (f32) ------------------------------------------------------------------------

// The user's filter layout as oneDNN logical dims {[G,] O/G, I, KH, KW} with strides.
memory::desc user_filter_md(const Conv2dGeometry& g, memory::data_type dt) {
  const int64_t G = g.groups, O = g.o, OG = g.cout_per_group(), I = g.cin_per_group(), KH = g.win.kh,
                KW = g.win.kw;
  if (G == 1) {
    if (g.nchw) return memory::desc({O, I, KH, KW}, dt, memory::dims{I * KH * KW, KH * KW, KW, 1});
    return memory::desc({O, I, KH, KW}, dt, memory::dims{1, O, KW * I * O, I * O});
  }
  if (g.nchw) return memory::desc({G, OG, I, KH, KW}, dt, memory::dims{OG * I * KH * KW, I * KH * KW, KH * KW, KW, 1});
  return memory::desc({G, OG, I, KH, KW}, dt, memory::dims{OG, 1, O, KW * I * O, I * O});
}

memory::desc any_filter_md(const Conv2dGeometry& g, memory::data_type dt) {
  memory::dims d = g.groups == 1 ? memory::dims{g.o, g.cin_per_group(), g.win.kh, g.win.kw}
                                 : memory::dims{g.groups, g.cout_per_group(), g.cin_per_group(), g.win.kh, g.win.kw};
  return memory::desc(d, dt, memory::format_tag::any);
}

struct DnnlConv {
  memory::desc src, dst, user_w, any_w, bias;
  memory::dims strides, dilates, pad_l, pad_r;
  std::string key;
  bool serial = false;  // small enough for the calling thread alone (onednn::runs_serial)

  // dt: the data type of every tensor (f32, or bf16 for the native bf16 kernels).
  DnnlConv(const Conv2dGeometry& g, bool with_bias, memory::data_type dt = memory::data_type::f32) {
    const auto& v = g.win;
    src = nn::act_md(g.nchw, g.n, g.c, g.h, g.w, dt);
    dst = nn::act_md(g.nchw, g.n, g.o, v.oh, v.ow, dt);
    user_w = user_filter_md(g, dt);
    any_w = any_filter_md(g, dt);
    if (with_bias) bias = memory::desc({g.o}, dt, memory::format_tag::x);
    strides = {v.sh, v.sw};
    dilates = {v.dh - 1, v.dw - 1};
    pad_l = {v.pt, v.pl};
    pad_r = {v.pb, v.pr};
    key = std::to_string(g.nchw) + "|" + std::to_string(g.n) + "," + std::to_string(g.c) + "," + std::to_string(g.h) +
          "," + std::to_string(g.w) + "," + std::to_string(g.o) + "," + std::to_string(g.groups) + "|" +
          nn::window_key(v) + "|" + std::to_string(with_bias) +
          (dt == memory::data_type::f32 ? "" : "|dt" + std::to_string(static_cast<int>(dt)));
    serial = onednn::runs_serial(g.n * v.oh * v.ow * g.o * g.cin_per_group() * v.kh * v.kw);
    key += onednn::serial_tag(serial);
  }

  // relu: a ReLU post-op on the output (fused_conv2d).
  dnnl::convolution_forward::primitive_desc forward_pd(dnnl::prop_kind prop, bool relu = false) const {
    using dnnl::convolution_forward;
    auto algo = dnnl::algorithm::convolution_direct;
    convolution_forward::desc d =
        bias.is_zero() ? convolution_forward::desc(prop, algo, src, any_w, dst, strides, dilates, pad_l, pad_r)
                       : convolution_forward::desc(prop, algo, src, any_w, bias, dst, strides, dilates, pad_l, pad_r);
    dnnl::primitive_attr attr;
    if (relu) {
      dnnl::post_ops po;
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(po);
    }
    return convolution_forward::primitive_desc(d, attr, onednn::engine());
  }
};

// Reorders between the user's filter and oneDNN's chosen layout when they differ;
// returns memory in `want` layout over `user` data or a reordered copy. `kind`
// names the consumer: forward and backward-data primitives may want different
// blocked layouts for the same shapes.
memory to_internal(const char* kind, const DnnlConv& c, const memory::desc& want, void* user) {
  memory um(c.user_w, onednn::engine(), user);
  if (want == c.user_w) return um;
  memory im(want, onednn::engine());
  dnnl::primitive r = onednn::cached(std::string("conv_w_in|") + kind + "|" + c.key, [&]() -> dnnl::primitive {
    return dnnl::reorder(dnnl::reorder::primitive_desc(onednn::engine(), c.user_w, onednn::engine(), want));
  });
  r.execute(onednn::stream(), {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, im}});
  return im;
}

// conv2d and fused_conv2d (f32), prepared per node and shapes: the geometry and attrs
// parsed and the algorithm chosen once (select_conv_forward); a constant filter packed
// once into the direct kernel's layout or reordered into the oneDNN primitive's (the
// reorder costs 5-15 us per call at batch 1), shared with the node's other shapes when
// they want the same layout.
class ConvForwardF32 final : public PreparedKernel {
 public:
  ConvForwardF32(const PrepareContext& pc, bool fused);
  void run(OpContext& ctx) const override {
    if (algo_ == ConvAlgo::kNothing) return;
    if (pooled_) pooled(ctx);
    else forward(ctx, static_cast<float*>(ctx.out[0].raw_data()));
  }

 private:
  // The convolution's whole output into y (NHWC or NCHW as the attrs say), the ReLU
  // fused when relu_.
  void forward(OpContext& ctx, float* y) const;
  void pooled(OpContext& ctx) const;
  const float* direct_filter(const OpContext& ctx) const {
    return direct_w_ ? direct_w_->data()
                     : scratch_direct_filter(dp_, static_cast<const float*>(ctx.in[1].raw_data()), false);
  }
  dnnl::primitive primitive() const {
    return onednn::cached(primitive_key_, [&]() -> dnnl::primitive {
      return dnnl::convolution_forward(dnnl_->forward_pd(dnnl::prop_kind::forward_inference, relu_));
    });
  }

  Conv2dGeometry g_;
  bool relu_ = false, pooled_ = false, pool_mask_ = false;
  ConvAlgo algo_ = ConvAlgo::kOneDnn;
  direct_conv::Problem dp_;
  std::shared_ptr<const std::vector<float>> direct_w_;  // a constant filter in the direct layout
  std::optional<DnnlConv> dnnl_;                         // kOneDnn: the problem as oneDNN sees it
  std::string primitive_key_;                            // kOneDnn: its key in onednn::cached
  memory::desc dnnl_w_md_;                               // the layout the primitive wants
  std::shared_ptr<const memory> dnnl_w_;                 // a constant filter in that layout
};

ConvForwardF32::ConvForwardF32(const PrepareContext& pc, bool fused) {
  g_ = conv2d_geometry("conv2d", pc.in[0].shape, pc.in[1].shape, pc.attrs);
  relu_ = fused && pc.attrs.get_string("activation", "") == "relu";
  pooled_ = fused && pc.attrs.get_int("max_pool", 0) == 2;
  pool_mask_ = pooled_ && pc.attrs.get_bool("pool_mask", false);
  const Tensor* w = pc.constant(1);
  algo_ = select_conv_forward(g_, w != nullptr, &dp_);
  const auto* prev = dynamic_cast<const ConvForwardF32*>(pc.previous);
  if (algo_ == ConvAlgo::kDirect && w) {
    const bool winograd = direct_conv::uses_winograd(dp_);
    if (prev && prev->direct_w_ && prev->dp_.c == dp_.c && prev->dp_.o == dp_.o && prev->dp_.kh == dp_.kh &&
        prev->dp_.kw == dp_.kw && direct_conv::uses_winograd(prev->dp_) == winograd) {
      direct_w_ = prev->direct_w_;
    } else {
      auto v = std::make_shared<std::vector<float>>(direct_filter_size(dp_, false));
      pack_direct_filter(dp_, w->data<float>(), false, v->data());
      direct_w_ = std::move(v);
    }
  }
  if (algo_ != ConvAlgo::kOneDnn) return;
  dnnl_.emplace(g_, pc.in.size() == 3);
  primitive_key_ = "conv_fwd|" + dnnl_->key + (relu_ ? "|relu" : "");
  if (!w) return;
  try {
    onednn::SerialScope one_thread(dnnl_->serial);
    dnnl_w_md_ = nn::queried_md(primitive(), dnnl_query_weights_md);
    if (dnnl_w_md_ == dnnl_->user_w) return;  // the user's layout: nothing to keep
    if (prev && prev->dnnl_w_ && prev->dnnl_w_md_ == dnnl_w_md_) {
      dnnl_w_ = prev->dnnl_w_;
      return;
    }
    memory m = to_internal("fwd", *dnnl_, dnnl_w_md_, const_cast<void*>(w->raw_data()));
    onednn::stream().wait();
    dnnl_w_ = std::make_shared<const memory>(std::move(m));
  } catch (const dnnl::error&) {
    // run() tries again and falls back (counted) if oneDNN still fails.
  }
}

void ConvForwardF32::forward(OpContext& ctx, float* y) const {
  const Conv2dGeometry& g = g_;
  const bool with_bias = ctx.in.size() == 3;
  const float* bias = with_bias ? static_cast<const float*>(ctx.in[2].raw_data()) : nullptr;
  if (algo_ == ConvAlgo::kDirect) {
    direct_conv::run(dp_, static_cast<const float*>(ctx.in[0].raw_data()), direct_filter(ctx), bias, y, relu_);
    return;
  }
  const DnnlConv& c = *dnnl_;
  onednn::SerialScope one_thread(c.serial);
  try {
    dnnl::primitive p = primitive();
    auto& eng = onednn::engine();
    memory wm = dnnl_w_ ? *dnnl_w_
                        : to_internal("fwd", c, nn::queried_md(p, dnnl_query_weights_md), ctx.in[1].raw_data());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(c.src, eng, ctx.in[0].raw_data())},
                                         {DNNL_ARG_WEIGHTS, wm},
                                         {DNNL_ARG_DST, memory(c.dst, eng, y)}};
    if (with_bias) args.emplace(DNNL_ARG_BIAS, memory(c.bias, eng, const_cast<float*>(bias)));
    p.execute(onednn::stream(), args);
    onednn::stream().wait();
  } catch (const dnnl::error&) {
    note_kernel_fallback("conv2d", "oneDNN failed: reference loop");
    conv_forward_loop<float>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                             static_cast<const float*>(ctx.in[1].raw_data()), bias, y);
    if (relu_) {
      const int64_t n = g.n * g.win.oh * g.win.ow * g.o;
      for (int64_t i = 0; i < n; ++i) y[i] = std::max(y[i], 0.0f);
    }
  }
}

// fused_conv2d with max_pool = 2 (NHWC; a 2x2 max pool with stride 2 and no padding on
// the activation's output), without writing the convolution's output to memory: with
// the direct kernel, each work unit (an image, or a band of its rows when there are
// fewer images than twice the threads) is a convolution of its own (the band's input
// rows, padding where the band meets the image's edge) run on one thread into an
// L2-sized scratch, pooled from there into y. Other convolutions (oneDNN's) write their
// output to a scratch first.
void ConvForwardF32::pooled(OpContext& ctx) const {
  const Conv2dGeometry& g = g_;
  const bool relu = relu_;
  const int64_t OH = g.win.oh, OW = g.win.ow, O = g.o, PH = OH / 2, PW = OW / 2;
  float* y = static_cast<float*>(ctx.out[0].raw_data());
  // Attr conv_output: the convolution's rows go to the second output (then pooled from
  // cache). Attr pool_mask: the second output is the pool's mask (pool_2x2.h).
  const bool with_mask = pool_mask_;
  float* conv_out = ctx.out.size() > 1 && !with_mask ? static_cast<float*>(ctx.out[1].raw_data()) : nullptr;
  uint8_t* mask = with_mask ? static_cast<uint8_t*>(ctx.out[1].raw_data()) : nullptr;
  // Pools convolution rows r0 and the next into pooled row `row` (image * PH + row in it).
  auto pool_row = [&](const float* r0, int64_t row) {
    if (mask)
      max_pool_2x2_mask_row(r0, r0 + OW * O, PW, O, relu, y + row * PW * O, mask + row * PW * O);
    else
      max_pool_2x2_row(r0, r0 + OW * O, PW, O, y + row * PW * O);
  };
  const direct_conv::Problem& dp = dp_;
  if (algo_ != ConvAlgo::kDirect) {
    std::vector<float> full;
    if (!conv_out) full.resize(static_cast<size_t>(g.n * OH * OW * O));
    float* c = conv_out ? conv_out : full.data();
    forward(ctx, c);
    parallel_for(g.n * PH, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) pool_row(c + (r / PH * OH + 2 * (r % PH)) * OW * O, r);
    });
    return;
  }
  const float* w = direct_filter(ctx);
  const float* x = static_cast<const float*>(ctx.in[0].raw_data());
  const float* bias = ctx.in.size() == 3 ? static_cast<const float*>(ctx.in[2].raw_data()) : nullptr;
  const int64_t bands = std::clamp<int64_t>((2 * num_threads() + g.n - 1) / g.n, 1, PH);
  const int64_t band_rows = (PH + bands - 1) / bands;  // pooled rows per band
  const int64_t per_image = (PH + band_rows - 1) / band_rows;
  parallel_for(g.n * per_image, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> scratch;
    if (!conv_out) scratch.resize(static_cast<size_t>(2 * band_rows * OW * O));
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t img = u / per_image, q0 = u % per_image * band_rows, q1 = std::min(PH, q0 + band_rows);
      // Convolution rows [2 q0, 2 q1) read input rows [2 q0 - pt, 2 q1 - 1 - pt + kh - 1].
      direct_conv::Problem band = dp;
      band.n = 1;
      const int64_t first = 2 * q0 - dp.pt, last = std::min(g.h - 1, 2 * q1 - 1 - dp.pt + dp.kh - 1);
      const int64_t in0 = std::max<int64_t>(first, 0);
      band.h = last - in0 + 1;
      band.pt = in0 - first;
      band.pb = 2 * (q1 - q0) + dp.kh - 1 - band.h - band.pt;
      float* rows = conv_out ? conv_out + (img * OH + 2 * q0) * OW * O : scratch.data();
      direct_conv::run(band, x + (img * g.h + in0) * g.w * g.c, w, bias, rows, relu);
      for (int64_t q = q0; q < q1; ++q) pool_row(rows + 2 * (q - q0) * OW * O, img * PH + q);
    }
  });
}

std::unique_ptr<const PreparedKernel> prepare_conv2d_f32(const PrepareContext& pc) {
  return std::make_unique<ConvForwardF32>(pc, false);
}
std::unique_ptr<const PreparedKernel> prepare_fused_conv2d_f32(const PrepareContext& pc) {
  return std::make_unique<ConvForwardF32>(pc, true);
}
constexpr KernelFn conv2d_f32 = &detail::run_prepared_eagerly<prepare_conv2d_f32>;

Conv2dGeometry backward_data_geometry(const OpContext& ctx) {
  return conv2d_geometry("conv2d_backward_data", Shape(ctx.attrs.get_ints("input_shape")), ctx.in[1].shape(),
                         ctx.attrs);
}
Conv2dGeometry backward_filter_geometry(const OpContext& ctx) {
  return conv2d_geometry("conv2d_backward_filter", ctx.in[0].shape(), Shape(ctx.attrs.get_ints("filter_shape")),
                         ctx.attrs);
}

// oneDNN's backward-data and backward-filter convolutions of `g` with every tensor in
// data type dt. false, having done nothing, when native_only and oneDNN has only its
// reference kernel for the problem (a cached null primitive remembers that).
// dnnl::error propagates.
bool onednn_backward_data(OpContext& ctx, const Conv2dGeometry& g, memory::data_type dt, bool native_only) {
  DnnlConv c(g, false, dt);
  onednn::SerialScope one_thread(c.serial);
  dnnl::primitive p = onednn::cached("conv_bwd_data|" + c.key, [&]() -> dnnl::primitive {
    auto hint = c.forward_pd(dnnl::prop_kind::forward_training);
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, c.src, c.any_w, c.dst, c.strides,
                                            c.dilates, c.pad_l, c.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, onednn::engine(), hint);
    return native_only && !onednn::is_optimized(pd) ? dnnl::primitive() : dnnl::convolution_backward_data(pd);
  });
  if (!p) return false;
  auto& eng = onednn::engine();
  memory wm = to_internal("bwd_data", c, nn::queried_md(p, dnnl_query_weights_md), ctx.in[1].raw_data());
  p.execute(onednn::stream(), {{DNNL_ARG_DIFF_DST, memory(c.dst, eng, ctx.in[0].raw_data())},
                               {DNNL_ARG_WEIGHTS, wm},
                               {DNNL_ARG_DIFF_SRC, memory(c.src, eng, ctx.out[0].raw_data())}});
  onednn::stream().wait();
  return true;
}

bool onednn_backward_filter(OpContext& ctx, const Conv2dGeometry& g, memory::data_type dt, bool native_only) {
  DnnlConv c(g, false, dt);
  onednn::SerialScope one_thread(c.serial);
  dnnl::primitive p = onednn::cached("conv_bwd_w|" + c.key, [&]() -> dnnl::primitive {
    auto hint = c.forward_pd(dnnl::prop_kind::forward_training);
    dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, c.src, c.any_w, c.dst, c.strides,
                                               c.dilates, c.pad_l, c.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, onednn::engine(), hint);
    return native_only && !onednn::is_optimized(pd) ? dnnl::primitive() : dnnl::convolution_backward_weights(pd);
  });
  if (!p) return false;
  auto& eng = onednn::engine();
  memory::desc want = nn::queried_md(p, dnnl_query_diff_weights_md);
  memory um(c.user_w, eng, ctx.out[0].raw_data());
  memory wm = want == c.user_w ? um : memory(want, eng);
  p.execute(onednn::stream(), {{DNNL_ARG_SRC, memory(c.src, eng, ctx.in[0].raw_data())},
                               {DNNL_ARG_DIFF_DST, memory(c.dst, eng, ctx.in[1].raw_data())},
                               {DNNL_ARG_DIFF_WEIGHTS, wm}});
  if (!(want == c.user_w)) {
    dnnl::primitive r = onednn::cached("conv_w_out|" + c.key, [&]() -> dnnl::primitive {
      return dnnl::reorder(dnnl::reorder::primitive_desc(eng, want, eng, c.user_w));
    });
    r.execute(onednn::stream(), {{DNNL_ARG_FROM, wm}, {DNNL_ARG_TO, um}});
  }
  onednn::stream().wait();
  return true;
}

void conv2d_backward_data_f32(OpContext& ctx) {
  const Conv2dGeometry g = backward_data_geometry(ctx);
  Tensor& dx = ctx.out[0];
  if (dx.numel() == 0) return;
  if (ctx.in[0].numel() == 0) {
    std::memset(dx.raw_data(), 0, dx.nbytes());
    return;
  }
  direct_conv::Problem dp;
  if (select_conv_backward_data(g, &dp) == ConvAlgo::kDirect) {
    const float* w = scratch_direct_filter(dp, static_cast<const float*>(ctx.in[1].raw_data()), true);
    direct_conv::run(direct_conv::backward_data_problem(dp), static_cast<const float*>(ctx.in[0].raw_data()), w,
                     nullptr, static_cast<float*>(dx.raw_data()), false);
    return;
  }
  try {
    onednn_backward_data(ctx, g, memory::data_type::f32, false);
  } catch (const dnnl::error&) {
    note_kernel_fallback("conv2d_backward_data", "oneDNN failed: reference loop");
    conv_backward_data_loop<float>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                                   static_cast<const float*>(ctx.in[1].raw_data()), static_cast<float*>(dx.raw_data()));
  }
}

void conv2d_backward_filter_f32(OpContext& ctx) {
  const Conv2dGeometry g = backward_filter_geometry(ctx);
  Tensor& dw = ctx.out[0];
  if (dw.numel() == 0) return;
  if (ctx.in[1].numel() == 0) {
    std::memset(dw.raw_data(), 0, dw.nbytes());
    return;
  }
  direct_conv::Problem dp;
  if (select_conv_backward_filter(g, &dp) == ConvAlgo::kDirect) {
    direct_conv::backward_filter(dp, static_cast<const float*>(ctx.in[0].raw_data()),
                                 static_cast<const float*>(ctx.in[1].raw_data()), static_cast<float*>(dw.raw_data()));
    return;
  }
  try {
    onednn_backward_filter(ctx, g, memory::data_type::f32, false);
  } catch (const dnnl::error&) {
    note_kernel_fallback("conv2d_backward_filter", "oneDNN failed: reference loop");
    conv_backward_filter_loop<float>(g, static_cast<const float*>(ctx.in[0].raw_data()),
                                     static_cast<const float*>(ctx.in[1].raw_data()),
                                     static_cast<float*>(dw.raw_data()));
  }
}

// ---- bf16 on oneDNN's native kernels ----------------------------------------------------
// bf16 convolutions run on oneDNN's bf16 kernels (AVX512_BF16, or AMX where the CPU and
// OS grant it), which read and write bf16 and accumulate in f32: no widening copies.
// Where oneDNN has only its reference kernel for the problem (AVX2-only CPUs), they are
// widened to f32 like f16; a cached null primitive records "no native kernel" for a
// problem. (The grey first layer, one input channel, runs slower on oneDNN's bf16 kernel
// than on kiln's f32 small-channel tile, but the widening copies of its large output
// cost more: the cnn's mixed_bfloat16 epoch is faster with it native.)

constexpr auto kBf16 = memory::data_type::bf16;

bool native_bf16(const Conv2dGeometry& g) {
  return g.n > 0 && g.c > 0 && g.o > 0 && g.win.oh > 0 && g.win.ow > 0;
}

// conv2d in bf16, prepared per node and shapes: the native primitive looked up once (a
// problem without one runs widened), a constant filter reordered once into its layout
// (5-15 us a call at batch 1 otherwise) and shared with the node's other shapes when the
// layout matches. The widened fallback runs outside the native attempt's SerialScope.
class ConvForwardBf16 final : public PreparedKernel {
 public:
  explicit ConvForwardBf16(const PrepareContext& pc) {
    const Conv2dGeometry g = conv2d_geometry("conv2d", pc.in[0].shape, pc.in[1].shape, pc.attrs);
    if (!native_bf16(g)) return;
    dnnl_.emplace(g, pc.in.size() == 3, kBf16);
    key_ = "conv_fwd|" + dnnl_->key;
    try {
      onednn::SerialScope one_thread(dnnl_->serial);
      dnnl::primitive p = primitive();
      if (!p) {
        dnnl_.reset();  // oneDNN's reference kernel only: widened on every run
        return;
      }
      const Tensor* w = pc.constant(1);
      if (!w) return;
      w_md_ = nn::queried_md(p, dnnl_query_weights_md);
      if (w_md_ == dnnl_->user_w) return;  // the user's layout: nothing to keep
      const auto* prev = dynamic_cast<const ConvForwardBf16*>(pc.previous);
      if (prev && prev->w_ && prev->w_md_ == w_md_) {
        w_ = prev->w_;
        return;
      }
      memory m = to_internal("fwd", *dnnl_, w_md_, const_cast<void*>(w->raw_data()));
      onednn::stream().wait();
      w_ = std::make_shared<const memory>(std::move(m));
    } catch (const dnnl::error&) {
      // run() tries again and falls back (counted) if oneDNN still fails.
    }
  }

  void run(OpContext& ctx) const override {
    try {
      if (dnnl_ && native(ctx)) return;
    } catch (const dnnl::error&) {
      note_kernel_fallback("conv2d", "oneDNN bf16 failed: widened to f32");
    }
    via_f32<conv2d_f32>(ctx);
  }

 private:
  dnnl::primitive primitive() const {
    return onednn::cached(key_, [&]() -> dnnl::primitive {
      auto pd = dnnl_->forward_pd(dnnl::prop_kind::forward_inference);
      return onednn::is_optimized(pd) ? dnnl::convolution_forward(pd) : dnnl::primitive();
    });
  }
  bool native(OpContext& ctx) const {
    const DnnlConv& c = *dnnl_;
    onednn::SerialScope one_thread(c.serial);
    dnnl::primitive p = primitive();
    if (!p) return false;
    auto& eng = onednn::engine();
    memory wm = w_ ? *w_ : to_internal("fwd", c, nn::queried_md(p, dnnl_query_weights_md), ctx.in[1].raw_data());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(c.src, eng, ctx.in[0].raw_data())},
                                         {DNNL_ARG_WEIGHTS, wm},
                                         {DNNL_ARG_DST, memory(c.dst, eng, ctx.out[0].raw_data())}};
    if (ctx.in.size() == 3) args.emplace(DNNL_ARG_BIAS, memory(c.bias, eng, ctx.in[2].raw_data()));
    p.execute(onednn::stream(), args);
    onednn::stream().wait();
    return true;
  }

  std::optional<DnnlConv> dnnl_;  // unset: the problem runs widened
  std::string key_;
  memory::desc w_md_;                   // the layout the primitive wants
  std::shared_ptr<const memory> w_;     // a constant filter in that layout
};

std::unique_ptr<const PreparedKernel> prepare_conv2d_bf16(const PrepareContext& pc) {
  return std::make_unique<ConvForwardBf16>(pc);
}

void conv2d_backward_data_bf16(OpContext& ctx) {
  const Conv2dGeometry g = backward_data_geometry(ctx);
  try {
    if (native_bf16(g) && onednn_backward_data(ctx, g, kBf16, true)) return;
  } catch (const dnnl::error&) {
    note_kernel_fallback("conv2d_backward_data", "oneDNN bf16 failed: widened to f32");
  }
  via_f32<conv2d_backward_data_f32>(ctx);
}

void conv2d_backward_filter_bf16(OpContext& ctx) {
  const Conv2dGeometry g = backward_filter_geometry(ctx);
  try {
    if (native_bf16(g) && onednn_backward_filter(ctx, g, kBf16, true)) return;
  } catch (const dnnl::error&) {
    note_kernel_fallback("conv2d_backward_filter", "oneDNN bf16 failed: widened to f32");
  }
  via_f32<conv2d_backward_filter_f32>(ctx);
}

// ---- f64 ---------------------------------------------------------------------------------

void conv2d_f64(OpContext& ctx) {
  const Conv2dGeometry g = conv2d_geometry("conv2d", ctx.in[0].shape(), ctx.in[1].shape(), ctx.attrs);
  conv_forward_loop<double>(g, ctx.in[0].data<double>(), ctx.in[1].data<double>(),
                            ctx.in.size() == 3 ? ctx.in[2].data<double>() : nullptr, ctx.out[0].data<double>());
}
void conv2d_backward_data_f64(OpContext& ctx) {
  conv_backward_data_loop<double>(backward_data_geometry(ctx), ctx.in[0].data<double>(), ctx.in[1].data<double>(),
                                  ctx.out[0].data<double>());
}
void conv2d_backward_filter_f64(OpContext& ctx) {
  conv_backward_filter_loop<double>(backward_filter_geometry(ctx), ctx.in[0].data<double>(),
                                    ctx.in[1].data<double>(), ctx.out[0].data<double>());
}

KILN_REGISTER_PREPARED_KERNEL("conv2d", kCPU, DType::kF32, prepare_conv2d_f32);
KILN_REGISTER_PREPARED_KERNEL("fused_conv2d", kCPU, DType::kF32, prepare_fused_conv2d_f32);
KILN_REGISTER_KERNEL("conv2d", kCPU, DType::kF64, conv2d_f64);
KILN_REGISTER_KERNEL("conv2d", kCPU, DType::kF16, via_f32<conv2d_f32>);
KILN_REGISTER_PREPARED_KERNEL("conv2d", kCPU, DType::kBF16, prepare_conv2d_bf16);
KILN_REGISTER_KERNEL("conv2d_backward_data", kCPU, DType::kF32, conv2d_backward_data_f32);
KILN_REGISTER_KERNEL("conv2d_backward_data", kCPU, DType::kF64, conv2d_backward_data_f64);
KILN_REGISTER_KERNEL("conv2d_backward_data", kCPU, DType::kF16, via_f32<conv2d_backward_data_f32>);
KILN_REGISTER_KERNEL("conv2d_backward_data", kCPU, DType::kBF16, conv2d_backward_data_bf16);
KILN_REGISTER_KERNEL("conv2d_backward_filter", kCPU, DType::kF32, conv2d_backward_filter_f32);
KILN_REGISTER_KERNEL("conv2d_backward_filter", kCPU, DType::kF64, conv2d_backward_filter_f64);
KILN_REGISTER_KERNEL("conv2d_backward_filter", kCPU, DType::kF16, via_f32<conv2d_backward_filter_f32>);
KILN_REGISTER_KERNEL("conv2d_backward_filter", kCPU, DType::kBF16, conv2d_backward_filter_bf16);

}  // namespace
}  // namespace kiln::cpu
