// CPU kernels of the int8 inference ops (src/ops/quantized.cc): quantize/dequantize
// per tensor, qlinear_matmul and qlinear_conv2d.
//
// qlinear_*: x is quantised to a u8 buffer (one parallel, vectorised pass that also
// records max(xq)), then one oneDNN u8 x s8 -> f32 primitive runs with the source zero
// point (runtime), per-output-channel output scales x_scale * w_scale[o], the bias as a
// binary-add post-op (oneDNN 2.x adds DNNL_ARG_BIAS *before* the output scales, so it
// cannot be used) and ReLU as an eltwise post-op. Primitives are cached by shape; the
// matmul takes its scales at run time, the convolution (whose AVX2 int8 kernels have no
// runtime scales) bakes them into its primitive, so its cache key holds their bytes
// (one primitive per layer in an inference graph). oneDNN treats padded convolution
// inputs as real zeros under a source zero point (checked: the tests use zero point 128
// with "same" padding).
//
// Saturation: without VNNI, oneDNN's int8 kernels multiply with vpmaddubsw, which adds
// two u8 x s8 products into a saturating int16. With max(xq) * 2 * max|w| <= 32767 no
// pair can saturate; otherwise the weights are split as w = (w >> 1) + (w - (w >> 1))
// (both halves in [-64, 64]) and the input duplicated along K (or along each group's
// input channels), which doubles the work but keeps the result exact.
//
// Tiny problems (<= 4096 multiply-adds) run a direct int32 loop instead (oneDNN's call
// overhead dominates there); the same loops are the fallback when oneDNN has no
// primitive for a configuration. Convolutions with 1-3 input channels (an image
// network's first layer) run fused_conv2d's f32 kernel on the dequantised operands:
// oneDNN's int8 kernels pad the channels to 4 and are 1.1-2.5x slower there.
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/dispatch.h"
#include "kiln/core/kernel.h"
#include "kiln/core/op_def.h"
#include "kiln/core/parallel.h"
#include "nn_kernel_util.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using nn_geometry::Conv2dGeometry;
using nn_geometry::conv2d_geometry;

constexpr int64_t kTinyMacs = 4096;

struct QParams {
  float scale;
  int32_t zero_point;
};

QParams qparams(const Attrs& a, const char* scale, const char* zp) {
  return {static_cast<float>(a.get_float(scale)), static_cast<int32_t>(a.get_int(zp, 0))};
}

bool relu_of(const Attrs& a) { return a.get_string("activation", "none") == "relu"; }

// ---- quantisation ------------------------------------------------------------------------

// q = clamp(round_half_even(x / scale) + zp, 0, 255) (NaN -> 0); returns max(q).
int quantize_scalar(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  int mx = 0;
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) {
    float v = std::nearbyint(x[i] / scale) + zp;
    v = v > 0.0f ? v : 0.0f;  // also NaN -> 0
    v = v < 255.0f ? v : 255.0f;
    const int iv = static_cast<int>(v);
    q[i] = static_cast<uint8_t>(iv);
    mx = std::max(mx, iv);
  }
  return mx;
}

#ifdef __AVX2__
// The same, 32 values a step (3x the auto-vectorised loop: its u8 packing is poor).
int quantize_span(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zp), lo = _mm256_setzero_ps(),
               hi = _mm256_set1_ps(255.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the lane-wise packs
  auto eight = [&](const float* p) {
    __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(p), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(v, z), lo), hi);  // max_ps(NaN, 0) is 0
    return _mm256_cvttps_epi32(v);
  };
  __m256i mx = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i ab = _mm256_packus_epi32(eight(x + i), eight(x + i + 8));
    const __m256i cd = _mm256_packus_epi32(eight(x + i + 16), eight(x + i + 24));
    const __m256i r = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), r);
    mx = _mm256_max_epu8(mx, r);
  }
  alignas(32) uint8_t m[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(m), mx);
  return std::max<int>(*std::max_element(m, m + 32), quantize_scalar(x + i, n - i, scale, zp, q + i));
}
#else
int quantize_span(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  return quantize_scalar(x, n, scale, zp, q);
}
#endif

int quantize_buffer(const float* x, int64_t n, QParams p, uint8_t* q) {
  std::atomic<int> mx{0};
  parallel_for(n, 1 << 14, [&](int64_t lo, int64_t hi) {
    const int m = quantize_span(x + lo, hi - lo, p.scale, static_cast<float>(p.zero_point), q + lo);
    int cur = mx.load(std::memory_order_relaxed);
    while (m > cur && !mx.compare_exchange_weak(cur, m, std::memory_order_relaxed)) {
    }
  });
  return mx.load();
}

void quantize_f32(OpContext& ctx) {
  QParams p = qparams(ctx.attrs, "scale", "zero_point");
  quantize_buffer(ctx.in[0].data<float>(), ctx.in[0].numel(), p, ctx.out[0].data<uint8_t>());
}

void dequantize_u8(OpContext& ctx) {
  QParams p = qparams(ctx.attrs, "scale", "zero_point");
  const uint8_t* q = ctx.in[0].data<uint8_t>();
  float* y = ctx.out[0].data<float>();
  parallel_for(ctx.in[0].numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = static_cast<float>(static_cast<int32_t>(q[i]) - p.zero_point) * p.scale;
  });
}

// ---- saturation-free split -------------------------------------------------------------------

int max_abs_i8(const int8_t* w, int64_t n) {
  int m = 0;
  int64_t i = 0;
#ifdef __AVX2__
  __m256i v = _mm256_setzero_si256();  // |w| as u8 (|-128| is 0x80 = 128)
  for (; i + 32 <= n; i += 32)
    v = _mm256_max_epu8(v, _mm256_abs_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i))));
  alignas(32) uint8_t b[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), v);
  m = *std::max_element(b, b + 32);
#endif
  for (; i < n; ++i) m = std::max(m, std::abs(static_cast<int>(w[i])));
  return m;
}

// Whether oneDNN's int8 kernels accumulate without 16-bit intermediates (VNNI).
bool has_vnni() {
  static const bool v = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto vnni = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_vnni);
    return (isa & vnni) == vnni;
  }();
  return v;
}

// True when no vpmaddubsw pair sum can leave int16.
bool saturation_free(int max_xq, const int8_t* w, int64_t n) {
  return has_vnni() || static_cast<int64_t>(max_xq) * 2 * max_abs_i8(w, n) <= 32767;
}

int8_t hi_half(int8_t w) { return static_cast<int8_t>(w >> 1); }  // floor(w / 2), in [-64, 63]
int8_t lo_half(int8_t w) { return static_cast<int8_t>(w - (w >> 1)); }  // in [-64, 64]

// hi[i] = hi_half(w[i]), lo[i] = lo_half(w[i]) (locals and __restrict: vectorises).
void split_weights(const int8_t* __restrict w, int64_t n, int8_t* __restrict hi, int8_t* __restrict lo) {
  for (int64_t i = 0; i < n; ++i) {
    hi[i] = hi_half(w[i]);
    lo[i] = lo_half(w[i]);
  }
}

// Rows of `groups` blocks of `width` bytes -> each block written twice:
// [rows, groups, width] -> [rows, groups, 2, width].
void duplicate_blocks(const uint8_t* src, int64_t rows, int64_t groups, int64_t width, uint8_t* dst) {
  parallel_for(rows * groups, std::max<int64_t>(1, 16384 / width), [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      std::memcpy(dst + 2 * b * width, src + b * width, width);
      std::memcpy(dst + (2 * b + 1) * width, src + b * width, width);
    }
  });
}

// ---- oneDNN ------------------------------------------------------------------------------

memory::desc runtime_zp_md() { return memory::desc({1}, memory::data_type::s32, memory::format_tag::x); }

// The post-ops: bias (binary add of a per-channel f32 tensor `bias_md`), then ReLU,
// then with `yq` the requantisation y / y_scale + y_zero_point (the u8 destination
// rounds half to even and saturates to [0, 255], as quantize_per_tensor).
dnnl::primitive_attr int8_attr(bool zp, bool bias, const memory::desc& bias_md, bool relu, const QParams* yq) {
  dnnl::primitive_attr attr;
  if (zp) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::post_ops po;
  if (bias) po.append_binary(dnnl::algorithm::binary_add, bias_md);
  if (relu) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (yq)
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, 1.0f / yq->scale, static_cast<float>(yq->zero_point));
  attr.set_post_ops(po);
  return attr;
}

// The requantisation in a primitive's cache key (its post-op constants are baked in).
std::string requant_key(const QParams* yq) {
  if (!yq) return "|f32";
  return "|u8:" + std::string(reinterpret_cast<const char*>(&yq->scale), sizeof(float)) + std::to_string(yq->zero_point);
}

// c [M, N] = act(scales[n] * ((a - zp) @ b) + bias[n]), a u8 [M, K], b s8 [K, N]; c is
// f32, or u8 requantised with `yq`.
void onednn_qmatmul(int64_t M, int64_t K, int64_t N, const uint8_t* a, const int8_t* b, const float* scales, int32_t zp,
                    const float* bias, bool relu, const QParams* yq, void* c) {
  auto& eng = onednn::engine();
  memory::desc a_md({M, K}, memory::data_type::u8, memory::format_tag::ab);
  memory::desc b_md({K, N}, memory::data_type::s8, memory::format_tag::ab);
  memory::desc c_md({M, N}, yq ? memory::data_type::u8 : memory::data_type::f32, memory::format_tag::ab);
  memory::desc bias_md({1, N}, memory::data_type::f32, memory::format_tag::ab);
  const bool serial = onednn::runs_serial(M * K * N);
  onednn::SerialScope one_thread(serial);
  const std::string key = "qmm|" + std::to_string(M) + "," + std::to_string(K) + "," + std::to_string(N) + "|" +
                          std::to_string(zp != 0) + std::to_string(bias != nullptr) + std::to_string(relu) +
                          onednn::serial_tag(serial) + requant_key(yq);
  dnnl::primitive p = onednn::cached(key, [&]() -> dnnl::primitive {
    dnnl::primitive_attr attr = int8_attr(zp != 0, bias != nullptr, bias_md, relu, yq);
    attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
    return dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng));
  });
  memory::desc scales_md({N}, memory::data_type::f32, memory::format_tag::x);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(a_md, eng, const_cast<uint8_t*>(a))},
      {DNNL_ARG_WEIGHTS, memory(b_md, eng, const_cast<int8_t*>(b))},
      {DNNL_ARG_DST, memory(c_md, eng, c)},
      {DNNL_ARG_ATTR_OUTPUT_SCALES, memory(scales_md, eng, const_cast<float*>(scales))}};
  int32_t zp_value = zp;
  if (zp != 0) args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, memory(runtime_zp_md(), eng, &zp_value));
  if (bias) args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, memory(bias_md, eng, const_cast<float*>(bias)));
  p.execute(onednn::stream(), args);
  onednn::stream().wait();
}

// A constant filter reordered into a primitive's layout, kept by the prepared kernel
// that owns it (made on the first run that needs it: the layout depends on the
// primitive, the plain or split filter on the input's data).
struct ReorderedFilter {
  std::mutex mu;
  memory::desc want;
  std::shared_ptr<const memory> m;
};

// y NHWC = act(scales[o] * conv(xq - zp, w) + bias[o]); xq u8 NHWC, w s8 HWIO; y f32, or
// u8 requantised with `yq`. With a `keep`, w is the same on every call (a constant
// filter): its reorder is made once and kept there.
void onednn_qconv(const Conv2dGeometry& g, const uint8_t* xq, const int8_t* w, const float* scales, int32_t zp,
                  const float* bias, bool relu, const QParams* yq, void* y, ReorderedFilter* keep) {
  auto& eng = onednn::engine();
  const auto& v = g.win;
  const int64_t G = g.groups, O = g.o, OG = g.cout_per_group(), I = g.cin_per_group(), KH = v.kh, KW = v.kw;
  const auto s8 = memory::data_type::s8;
  memory::desc src({g.n, g.c, g.h, g.w}, memory::data_type::u8, memory::format_tag::nhwc);
  memory::desc dst({g.n, O, v.oh, v.ow}, yq ? memory::data_type::u8 : memory::data_type::f32, memory::format_tag::nhwc);
  // The user's HWIO filter as oneDNN's logical {[G,] O/G, I, KH, KW}.
  memory::desc user_w = G == 1 ? memory::desc({O, I, KH, KW}, s8, memory::dims{1, O, KW * I * O, I * O})
                               : memory::desc({G, OG, I, KH, KW}, s8, memory::dims{OG, 1, O, KW * I * O, I * O});
  memory::desc any_w = G == 1 ? memory::desc({O, I, KH, KW}, s8, memory::format_tag::any)
                              : memory::desc({G, OG, I, KH, KW}, s8, memory::format_tag::any);
  memory::desc bias_md({1, O, 1, 1}, memory::data_type::f32, memory::format_tag::nchw);
  const bool serial = onednn::runs_serial(g.n * v.oh * v.ow * O * I * KH * KW);
  onednn::SerialScope one_thread(serial);
  const std::string key = std::string("qconv") + onednn::serial_tag(serial) + "|" + std::to_string(g.n) + "," +
                          std::to_string(g.c) + "," + std::to_string(g.h) + "," + std::to_string(g.w) + "," +
                          std::to_string(O) + "," + std::to_string(G) + "|" + nn::window_key(v) + "|" +
                          std::to_string(zp != 0) + std::to_string(bias != nullptr) + std::to_string(relu) +
                          requant_key(yq) + "|" +
                          std::string(reinterpret_cast<const char*>(scales), sizeof(float) * O);
  dnnl::primitive p = onednn::cached(key, [&]() -> dnnl::primitive {
    dnnl::primitive_attr attr = int8_attr(zp != 0, bias != nullptr, bias_md, relu, yq);
    attr.set_output_scales(1 << 1, std::vector<float>(scales, scales + O));
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
                                      any_w, dst, {v.sh, v.sw}, {v.dh - 1, v.dw - 1}, {v.pt, v.pl}, {v.pb, v.pr});
    dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
    // oneDNN 2.6's int8 1x1 kernel with strides (its "reduce to unit stride" copy)
    // races with more than one thread: now and then a whole output pixel is wrong
    // (1x1 s2 on 4x10x10x8 -> 16: 1 run in 5). Take the next implementation.
    if (v.sh > 1 || v.sw > 1)
      while (std::string(pd.impl_info_str()).find("1x1") != std::string::npos && pd.next_impl()) {
      }
    return dnnl::convolution_forward(pd);
  });
  // Reorder the filter into the primitive's layout (which may carry zero-point
  // compensation that the reorder computes).
  memory::desc want = nn::queried_md(p, dnnl_query_weights_md);
  memory um(user_w, eng, const_cast<int8_t*>(w));
  auto reordered = [&] {
    memory wm(want, eng);
    dnnl::primitive r = onednn::cached("qconv_w|" + key, [&]() -> dnnl::primitive {
      return dnnl::reorder(dnnl::reorder::primitive_desc(eng, user_w, eng, want));
    });
    r.execute(onednn::stream(), {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, wm}});
    return wm;
  };
  memory wm = um;
  if (!(want == user_w) && keep) {
    std::lock_guard<std::mutex> lock(keep->mu);
    if (!keep->m || !(keep->want == want)) {
      keep->m = std::make_shared<const memory>(reordered());
      onednn::stream().wait();
      keep->want = want;
    }
    wm = *keep->m;
  } else if (!(want == user_w)) {
    wm = reordered();
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src, eng, const_cast<uint8_t*>(xq))},
                                       {DNNL_ARG_WEIGHTS, wm},
                                       {DNNL_ARG_DST, memory(dst, eng, y)}};
  int32_t zp_value = zp;
  if (zp != 0) args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, memory(runtime_zp_md(), eng, &zp_value));
  if (bias) args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, memory(bias_md, eng, const_cast<float*>(bias)));
  p.execute(onednn::stream(), args);
  onednn::stream().wait();
}

// ---- direct loops (tiny problems, and the fallback) ------------------------------------------

inline float finish(int32_t acc, float scale, const float* bias, int64_t o, bool relu) {
  float r = static_cast<float>(acc) * scale + (bias ? bias[o] : 0.0f);
  return relu ? std::max(r, 0.0f) : r;
}

void qmatmul_loop(int64_t M, int64_t K, int64_t N, const uint8_t* a, const int8_t* b, const float* scales, int32_t zp,
                  const float* bias, bool relu, float* c) {
  parallel_for(M, std::max<int64_t>(1, 4096 / std::max<int64_t>(N * K, 1)), [&](int64_t lo, int64_t hi) {
    std::vector<int32_t> acc(N);
    for (int64_t m = lo; m < hi; ++m) {
      std::fill(acc.begin(), acc.end(), 0);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t av = static_cast<int32_t>(a[m * K + k]) - zp;
        const int8_t* brow = b + k * N;
        for (int64_t n = 0; n < N; ++n) acc[n] += av * brow[n];
      }
      for (int64_t n = 0; n < N; ++n) c[m * N + n] = finish(acc[n], scales[n], bias, n, relu);
    }
  });
}

void qconv_loop(const Conv2dGeometry& g, const uint8_t* xq, const int8_t* w, const float* scales, int32_t zp,
                const float* bias, bool relu, float* y) {
  const auto& v = g.win;
  const int64_t I = g.cin_per_group(), OG = g.cout_per_group(), O = g.o;
  parallel_for(g.n * v.oh * v.ow, std::max<int64_t>(1, 4096 / std::max<int64_t>(O * I * v.kh * v.kw, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t p = lo; p < hi; ++p) {
                   const int64_t n = p / (v.oh * v.ow), oh = p / v.ow % v.oh, ow = p % v.ow;
                   for (int64_t o = 0; o < O; ++o) {
                     const int64_t c0 = o / OG * I;
                     int32_t acc = 0;
                     for (int64_t kh = 0; kh < v.kh; ++kh) {
                       const int64_t ih = oh * v.sh - v.pt + kh * v.dh;
                       if (ih < 0 || ih >= g.h) continue;  // padding: real zeros
                       for (int64_t kw = 0; kw < v.kw; ++kw) {
                         const int64_t iw = ow * v.sw - v.pl + kw * v.dw;
                         if (iw < 0 || iw >= g.w) continue;
                         const uint8_t* xp = xq + ((n * g.h + ih) * g.w + iw) * g.c + c0;
                         const int8_t* wp = w + (kh * v.kw + kw) * I * O + o;
                         for (int64_t i = 0; i < I; ++i) acc += (static_cast<int32_t>(xp[i]) - zp) * wp[i * O];
                       }
                     }
                     y[p * O + o] = finish(acc, scales[o], bias, o, relu);
                   }
                 }
               });
}

// ---- kernels -----------------------------------------------------------------------------

// x_scale * w_scale[o] per output channel.
std::vector<float> output_scales(float x_scale, const Tensor& w_scale) {
  const float* ws = w_scale.data<float>();
  std::vector<float> s(w_scale.numel());
  for (size_t i = 0; i < s.size(); ++i) s[i] = x_scale * ws[i];
  return s;
}

int max_u8(const uint8_t* q, int64_t n) {
  int m = 0;
  int64_t i = 0;
#ifdef __AVX2__
  __m256i v = _mm256_setzero_si256();
  for (; i + 32 <= n; i += 32) v = _mm256_max_epu8(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)));
  alignas(32) uint8_t b[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), v);
  m = *std::max_element(b, b + 32);
#endif
  for (; i < n; ++i) m = std::max<int>(m, q[i]);
  return m;
}

// The op's x as u8 quantised with (x_scale, x_zero_point): x itself when it is u8
// (already quantised: an earlier int8 layer's requantised output), else quantised here.
struct QuantizedInput {
  Tensor storage;
  const uint8_t* q = nullptr;
  int max_q = 0;  // for the saturation check
};

QuantizedInput quantized_input(const Tensor& x, QParams p) {
  QuantizedInput r;
  if (x.dtype() == DType::kU8) {
    r.q = x.data<uint8_t>();
    r.max_q = max_u8(r.q, x.numel());
    return r;
  }
  r.storage = Tensor::empty(Shape{x.numel()}, DType::kU8);
  r.max_q = quantize_buffer(x.data<float>(), x.numel(), p, r.storage.data<uint8_t>());
  r.q = r.storage.data<uint8_t>();
  return r;
}

// Where a route writes an f32 result: the output itself, or for a u8 output (y_scale
// set) a scratch tensor that store() requantises into it. Routes that requantise inside
// oneDNN write the u8 output directly (requant()).
class Output {
 public:
  explicit Output(OpContext& ctx) : out_(ctx.out[0]) {
    if (out_.dtype() == DType::kU8) {
      requant_ = qparams(ctx.attrs, "y_scale", "y_zero_point");
      scratch_ = Tensor::empty(out_.shape(), DType::kF32);
    }
  }
  float* f32() { return requant_ ? scratch_.data<float>() : out_.data<float>(); }
  const Tensor& f32_tensor() const { return requant_ ? scratch_ : out_; }
  const QParams* requant() const { return requant_ ? &*requant_ : nullptr; }
  void* raw() { return out_.raw_data(); }
  // After an f32 route: requantise the scratch into the u8 output.
  void store() {
    if (requant_) quantize_buffer(scratch_.data<float>(), out_.numel(), *requant_, out_.data<uint8_t>());
  }

 private:
  Tensor& out_;
  std::optional<QParams> requant_;
  Tensor scratch_;
};

void qlinear_matmul_kernel(OpContext& ctx) {
  const Tensor &x = ctx.in[0], &w = ctx.in[1];
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  if (M * N == 0) return;
  const QParams p = qparams(ctx.attrs, "x_scale", "x_zero_point");
  const bool relu = relu_of(ctx.attrs);
  const float* bias = ctx.in.size() == 4 ? ctx.in[3].data<float>() : nullptr;
  const std::vector<float> scales = output_scales(p.scale, ctx.in[2]);
  Output out(ctx);
  const QuantizedInput xq = quantized_input(x, p);
  const int8_t* wq = w.data<int8_t>();
  if (K == 0 || M * N * K <= kTinyMacs) {
    qmatmul_loop(M, K, N, xq.q, wq, scales.data(), p.zero_point, bias, relu, out.f32());
    out.store();
    return;
  }
  Tensor xw, ww;  // the split operands: [M, 2K] and [2K, N]
  const uint8_t* a = xq.q;
  const int8_t* b = wq;
  int64_t k = K;
  if (!saturation_free(xq.max_q, wq, K * N)) {
    xw = Tensor::empty(Shape{M * 2 * K}, DType::kU8);
    duplicate_blocks(a, M, 1, K, xw.data<uint8_t>());
    ww = Tensor::empty(Shape{2 * K * N}, DType::kI8);
    int8_t* s = ww.data<int8_t>();
    parallel_for(K * N, 1 << 15, [s, wq, kn = K * N](int64_t lo, int64_t hi) {
      split_weights(wq + lo, hi - lo, s + lo, s + kn + lo);
    });
    a = xw.data<uint8_t>();
    b = s;
    k = 2 * K;
  }
  try {
    onednn_qmatmul(M, k, N, a, b, scales.data(), p.zero_point, bias, relu, out.requant(), out.raw());
  } catch (const dnnl::error&) {
    note_kernel_fallback("qlinear_matmul", "oneDNN failed: int32 loop");
    qmatmul_loop(M, K, N, xq.q, wq, scales.data(), p.zero_point, bias, relu, out.f32());
    out.store();
  }
}

// Up to this many input channels (groups 1), oneDNN's int8 convolution pads them to
// 4 and is slower than f32 (3x3 -> 32 on 64x28x28: 1 channel 600 us int8 vs 245 us
// f32, 3 channels 600 vs 525, 4 channels 350 vs 670): compute in f32 instead.
constexpr int64_t kMaxF32Channels = 3;


// x quantised and dequantised: (xq - zp) * x_scale as f32 (the f32 route's input).
Tensor dequantised_input(const Tensor& x, QParams p) {
  Tensor xd = Tensor::empty(x.shape(), DType::kF32);
  float* d = xd.data<float>();
  const float zp = static_cast<float>(p.zero_point);
  if (x.dtype() == DType::kU8) {  // already quantised
    const uint8_t* q = x.data<uint8_t>();
    parallel_for(x.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) d[i] = (static_cast<float>(q[i]) - zp) * p.scale;
    });
  } else {
    const float* xp = x.data<float>();
    parallel_for(x.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {  // quantise and dequantise in one pass
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        float v = std::nearbyint(xp[i] / p.scale) + zp;
        v = v > 0.0f ? v : 0.0f;  // also NaN -> 0
        v = v < 255.0f ? v : 255.0f;
        d[i] = (v - zp) * p.scale;
      }
    });
  }
  return xd;
}

// The filter w_q * w_scale[o] as f32 (HWIO: o is the last dim).
Tensor dequantised_filter(const Tensor& w, const Tensor& w_scale) {
  Tensor wd = Tensor::empty(w.shape(), DType::kF32);
  const int8_t* wq = w.data<int8_t>();
  const float* ws = w_scale.data<float>();
  const int64_t o = w_scale.numel();
  float* wf = wd.data<float>();
  for (int64_t i = 0; i < w.numel(); ++i) wf[i] = static_cast<float>(wq[i]) * ws[i % o];
  return wd;
}

// qlinear_conv2d, prepared per node and shapes. Its route follows from the shapes: a
// direct int32 loop for tiny problems; fused_conv2d's f32 kernel on the dequantised
// operands (xq - zp) * x_scale and w_q * w_scale[o] for 1-3 input channels (the same
// products rounded to f32, relative error ~1e-7 against the exact int32 sum), prepared
// here with the dequantised filter as its constant when the filter and scales are; else
// oneDNN's int8 convolution, with a constant filter's reorders kept.
class QlinearConv2d final : public PreparedKernel {
 public:
  explicit QlinearConv2d(const PrepareContext& pc) {
    g_ = conv2d_geometry("qlinear_conv2d", pc.in[0].shape, pc.in[1].shape, pc.attrs);
    p_ = qparams(pc.attrs, "x_scale", "x_zero_point");
    relu_ = relu_of(pc.attrs);
    const int64_t out_numel = pc.out[0].shape.numel();
    const bool tiny = out_numel * g_.win.kh * g_.win.kw * g_.cin_per_group() <= kTinyMacs;
    route_ = out_numel == 0 ? Route::kNothing
             : tiny         ? Route::kLoop
             : g_.groups == 1 && g_.c <= kMaxF32Channels ? Route::kF32
                                                         : Route::kOneDnn;
    const Tensor* w = pc.constant(1);
    const Tensor* w_scale = pc.constant(2);
    constant_ = w && w_scale;
    if (constant_ && route_ != Route::kF32) scales_ = output_scales(p_.scale, *w_scale);
    if (route_ != Route::kF32) return;
    if (constant_) filter_f32_ = dequantised_filter(*w, *w_scale);
    // fused_conv2d reads conv2d's attrs and "activation".
    const OpDef& fused = OpRegistry::global().get("fused_conv2d");
    fused_ = &fused;
    std::vector<TensorMeta> in{{pc.in[0].shape, DType::kF32}, {pc.in[1].shape, DType::kF32}};
    if (pc.in.size() == 4) in.push_back(pc.in[3]);
    const std::vector<TensorMeta> out{{pc.out[0].shape, DType::kF32}};
    std::vector<Tensor> constants(in.size());
    constants[1] = filter_f32_;
    if (pc.in.size() == 4 && pc.constant(3)) constants[2] = *pc.constant(3);
    f32_ = prepare_kernel({fused, DeviceType::kCPU, in, out, constants, pc.attrs});
  }

  void run(OpContext& ctx) const override;

 private:
  enum class Route : uint8_t { kNothing, kLoop, kF32, kOneDnn };
  Conv2dGeometry g_;
  QParams p_;
  bool relu_ = false;
  Route route_ = Route::kOneDnn;
  bool constant_ = false;       // the filter and its scales are constants
  std::vector<float> scales_;   // constant_: x_scale * w_scale[o]
  Tensor filter_f32_;           // kF32 and constant_: the dequantised filter
  const OpDef* fused_ = nullptr;               // kF32: fused_conv2d
  std::unique_ptr<const PreparedKernel> f32_;  // kF32: fused_conv2d's f32 kernel
  mutable ReorderedFilter plain_, split_;      // constant_: the filter in oneDNN's layout
};

void QlinearConv2d::run(OpContext& ctx) const {
  const Conv2dGeometry& g = g_;
  const QParams& p = p_;
  if (route_ == Route::kNothing) return;
  Output out(ctx);
  if (route_ == Route::kF32) {
    const Tensor y = out.f32_tensor();
    std::vector<Tensor> in{dequantised_input(ctx.in[0], p), constant_ ? filter_f32_ : dequantised_filter(ctx.in[1], ctx.in[2])};
    if (ctx.in.size() == 4) in.push_back(ctx.in[3]);
    std::vector<Tensor> outs{y};
    OpContext c2{*fused_, in, outs, ctx.attrs};
    f32_->run(c2);
    out.store();
    return;
  }
  const float* bias = ctx.in.size() == 4 ? ctx.in[3].data<float>() : nullptr;
  std::vector<float> run_scales;
  if (!constant_) run_scales = output_scales(p.scale, ctx.in[2]);
  const std::vector<float>& scales = constant_ ? scales_ : run_scales;
  const QuantizedInput xq = quantized_input(ctx.in[0], p);
  const int8_t* wq = ctx.in[1].data<int8_t>();
  const int64_t wn = ctx.in[1].numel();
  if (route_ == Route::kLoop) {
    qconv_loop(g, xq.q, wq, scales.data(), p.zero_point, bias, relu_, out.f32());
    out.store();
    return;
  }
  Conv2dGeometry gd = g;  // the geometry oneDNN runs: twice the input channels when split
  Tensor xw, ww;
  const uint8_t* a = xq.q;
  const int8_t* b = wq;
  const bool split = !saturation_free(xq.max_q, wq, wn);
  if (split) {
    // x [N*H*W, G, I] -> [N*H*W, G, 2, I]; filter HWIO [KH*KW, I, O] -> [KH*KW, 2I, O]
    // (rows i < I hold the high halves, rows I + i the low halves).
    const int64_t I = g.cin_per_group(), O = g.o, taps = g.win.kh * g.win.kw;
    xw = Tensor::empty(Shape{2 * ctx.in[0].numel()}, DType::kU8);
    duplicate_blocks(a, g.n * g.h * g.w, g.groups, I, xw.data<uint8_t>());
    ww = Tensor::empty(Shape{2 * wn}, DType::kI8);
    int8_t* s = ww.data<int8_t>();
    for (int64_t t = 0; t < taps; ++t) split_weights(wq + t * I * O, I * O, s + t * 2 * I * O, s + (2 * t + 1) * I * O);
    a = xw.data<uint8_t>();
    b = s;
    gd.c *= 2;
  }
  try {
    onednn_qconv(gd, a, b, scales.data(), p.zero_point, bias, relu_, out.requant(), out.raw(),
                 constant_ ? (split ? &split_ : &plain_) : nullptr);
  } catch (const dnnl::error&) {
    note_kernel_fallback("qlinear_conv2d", "oneDNN failed: int32 loop");
    qconv_loop(g, xq.q, wq, scales.data(), p.zero_point, bias, relu_, out.f32());
    out.store();
  }
}

std::unique_ptr<const PreparedKernel> prepare_qlinear_conv2d(const PrepareContext& pc) {
  return std::make_unique<QlinearConv2d>(pc);
}

KILN_REGISTER_KERNEL("quantize_per_tensor", kCPU, DType::kF32, quantize_f32);
KILN_REGISTER_KERNEL("dequantize_per_tensor", kCPU, DType::kU8, dequantize_u8);
// Dispatched on the output dtype: f32, or u8 when requantised (y_scale).
KILN_REGISTER_KERNEL("qlinear_matmul", kCPU, (std::initializer_list<DType>{DType::kF32, DType::kU8}), qlinear_matmul_kernel);
KILN_REGISTER_PREPARED_KERNEL("qlinear_conv2d", kCPU, (std::initializer_list<DType>{DType::kF32, DType::kU8}),
                              prepare_qlinear_conv2d);

}  // namespace
}  // namespace kiln::cpu
