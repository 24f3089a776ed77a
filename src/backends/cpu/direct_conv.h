#pragma once
// A direct f32 NHWC convolution for the shapes of typical CNN layers: stride 1,
// no dilation, one group, output channels a multiple of 16 and at least 8 input
// channels, or fewer with kw * c <= 9 taps (first layers on grey or RGB images: a
// tile with the taps known at compile time); the filter gradient takes any. 3x3
// layers with c a multiple of 8 run Winograd F(2x2, 3x3) instead (uses_winograd()).
// It replaces oneDNN 2.6's jit:avx2 kernel
// for those shapes (forward; backward data, the same convolution with the filter
// flipped and transposed; the filter gradient): that kernel runs at 65-75% of the
// FMA peak on AVX2. On the cnn's 3x3 32->64 layer at batch 64-128 this one is
// 1.33-1.36x faster forward, 1.46-1.58x for the filter gradient and 1.0-1.2x for
// backward data; at batch 1 it is level forward and slower for backward data when
// the filter is packed on every call, as eager calls do (graphs pack a constant
// filter once) (docs/benchmarks.md, "Direct convolution").
//
// How: each thread copies the input rows it needs into a zero-padded buffer (so
// the inner loop has no bounds checks), then computes tiles of up to 6 output
// pixels x 16 output channels in 12 AVX registers, for every (kh, kw, input
// channel) one 16-channel filter row load and one broadcast per pixel. The
// filter is packed as [o/16][kh][kw][c][16]. Work is split over (image, output
// row) pairs on kiln's pool.
//
// KILN_DIRECT_CONV=0 turns it off (oneDNN then runs every convolution), read
// per call; =1 makes the ops take the general tile where oneDNN runs AVX-512
// (uses_general_tile). Compiled only with AVX2 and FMA (the default x86-64-v3
// build); otherwise supports() is false.
#include <cstddef>
#include <cstdint>

namespace kiln::cpu::direct_conv {

struct Problem {
  int64_t n = 0, h = 0, w = 0, c = 0;      // input, NHWC
  int64_t o = 0;                           // output channels
  int64_t kh = 1, kw = 1;                  // filter size
  int64_t pt = 0, pb = 0, pl = 0, pr = 0;  // zero padding
  bool allow_winograd = true;              // false: the direct tiles even where Winograd applies
  int64_t oh() const { return h + pt + pb - kh + 1; }
  int64_t ow() const { return w + pl + pr - kw + 1; }
};

// Whether run() handles `p` (and the kernel is compiled in and not turned off).
bool supports(const Problem& p);

// Whether run() takes the Winograd F(2x2, 3x3) path for `p` (3x3 filters, c a multiple
// of 8, p.allow_winograd, KILN_WINOGRAD not 0): 16 multiplies per 2x2 output tile and
// channel pair instead of 36, the filter transformed by pack_filter (so a filter packed
// under one answer must not be run under the other). Measured on the cnn's 3x3 32->64
// layer at batch 64-128 (docs/benchmarks.md, session 12): forward 1.6x, backward data
// 1.6x and the filter gradient 1.4x the direct tiles; errors stay within the direct
// kernel's test tolerance against f64 loops. Code: winograd_conv.h.
bool uses_winograd(const Problem& p);

// Whether run() takes the general 6x16 tile for `p`: neither Winograd nor the
// small-channel tile. The conv ops leave those forward and backward-data problems to
// oneDNN where oneDNN runs AVX-512 (onednn::runs_avx512()) and KILN_DIRECT_CONV is
// not 1: on such a CPU (a Zen 4 here) oneDNN's direct convolution reaches the FMA
// peak and the tile does not (3x3 32->64, batch 1-64: forward 0.5-0.9x, backward data
// 0.45-0.85x oneDNN), while Winograd (1.0-1.6x at batch 8-128), the small-channel tile
// (1.6x) and the filter gradient's tiles (level) still hold (docs/benchmarks.md,
// session 18).
bool uses_general_tile(const Problem& p);
// KILN_DIRECT_CONV=1: the ops keep the general tile even where oneDNN runs AVX-512.
bool general_tile_forced();

// Floats of a packed filter for `p`.
size_t packed_size(const Problem& p);

// HWIO filter [kh, kw, c, o] -> the kernel's layout.
void pack_filter(const Problem& p, const float* hwio, float* packed);

// The input gradient of `fwd` as a forward problem over dy [n, oh, ow, o]
// giving dx [n, h, w, c]; its filter comes from the forward HWIO filter by
// pack_filter_backward (packed_size(backward_data_problem(fwd)) floats). Check supports()
// on the returned problem.
Problem backward_data_problem(const Problem& fwd);
void pack_filter_backward(const Problem& fwd, const float* hwio, float* packed);

// The filter gradient: dw [kh, kw, c, o] (HWIO) of conv(x, w) given dy [n, oh, ow, o].
// Any c >= 1 (the first layer's c = 1 too); o a multiple of 16. Winograd too where
// uses_winograd(p) (dU = sum over tiles of (B^T d B) . (A dY A^T), dw = G^T dU G).
bool supports_backward_filter(const Problem& p);
void backward_filter(const Problem& p, const float* x, const float* dy, float* dw);

// Adds the filter gradient of output rows [r0, r1) of image n to dw (the direct tiles,
// never Winograd), with dy_rows holding just those rows of dy, [r1 - r0, ow, o]: for a
// caller that makes dy a band at a time (fused_conv2d_backward_filter). Same
// conditions as backward_filter; runs on the calling thread.
void backward_filter_rows(const Problem& p, const float* x, int64_t n, int64_t r0, int64_t r1, const float* dy_rows,
                          float* dw);

// y[n, oh, ow, o] = relu?(conv(x, filter) + bias); bias may be null.
void run(const Problem& p, const float* x, const float* packed, const float* bias, float* y, bool relu);

}  // namespace kiln::cpu::direct_conv
