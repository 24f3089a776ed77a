#pragma once
// Winograd F(2x2, 3x3) for the direct convolution's 3x3 problems (internal: called by
// direct_conv.cc, whose API decides; see direct_conv::uses_winograd). Y = A^T [U . V] A
// per 2x2 output tile, U = G g G^T the filter transformed once, V = B^T d B the 4x4
// input tile: 16 multiplies per tile and channel pair where the direct loop does 36
// (Lavin & Gray 2016). The 16 per-position sums over channels run on the direct
// kernel's 6x16 register tile (direct_conv_tiles.h); the filter gradient sums
// (B^T d B) . (A dY A^T) over tiles on its filter-gradient tile, then dw = G^T dU G.
// Only in AVX2 + FMA builds.
#include <cstdint>

#include "direct_conv.h"

namespace kiln::cpu::winograd {

// 3x3 filter, c a multiple of 8, o of 16, p.allow_winograd, KILN_WINOGRAD not "0" (the
// rest, padding and sizes, is direct_conv's check).
bool applies(const direct_conv::Problem& p);
// HWIO [3, 3, c, o] -> U [16][o/16][c][16] (direct_conv::packed_size floats).
void pack_filter(const direct_conv::Problem& p, const float* hwio, float* u);
// y[n, oh, ow, o] = relu?(conv(x, filter) + bias), bias non-null.
void run(const direct_conv::Problem& p, const float* x, const float* u, const float* bias, float* y, bool relu);
// dw [3, 3, c, o] (HWIO) of conv(x, w) given dy [n, oh, ow, o].
void backward_filter(const direct_conv::Problem& p, const float* x, const float* dy, float* dw);

}  // namespace kiln::cpu::winograd
