#pragma once
// A small-M f32 GEMM against a constant, pre-packed B: C[M, N] = relu?(A[M, K]
// @ B + bias) for the batch-1..8 rows of inference (a served request, a few
// batched ones), where oneDNN 2.6's matmul is bound by its own overhead and by
// reading B through the caches once per call from wherever it lies.
//
// B is packed once (a graph constant; src/backends/cpu/matmul_kernels.cc keeps
// it in the node's prepared kernel) into panels of 64 columns, [N/64][K][64],
// zero-padded: each panel is one contiguous stream. Panels are split over
// kiln's pool in contiguous ranges that are the same on every call, so a core
// reads the same part of B every time and, when its share fits there, finds it
// in its own L2 (the mlp's 784x256 layer: 400 KB a core on the 2-core VM). Rows
// go in groups of 4, 2 and 1, each over 16, 32 and 64 columns of a panel at a
// time (8 AVX accumulators), so every cache line of a panel is loaded once per
// row group; bias and ReLU are applied in the store.
//
// Measured against oneDNN's matmul with bias+ReLU post-ops (2-core VM, warm B,
// medians; docs/benchmarks.md, session 12): the kernel alone at M=1 784x256
// 2.0-2.3x, 256x128 2.6-3.8x, 128x10 4x, 3136x128 1.1-1.6x; M=4 on the 1.6 MB
// 3136x128 B level and M=8-32 slower, hence supports(). A traced 784x256 layer
// (bench_ops dense_784x256): 1-2 rows 1.6-1.7x, 4-8 rows 1.1x.
//
// KILN_SMALL_GEMM=0 turns it off (oneDNN then runs every matmul), read per
// call. Compiled only with AVX2 and FMA; otherwise supports() is false.
#include <cstddef>
#include <cstdint>

namespace kiln::cpu::small_gemm {

// Whether run() handles an M x K x N product and pays off: M <= 3, or M <= 8
// when B is at most 1 MiB (more rows re-stream a B that no longer stays in the
// L2 caches), or any M when B is at most 4096 floats (it stays in L1: a
// classifier's last layer, where oneDNN's call overhead is most of the time; the
// rows are then split over the threads).
bool supports(int64_t M, int64_t K, int64_t N);

// Floats of the packed B.
size_t packed_size(int64_t K, int64_t N);

// B [K, N] (or [N, K] when trans_b) -> the kernel's panels.
void pack(const float* b, int64_t K, int64_t N, bool trans_b, float* packed);

// c[M, N] = relu?(a[M, K] @ B + bias); bias [N] may be null. a and c row-major,
// dense.
void run(const float* a, int64_t M, int64_t K, int64_t N, const float* packed, const float* bias, bool relu, float* c);

}  // namespace kiln::cpu::small_gemm
