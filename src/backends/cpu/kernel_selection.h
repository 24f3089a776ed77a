#pragma once
// How the CPU kernels of an op family choose their algorithm: one function per family,
// called by the family's prepare step (kiln/core/kernel.h) once per graph node and
// input shapes (an eager call: once per call). Pure functions of the problem, the
// graph's constants and the CPU (the kernels' own availability checks), unit-tested in
// tests/ops/kernel_selection_test.cc.
#include <cstdint>

#include "../common/nn_geometry.h"
#include "direct_conv.h"

namespace kiln::cpu {

// ---- f32 matmul and fused_matmul (matmul_kernels.cc) ----
enum class MatmulAlgo : uint8_t {
  kNothing,         // an empty output
  kZeros,           // K == 0: zeros (plus the bias when fused)
  kSmallGemm,       // a constant B packed once for the few-row kernel (small_gemm.h)
  kPackedGemm,      // a constant B packed once for the 6x16 kernel (packed_gemm.h)
  kWeightGradient,  // op(A)^T @ dY of a dense layer: the small dY packed per call (packed_gemm.h)
  kOneDnnThenBias,  // fused with few rows: oneDNN's plain GEMM, then the bias (and ReLU) in a loop
  kOneDnn,          // oneDNN (bias and ReLU as post-ops when fused)
};
struct MatmulProblem {
  int64_t batch = 1, M = 0, K = 0, N = 0;  // batch: output matrices (A's batch dims)
  bool trans_a = false, trans_b = false;
  int a_rank = 2, b_rank = 2;
  bool constant_b = false;  // B's data is fixed for the prepared kernel's life (a graph constant)
  bool fused = false;       // fused_matmul: a bias, maybe a ReLU
};
// A packed constant B beats oneDNN up to this many rows (docs/benchmarks.md).
constexpr int64_t kPackedGemmMaxRows = 512;
// The weight-gradient kernel: a batch of up to this many rows (measured 1.1-1.2x oneDNN
// on the mlp's and the cnn's weight gradients), at least kWeightGradientMinM outputs rows.
constexpr int64_t kWeightGradientMaxK = 256;
constexpr int64_t kWeightGradientMinM = 64;
// fused_matmul under this many rows adds bias and ReLU in its own loop: oneDNN's
// post-processing costs more there (batch-1 MLP layers 10% slower fused).
constexpr int64_t kFusedPostOpsMinRows = 32;
MatmulAlgo select_matmul(const MatmulProblem& p);
const char* algo_name(MatmulAlgo a);

// ---- f32 conv2d, fused_conv2d and their gradients (conv_kernels.cc) ----
enum class ConvAlgo : uint8_t {
  kNothing,  // an empty output
  kDirect,   // kiln's NHWC kernels (direct_conv.h; Winograd where dp->allow_winograd and it applies)
  kOneDnn,   // oneDNN's primitives, filter in the layout they choose
};
// Winograd transforms the filter: free when a graph keeps it (a constant), on every
// call otherwise, where a few images do not pay for it (measured, eager, the cnn's
// 14x14 layer against the direct tiles: batch 1 0.8x, batch 8 (1568 pixels) 1.06-1.3x,
// batch 64 1.4-1.6x): eager calls use it from this many output pixels (n * oh * ow).
constexpr int64_t kEagerWinogradPixels = 1024;
// Forward (and fused) convolution. `dp` receives the direct kernel's problem when kDirect.
ConvAlgo select_conv_forward(const nn_geometry::Conv2dGeometry& g, bool constant_filter, direct_conv::Problem* dp);
// The gradients (never kNothing: their kernels handle empty tensors). W.r.t. the input:
// `dp` receives the forward problem (its backward_data_problem runs).
ConvAlgo select_conv_backward_data(const nn_geometry::Conv2dGeometry& g, direct_conv::Problem* dp);
// W.r.t. the filter: `dp` receives the forward problem.
ConvAlgo select_conv_backward_filter(const nn_geometry::Conv2dGeometry& g, direct_conv::Problem* dp);
const char* algo_name(ConvAlgo a);

}  // namespace kiln::cpu
