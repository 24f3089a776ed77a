// CPU kernel of fused_conv2d_backward_filter (kiln/ops/fused.h): the filter gradient,
// and with bias_grad the bias gradient, of a convolution whose (ReLU'd) output went
// through a 2x2 stride-2 max pool, from the pool's output gradient dp, without
// writing the pool's input gradient dy to memory. Each task takes bands of pooled
// rows of one image, writes their dy (two convolution rows per pooled row) into a
// per-thread scratch of at most 64 KB with the pool backward's row kernel
// (pool_2x2.h), and adds the direct convolution's filter gradient of those rows to
// its part of dw (direct_conv::backward_filter_rows). The unfused pair writes dy and
// reads it back: on the cnn's first layer [N, 28, 28, 32] f32, 3.2 MB at batch 32.
//
// Fast path: f32 NHWC, stride 1, no dilation, one group, output channels a multiple
// of 16, an even convolution output, the direct kernel's filter gradient (not a
// Winograd one: a layer where Winograd applies keeps its faster gradient, unfused).
// Everything else runs backends::fused_conv2d_backward_filter_unfused. With attr pool_mask
// the rows come from the pool's mask instead of y (1 byte per pooled value read, not 16).
#include <algorithm>
#include <vector>

#include "direct_conv.h"
#include "kiln/core/kernel.h"
#include "kiln/core/parallel.h"
#include "../common/composite_kernels.h"
#include "nn_kernel_util.h"
#include "pool_2x2.h"

namespace kiln::cpu {
namespace {

using nn_geometry::conv2d_geometry;
using nn_geometry::Conv2dGeometry;

#if defined(__AVX2__)
constexpr int64_t kScratchFloats = 16384;  // dy of one band: 64 KB, in L2 while the gradient reads it

bool pooled_problem(const Conv2dGeometry& g, direct_conv::Problem& p) {
  const auto& v = g.win;
  if (g.nchw || g.groups != 1 || v.sh != 1 || v.sw != 1 || v.dh != 1 || v.dw != 1 || v.oh % 2 != 0 || v.ow % 2 != 0 ||
      g.o % 8 != 0 || g.n * g.h * g.w * g.c == 0)
    return false;
  p.n = g.n, p.h = g.h, p.w = g.w, p.c = g.c, p.o = g.o;
  p.kh = v.kh, p.kw = v.kw, p.pt = v.pt, p.pb = v.pb, p.pl = v.pl, p.pr = v.pr;
  return p.oh() == v.oh && p.ow() == v.ow && direct_conv::supports_backward_filter(p) && !direct_conv::uses_winograd(p);
}
#endif

void fused_conv2d_backward_filter_f32(OpContext& ctx) {
#if defined(__AVX2__)
  const Conv2dGeometry g = conv2d_geometry("fused_conv2d_backward_filter", ctx.in[0].shape(),
                                           Shape(ctx.attrs.get_ints("filter_shape")), ctx.attrs);
  direct_conv::Problem p;
  if (!pooled_problem(g, p)) return backends::fused_conv2d_backward_filter_unfused(ctx);
  const float* x = static_cast<const float*>(ctx.in[0].raw_data());
  // Input 1: the pool's input y, or with attr pool_mask its mask (relu folded in).
  const bool with_mask = ctx.attrs.get_bool("pool_mask", false);
  const float* y = with_mask ? nullptr : static_cast<const float*>(ctx.in[1].raw_data());
  const uint8_t* mask = with_mask ? static_cast<const uint8_t*>(ctx.in[1].raw_data()) : nullptr;
  const float* dp = static_cast<const float*>(ctx.in[2].raw_data());
  float* dw = static_cast<float*>(ctx.out[0].raw_data());
  float* db = ctx.out.size() > 1 ? static_cast<float*>(ctx.out[1].raw_data()) : nullptr;
  const bool relu = ctx.attrs.get_bool("relu", false);
  const int64_t OH = g.win.oh, OW = g.win.ow, PH = OH / 2, PW = OW / 2, O = g.o;
  const int64_t wsize = ctx.out[0].numel(), stride = wsize + O;  // one part: dw, then db
  const int64_t units = g.n * PH;                                // (image, pooled row)
  const int64_t band = std::max<int64_t>(1, kScratchFloats / (2 * OW * O));
  const int64_t parts = onednn::runs_serial(g.n * OH * OW * wsize) ? 1 : std::min<int64_t>(num_threads(), units);
  // Each part sums into its own dw and db, added up in order at the end.
  thread_local std::vector<float> partial;
  partial.assign(size_t(parts * stride), 0.0f);
  float* parts_base = partial.data();  // (a pointer: pool threads see their own, empty thread_local)
  parallel_for(parts, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scratch;
    const int64_t need = std::min(band, PH) * 2 * OW * O + O;
    if (scratch.size() < size_t(need)) scratch.resize(size_t(need));
    float* dy = scratch.data();
    float* sums = dy + need - O;
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = parts_base + t * stride;
      for (int64_t u = units * t / parts, end = units * (t + 1) / parts; u < end;) {
        const int64_t n = u / PH, q0 = u % PH, q1 = std::min({PH, q0 + band, q0 + (end - u)});
        for (int64_t q = q0; q < q1; ++q) {
          float* d0 = dy + (q - q0) * 2 * OW * O;
          const float* dq = dp + (n * PH + q) * PW * O;
          if (mask) {
            mask_pool_backward_2x2_row(mask + (n * PH + q) * PW * O, dq, d0, d0 + OW * O, PW, O, db ? sums : nullptr);
          } else {
            const float* y0 = y + (n * OH + 2 * q) * OW * O;
            max_pool_backward_2x2_row(y0, y0 + OW * O, dq, d0, d0 + OW * O, PW, O, relu, db ? sums : nullptr);
          }
          if (db)
            for (int64_t c = 0; c < O; ++c) acc[wsize + c] += sums[c];
        }
        direct_conv::backward_filter_rows(p, x, n, 2 * q0, 2 * q1, dy, acc);
        u += q1 - q0;
      }
    }
  });
  std::copy_n(parts_base, wsize, dw);
  if (db) std::copy_n(parts_base + wsize, O, db);
  for (int64_t t = 1; t < parts; ++t) {
    const float* s = parts_base + t * stride;
    for (int64_t i = 0; i < wsize; ++i) dw[i] += s[i];
    for (int64_t c = 0; db && c < O; ++c) db[c] += s[wsize + c];
  }
#else
  backends::fused_conv2d_backward_filter_unfused(ctx);
#endif
}

}  // namespace

KILN_REGISTER_KERNEL("fused_conv2d_backward_filter", kCPU, DType::kF32, fused_conv2d_backward_filter_f32);

}  // namespace kiln::cpu
