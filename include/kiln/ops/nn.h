#pragma once
// Neural-network ops: softmax, convolution, pooling, normalisation, dropout,
// embedding lookup and scaled dot-product attention.
//
// Dtype rules (all ops unless stated): the ops compute in floating point. Integer
// or bool inputs are converted to f32 first; several floating inputs promote to a
// common dtype (kiln::promote_types). f32 and f64 compute natively; f16 and bf16
// compute in f32 and round the result back. Per-channel parameters (bias, mean,
// var, gamma, beta, an additive mask) take the input's dtype, except that f32
// parameters of a 16-bit input are used as they are (no precision is lost).
//
// Layouts: "NHWC" (TensorFlow's default, filters HWIO [kh, kw, in/groups, out]) or
// "NCHW" (PyTorch's, filters OIHW [out, in/groups, kh, kw]). NHWC is the faster
// layout on the CPU.
//
// Errors are typed kiln::Error: InvalidArgumentError for wrong ranks, shapes,
// channel/group mismatches, bad padding or data_format strings and bad rates;
// OutOfRangeError for out-of-range axes and embedding ids.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::ops {

// ---- softmax -----------------------------------------------------------------------

// exp(x - max) / sum(exp(x - max)) along `axis` (negative counts from the end).
// Numerically stable for any finite input magnitude. A slice that is all -inf gives
// NaN, as in NumPy/PyTorch. Errors: axis out of range (OutOfRangeError).
Tensor softmax(const Tensor& x, int64_t axis = -1);
// x - max - log(sum(exp(x - max))) along `axis`; more accurate than log(softmax(x)).
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

// ---- convolution -------------------------------------------------------------------

// Spatial padding: "valid" (none), "same" (TensorFlow's rule: output size
// ceil(in / stride), the odd pixel of padding on the bottom/right), or explicit
// {top, bottom, left, right} (each >= 0). Strings are case-insensitive.
struct Padding {
  std::string mode = "valid";  // "valid", "same" or "explicit"
  std::vector<int64_t> pads;   // {top, bottom, left, right} when mode is "explicit"

  Padding() = default;
  Padding(const char* m) : mode(m) {}                                        // NOLINT: implicit by design
  Padding(std::string m) : mode(std::move(m)) {}                             // NOLINT
  Padding(std::initializer_list<int64_t> p) : mode("explicit"), pads(p) {}   // NOLINT
  static Padding explicit_pads(std::vector<int64_t> p) {
    Padding r("explicit");
    r.pads = std::move(p);
    return r;
  }
};

struct Conv2dOptions {
  std::vector<int64_t> strides{1, 1};    // {height, width}, each >= 1
  Padding padding;                       // default "valid"
  std::vector<int64_t> dilations{1, 1};  // {height, width}, each >= 1
  int64_t groups = 1;                    // in and out channels must both divide by it
  std::string data_format = "NHWC";      // "NHWC" or "NCHW"
};

// 2-d cross-correlation (what TensorFlow and PyTorch call convolution).
//   NHWC: x [N, H, W, C], w HWIO [KH, KW, C/groups, O] -> [N, OH, OW, O]
//   NCHW: x [N, C, H, W], w OIHW [O, C/groups, KH, KW] -> [N, O, OH, OW]
// Output channel o belongs to group o / (O/groups) and sees input channels
// [g*C/groups, (g+1)*C/groups). Depthwise convolution with channel multiplier m is
// groups = C with O = C*m (TensorFlow's depthwise filter [KH, KW, C, m] reshaped to
// [KH, KW, 1, C*m] is exactly this HWIO filter). `bias` (optional) has shape [O].
// f32 runs on oneDNN; f64 on a direct loop. Errors: rank != 4, channel/group
// mismatch, bad strides/dilations/padding/data_format, window larger than the
// padded input.
Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& opts = {}, const Tensor& bias = Tensor());

// Gradient of conv2d with respect to its input: given dy (conv2d's output shape)
// and the filter, returns dx of shape `input_shape`, i.e. the vector-Jacobian
// product (the adjoint: <conv2d(x, w), dy> == <x, conv2d_backward_data(dy, w)>).
// Also known as the transposed convolution. Errors as conv2d, plus dy's shape not
// matching conv2d's output shape for `input_shape`.
Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& input_shape,
                            const Conv2dOptions& opts = {});
// Gradient of conv2d with respect to its filter: returns dw of shape `filter_shape`
// (HWIO or OIHW by data_format). The bias gradient is dy summed over N, H, W.
Tensor conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& filter_shape,
                              const Conv2dOptions& opts = {});

// ---- pooling -----------------------------------------------------------------------

// Max / average over ksize = {kh, kw} windows moved by strides = {sh, sw}, per
// channel. Padding "valid", "same" (TensorFlow rule) or explicit (each pad smaller
// than the window). Max pooling ignores padded cells; average pooling divides by
// the number of real (unpadded) cells, as TensorFlow does. x is rank 4 in
// data_format; the result keeps the layout.
Tensor max_pool2d(const Tensor& x, const std::vector<int64_t>& ksize, const std::vector<int64_t>& strides,
                  const Padding& padding = "valid", const std::string& data_format = "NHWC");
Tensor avg_pool2d(const Tensor& x, const std::vector<int64_t>& ksize, const std::vector<int64_t>& strides,
                  const Padding& padding = "valid", const std::string& data_format = "NHWC");
// Mean / max over H and W: [N, C], or with keepdims [N, 1, 1, C] (NHWC) /
// [N, C, 1, 1] (NCHW). The max of an empty (H*W == 0) window is -inf, the mean NaN.
Tensor global_avg_pool2d(const Tensor& x, const std::string& data_format = "NHWC", bool keepdims = false);
Tensor global_max_pool2d(const Tensor& x, const std::string& data_format = "NHWC", bool keepdims = false);

// ---- normalisation -----------------------------------------------------------------

// Batch normalisation with given statistics, per channel along `axis` (-1 for
// channels-last, 1 for NCHW): y = (x - mean) / sqrt(var + eps) * gamma + beta.
// mean, var, gamma, beta have shape [C]; gamma/beta may be undefined (1 and 0).
// Errors: parameter shapes, eps < 0, axis out of range.
Tensor batch_norm_inference(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& gamma,
                            const Tensor& beta, double eps = 1e-5, int64_t axis = -1);

struct BatchNormTrainingResult {
  Tensor y;     // normalised with the batch statistics
  Tensor mean;  // [C] batch mean
  Tensor var;   // [C] biased batch variance (divided by the count, not count - 1)
};
// Batch normalisation with the statistics of the batch: mean and variance of x over
// every axis but `axis`. Running averages are the caller's business (PyTorch/Keras
// update them with the unbiased variance var * n / (n - 1)).
BatchNormTrainingResult batch_norm_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                            double eps = 1e-5, int64_t axis = -1);

// Normalises over the trailing dims from `begin_axis` (PyTorch's normalized_shape
// = x.shape[begin_axis:]): y = (x - mean) / sqrt(var + eps) * gamma + beta, with
// the biased variance. gamma and beta have shape x.shape[begin_axis:] (or are
// undefined: 1 and 0).
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5,
                  int64_t begin_axis = -1);
// Root-mean-square normalisation over the last axis: y = x / sqrt(mean(x^2) + eps)
// * gamma, gamma of shape [x.shape[-1]] or undefined (1).
Tensor rms_norm(const Tensor& x, const Tensor& gamma, double eps = 1e-6);

// ---- dropout, embedding ------------------------------------------------------------

// Inverted dropout: each element is zeroed with probability `rate` and the kept
// ones are scaled by 1 / (1 - rate). Element i is kept iff the i-th 32-bit word of
// Philox4x32-10 under key `seed` (block i / 4, word i % 4), as a uniform in [0, 1)
// with 24 bits, is >= rate: the result depends only on seed, rate and shape, never
// on the thread count, and the gradient is dropout(dy, rate, seed) (same mask).
// rate == 0 or training == false returns x itself. Errors: rate outside [0, 1).
Tensor dropout(const Tensor& x, double rate, uint64_t seed, bool training = true);

// Row lookup: table [V, ...] (any dtype), ids of any shape (i32 or i64) ->
// ids.shape + table.shape[1:]. Errors: table rank 0, ids not integer,
// OutOfRangeError naming the first id outside [0, V) and V.
Tensor embedding(const Tensor& table, const Tensor& ids);

// ---- attention ---------------------------------------------------------------------

// softmax(q @ k^T * scale + mask) @ v, one fused kernel (no [.., Lq, Lk] tensor is
// materialised beyond a cache-sized tile per thread).
//   q [..., Lq, d], k [..., Lk, d], v [..., Lk, dv] -> [..., Lq, dv]
// The leading (batch, head) dims broadcast together (so k/v with a head dim of 1
// serve multi-query attention). scale defaults to 1/sqrt(d).
// mask (optional) broadcasts to [..., Lq, Lk]: bool means "may attend" (true
// keeps, false masks out; integer masks are read as bool, nonzero keeps), a
// floating mask is added to the scores (use -inf to mask out).
// causal: query i attends to keys j <= i (top-left aligned, the convention of
// PyTorch's is_causal and of Keras' use_causal_mask, also when Lq != Lk). For
// decoding with a KV cache (queries at the end), pass an explicit mask instead.
// A query row with every key masked out gives a zero output row (not NaN).
// Errors: rank < 2, d or Lk mismatch, batch dims not broadcastable, mask shape
// or dtype.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor(),
                                    bool causal = false, std::optional<double> scale = std::nullopt);

// Attention over a paged KV cache (vLLM's PagedAttention, the language-model runtime's
// tensor path): every sequence's keys and values live in fixed-size blocks of one pool,
// listed by its block table, and each query reads its own sequence's positions in place.
//   q            [T, H, d]        f32, f16 or bf16
//   k_cache      [N, B, Hkv, d]   f32, f16 or bf16: N blocks of B positions
//   v_cache      k_cache's shape and dtype
//   block_tables i32 [S, M]: block_tables[s][j] holds positions j*B .. j*B + B-1 of sequence s
//   seq_ids      i32 [T]: the sequence (row of block_tables) of query t
//   positions    i32 [T]: query t attends to positions 0 .. positions[t] of its sequence
//                (window > 0: only the last `window` of them, positions[t] - window + 1
//                on: sliding-window attention)
// -> [T, H, d] in q's dtype: softmax over those positions of scale * q.k (softcap > 0:
// of softcap * tanh(scale * q.k / softcap), Gemma 2's capped scores), times v; query
// head h reads KV head h / (H / Hkv) (grouped-query attention); sums in f32. scale
// defaults to 1/sqrt(d). Not differentiable. Errors: ranks, shapes, dtypes, H not a
// multiple of Hkv, a negative window or softcap (InvalidArgumentError); on the CPU a sequence id, a position past M*B
// or a block id outside the pool (OutOfRangeError; on CUDA they are the caller's
// contract, not checked).
Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                       const Tensor& seq_ids, const Tensor& positions, std::optional<double> scale = std::nullopt,
                       int64_t window = 0, double softcap = 0);

// ---- int8 inference (post-training quantisation) ------------------------------------
//
// Activations are quantised per tensor to u8 with a zero point, weights per output
// channel to i8 (symmetric, an f32 scale per channel). These ops take no part in the
// dtype rules above: every input must have exactly the documented dtype (no
// promotion), and none is differentiable. Errors (InvalidArgumentError): wrong dtypes
// or shapes, a scale that is not a finite number > 0 (also once rounded to f32), a
// zero point outside [0, 255], an unknown activation.
//
// Speed on CPUs without VNNI (AVX2 only): the u8 x i8 kernels (oneDNN) multiply with
// vpmaddubsw, whose 16-bit pair sums saturate. The kernels stay exact by checking,
// per call, max(xq) * 2 * max|w_q| <= 32767; when that fails they run on the split
// w_q = floor(w_q / 2) + ceil(w_q / 2) at twice the work. So either quantise weights
// to 7 bits (|w_q| <= 64) or keep quantised activations <= 129 (e.g. a u8 range of
// [0, 127] as PyTorch's reduce_range) to stay on the fast path. CPUs with AVX-512
// VNNI have no such limit.

// u8 quantisation: clamp(round_half_even(x / scale) + zero_point, 0, 255), NaN -> 0.
// x must be f32; scale > 0, zero_point in [0, 255].
Tensor quantize_per_tensor(const Tensor& x, double scale, int64_t zero_point);
// (q - zero_point) * scale as f32; q must be u8.
Tensor dequantize_per_tensor(const Tensor& q, double scale, int64_t zero_point);

// act(dequantize(quantize(x)) @ (w_q * w_scale) + bias), computed as an exact int32
// u8 x i8 matmul scaled per output channel:
//   xq = quantize_per_tensor(x, x_scale, x_zero_point)
//   y[m, n] = act(x_scale * w_scale[n] * sum_k (xq[m, k] - x_zero_point) * w_q[k, n] + bias[n])
// x f32 [M, K], w_q i8 [K, N], w_scale f32 [N], bias f32 [N] (optional) -> f32 [M, N].
// x may also be u8, already quantised with (x_scale, x_zero_point): the output of a
// graph node with the op's y_scale/y_zero_point attrs, which requantise its result to
// u8 (kiln convert chains int8 layers this way; this function always returns f32).
// activation "none" or "relu". K is at most 65793 (int32 accumulators).
Tensor qlinear_matmul(const Tensor& x, double x_scale, int64_t x_zero_point, const Tensor& w_q, const Tensor& w_scale,
                      const Tensor& bias = Tensor(), const std::string& activation = "none");

// The convolution counterpart: act(conv2d(dequantize(quantize(x)), w_q * w_scale) + bias)
// with conv2d's options (strides, padding, dilations, groups), NHWC only:
// x f32 [N, H, W, C], w_q i8 HWIO [KH, KW, C/groups, O], w_scale f32 [O], bias f32 [O]
// (optional) -> f32 [N, OH, OW, O]. Padding is real zero (it contributes nothing,
// whatever the zero point). data_format "NCHW" is an UnimplementedError.
Tensor qlinear_conv2d(const Tensor& x, double x_scale, int64_t x_zero_point, const Tensor& w_q, const Tensor& w_scale,
                      const Conv2dOptions& opts = {}, const Tensor& bias = Tensor(),
                      const std::string& activation = "none");

}  // namespace kiln::ops
