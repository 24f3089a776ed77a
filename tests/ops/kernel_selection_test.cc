// The CPU kernels' algorithm selection per op family (src/backends/cpu/kernel_selection.h):
// each route a matmul or a convolution can take, the graph constants that enable the
// packed ones, and the kernel preferences and CPU checks that turn them off.
#include "backends/cpu/kernel_selection.h"

#include <string>

#include "backends/cpu/packed_gemm.h"
#include "backends/cpu/small_gemm.h"
#include "kiln/core/attrs.h"
#include "kiln/core/flags.h"
#include "kiln/core/shape.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using cpu::ConvAlgo;
using cpu::MatmulAlgo;
using cpu::MatmulProblem;

MatmulProblem mm(int64_t batch, int64_t M, int64_t K, int64_t N, bool constant_b, bool fused = false) {
  MatmulProblem p;
  p.batch = batch, p.M = M, p.K = K, p.N = N, p.constant_b = constant_b, p.fused = fused;
  return p;
}

TEST(MatmulSelection, EmptyOutputsAndEmptySums) {
  EXPECT_EQ(cpu::select_matmul(mm(1, 0, 8, 8, true)), MatmulAlgo::kNothing);
  EXPECT_EQ(cpu::select_matmul(mm(0, 4, 8, 8, true)), MatmulAlgo::kNothing);
  EXPECT_EQ(cpu::select_matmul(mm(1, 4, 8, 0, false)), MatmulAlgo::kNothing);
  EXPECT_EQ(cpu::select_matmul(mm(1, 4, 0, 8, false)), MatmulAlgo::kZeros);
  EXPECT_EQ(cpu::select_matmul(mm(1, 4, 0, 8, true, true)), MatmulAlgo::kZeros);
}

TEST(MatmulSelection, AConstantBIsPackedForFewRowsAndOnlyThen) {
  const bool small = cpu::small_gemm::supports(1, 256, 256), packed = cpu::packed_gemm::available();
  // One row against a 256x256 constant: the few-row kernel, else the 6x16 one, else oneDNN.
  EXPECT_EQ(cpu::select_matmul(mm(1, 1, 256, 256, true)),
            small ? MatmulAlgo::kSmallGemm : packed ? MatmulAlgo::kPackedGemm : MatmulAlgo::kOneDnn);
  {
    ScopedKernelPreferences off([](KernelPreferences& k) { k.small_gemm = false; });
    EXPECT_EQ(cpu::select_matmul(mm(1, 1, 256, 256, true)), packed ? MatmulAlgo::kPackedGemm : MatmulAlgo::kOneDnn);
  }
  {
    ScopedKernelPreferences off([](KernelPreferences& k) {
      k.small_gemm = false;
      k.packed_gemm = false;
    });
    EXPECT_EQ(cpu::select_matmul(mm(1, 1, 256, 256, true)), MatmulAlgo::kOneDnn);
  }
  // 512 rows (A's batch dims count as rows) still pack; 513 do not (B 24x200 is not tiny).
  EXPECT_EQ(cpu::select_matmul(mm(8, 64, 24, 200, true)), packed ? MatmulAlgo::kPackedGemm : MatmulAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_matmul(mm(1, cpu::kPackedGemmMaxRows + 1, 24, 200, true)), MatmulAlgo::kOneDnn);
  // A B that changes from run to run, a transposed A or a batched B is never packed once.
  EXPECT_EQ(cpu::select_matmul(mm(1, 1, 256, 256, false)), MatmulAlgo::kOneDnn);
  MatmulProblem t = mm(1, 1, 256, 256, true);
  t.trans_a = true;
  EXPECT_EQ(cpu::select_matmul(t), MatmulAlgo::kOneDnn);
  MatmulProblem batched_b = mm(4, 1, 256, 256, true);
  batched_b.b_rank = 3;
  EXPECT_EQ(cpu::select_matmul(batched_b), MatmulAlgo::kOneDnn);
  // A transposed B packs transposed: still the packed route.
  MatmulProblem tb = mm(1, 16, 256, 256, true);
  tb.trans_b = true;
  EXPECT_EQ(cpu::select_matmul(tb), packed ? MatmulAlgo::kPackedGemm : MatmulAlgo::kOneDnn);
}

TEST(MatmulSelection, DenseWeightGradients) {
  const bool packed = cpu::packed_gemm::available();
  MatmulProblem g = mm(1, 256, 128, 10, false);  // x^T [256, 128] @ dy [128, 10]
  g.trans_a = true;
  EXPECT_EQ(cpu::select_matmul(g), packed ? MatmulAlgo::kWeightGradient : MatmulAlgo::kOneDnn);
  g.K = cpu::kWeightGradientMaxK + 1;  // a batch too large to pack dY per call
  EXPECT_EQ(cpu::select_matmul(g), MatmulAlgo::kOneDnn);
  g.K = 128;
  g.M = cpu::kWeightGradientMinM - 1;
  EXPECT_EQ(cpu::select_matmul(g), MatmulAlgo::kOneDnn);
  ScopedKernelPreferences off([](KernelPreferences& k) { k.packed_gemm = false; });
  g.M = 256;
  EXPECT_EQ(cpu::select_matmul(g), MatmulAlgo::kOneDnn);
}

TEST(MatmulSelection, FusedBiasAndReluOnFewRowsRunInALoop) {
  EXPECT_EQ(cpu::select_matmul(mm(1, cpu::kFusedPostOpsMinRows - 1, 256, 256, false, true)),
            MatmulAlgo::kOneDnnThenBias);
  EXPECT_EQ(cpu::select_matmul(mm(1, cpu::kFusedPostOpsMinRows, 256, 256, false, true)), MatmulAlgo::kOneDnn);
  MatmulProblem g = mm(1, 256, 128, 10, false, true);
  g.trans_a = true;  // fused ops are never weight gradients
  EXPECT_NE(cpu::select_matmul(g), MatmulAlgo::kWeightGradient);
}

nn_geometry::Conv2dGeometry conv(Shape x, Shape f, const std::string& format = "NHWC", int64_t stride = 1,
                                 int64_t groups = 1) {
  Attrs a;
  a.set("padding", std::string("same"));
  a.set("data_format", format);
  a.set("strides", std::vector<int64_t>{stride, stride});
  a.set("groups", groups);
  return nn_geometry::conv2d_geometry("conv2d", x, f, a);
}

TEST(ConvSelection, DirectKernelsForUnitStrideNhwcAndWinogradWhereItPays) {
  ScopedKernelPreferences tile([](KernelPreferences& k) { k.direct_conv = DirectConv::kForceTile; });
  cpu::direct_conv::Problem dp;
  const auto small = conv({1, 6, 6, 8}, {3, 3, 8, 16});
  ASSERT_EQ(cpu::select_conv_forward(small, /*constant_filter=*/true, &dp), ConvAlgo::kDirect);
  EXPECT_EQ(dp.n, 1);
  EXPECT_EQ(dp.o, 16);
  EXPECT_EQ(dp.pt, 1);
  EXPECT_TRUE(dp.allow_winograd);  // a constant filter is transformed once
  ASSERT_EQ(cpu::select_conv_forward(small, false, &dp), ConvAlgo::kDirect);
  EXPECT_FALSE(dp.allow_winograd);  // eager, 36 output pixels: the transform would not pay
  const auto large = conv({64, 28, 28, 8}, {3, 3, 8, 16});
  ASSERT_EQ(cpu::select_conv_forward(large, false, &dp), ConvAlgo::kDirect);
  EXPECT_TRUE(dp.allow_winograd);  // >= kEagerWinogradPixels output pixels
  EXPECT_EQ(cpu::select_conv_backward_filter(small, &dp), ConvAlgo::kDirect);
}

TEST(ConvSelection, OneDnnForWhatTheDirectKernelsLack) {
  cpu::direct_conv::Problem dp;
  ScopedKernelPreferences tile([](KernelPreferences& k) { k.direct_conv = DirectConv::kForceTile; });
  EXPECT_EQ(cpu::select_conv_forward(conv({1, 8, 6, 6}, {16, 8, 3, 3}, "NCHW"), true, &dp), ConvAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_conv_forward(conv({1, 6, 6, 8}, {3, 3, 8, 16}, "NHWC", 2), true, &dp), ConvAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_conv_forward(conv({1, 6, 6, 8}, {3, 3, 4, 16}, "NHWC", 1, 2), true, &dp), ConvAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_conv_backward_data(conv({1, 6, 6, 8}, {3, 3, 8, 16}, "NHWC", 2), &dp), ConvAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_conv_backward_filter(conv({1, 8, 6, 6}, {16, 8, 3, 3}, "NCHW"), &dp), ConvAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_conv_forward(conv({0, 6, 6, 8}, {3, 3, 8, 16}), true, &dp), ConvAlgo::kNothing);
  ScopedKernelPreferences off([](KernelPreferences& k) { k.direct_conv = DirectConv::kOff; });
  EXPECT_EQ(cpu::select_conv_forward(conv({1, 6, 6, 8}, {3, 3, 8, 16}), true, &dp), ConvAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_conv_backward_data(conv({1, 6, 6, 8}, {3, 3, 8, 16}), &dp), ConvAlgo::kOneDnn);
  EXPECT_EQ(cpu::select_conv_backward_filter(conv({1, 6, 6, 8}, {3, 3, 8, 16}), &dp), ConvAlgo::kOneDnn);
}

TEST(KernelSelection, AlgorithmsHaveNames) {
  EXPECT_STREQ(cpu::algo_name(MatmulAlgo::kPackedGemm), "packed_gemm");
  EXPECT_STREQ(cpu::algo_name(ConvAlgo::kDirect), "direct");
}

}  // namespace
}  // namespace kiln::testing
