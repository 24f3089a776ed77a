#pragma once
// An f32 GEMM over a B packed in 16-column panels: C[M, N] = relu?(op(A) @ B +
// bias), op(A) = A or A^T, for the dense layers of the mlp and the cnn at batch
// 32-128 (inference against a constant B, whose packing a graph node keeps) and
// the products of their training steps.
//
// B [K, N] (or [N, K] when trans_b) is packed into ceil(N/16) panels of [K][16]
// floats, zero-padded past N: every k of a panel is one 64-byte line. A 6x16
// register tile (12 AVX accumulators, named: GCC 12 spills an array of them in
// a runtime loop) runs over K blocks of at most 512, so a block of a panel (32
// KiB) stays close while every row group of A passes over it. Threads take
// contiguous ranges of panels (the same on every call, so a core finds its
// share of a constant B in its own L2), or ranges of row groups when there are
// fewer panels than threads. Bias and ReLU are applied in the last block's
// store; a partial last panel is stored through a mask.
//
// Measured against oneDNN 2.6's sgemm (bench_ops packed_gemm/<kiln|peer>/...,
// 2-core VM, random-interleaved repetitions; docs/benchmarks.md, session 13):
// 1.1-1.2x on 64x784x256, 64x256x128, 32x3136x128, 128x784x256 and the weight
// gradients 784x32x256, 784x128x256, 3136x32x128 (A transposed); level at 2048 rows.
//
// On a CPU with AVX-512 (kiln/core/cpu_isa.h) the same panels run through a 6x64 tile
// of zmm registers (packed_gemm_avx512.cc); KILN_CPU_ISA=avx2 keeps the 6x16 AVX2 tile.
// The packed_gemm kernel preference (kiln/core/flags.h) turns it off. Compiled only with
// AVX2 and FMA; otherwise available() is false.
#include <cstddef>
#include <cstdint>

namespace kiln::cpu::packed_gemm {

// Whether the kernel is compiled in and not switched off.
bool available();

// Floats of the packed B.
size_t packed_size(int64_t K, int64_t N);

// B [K, N] (or [N, K] when trans_b) -> the kernel's panels; parallel.
void pack(const float* b, int64_t K, int64_t N, bool trans_b, float* packed);

// c[M, N] = relu?(op(a) @ B + bias) with op(a) = a [M, K] or, when trans_a, the
// transpose of a [K, M]; bias [N] may be null; a, c row-major and dense.
void run(const float* a, bool trans_a, int64_t M, int64_t K, int64_t N, const float* packed, const float* bias,
         bool relu, float* c);

namespace detail {
// The AVX-512 tiles (packed_gemm_avx512.cc), chosen by run() when cpu_has(kAvx512):
// rows [r0, r1) x panels [p0, p1) of c, in row groups of kAvx512Rows and groups of
// kAvx512Panels panels.
inline constexpr int64_t kAvx512Rows = 6;
inline constexpr int64_t kAvx512Panels = 4;
void panels_avx512(bool trans_a, const float* a, int64_t M, int64_t K, int64_t N, const float* packed,
                   const float* bias, bool relu, float* c, int64_t p0, int64_t p1, int64_t r0, int64_t r1);
}  // namespace detail

}  // namespace kiln::cpu::packed_gemm
