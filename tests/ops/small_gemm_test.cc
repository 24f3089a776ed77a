// The small-M GEMM against a packed B (src/backends/cpu/small_gemm.h) against
// kiln's f64 matmul loop: every row-group path (4, 2, 1 rows and their mixes),
// full and partial 64-column panels, B transposed or not, bias and ReLU; the
// shapes it declines; and graphs whose matmuls take it (a constant B) agreeing
// with eager calls.
#include "backends/cpu/small_gemm.h"

#include <string>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

namespace sg = cpu::small_gemm;

TEST(SmallGemm, KernelMatchesF64Loops) {
  const std::vector<std::pair<int64_t, int64_t>> kn = {{1, 1},    {3, 10},  {7, 63}, {16, 64},   {5, 65},
                                                       {33, 130}, {2, 200}, {9, 16}, {784, 256}, {40, 129}};
  uint64_t seed = 1;
  for (const auto& [K, N] : kn) {
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64}) {
      if (!sg::supports(M, K, N)) continue;
      for (const bool trans_b : {false, true}) {
        SCOPED_TRACE("M " + std::to_string(M) + " K " + std::to_string(K) + " N " + std::to_string(N) +
                     (trans_b ? " B^T" : ""));
        const Tensor a = rand_tensor({M, K}, DType::kF64, -1, 1, ++seed);
        const Tensor b = rand_tensor(trans_b ? Shape{N, K} : Shape{K, N}, DType::kF64, -1, 1, ++seed);
        const Tensor bias = rand_tensor({N}, DType::kF64, -1, 1, ++seed);
        const Tensor a32 = a.to(DType::kF32), b32 = b.to(DType::kF32), bias32 = bias.to(DType::kF32);
        std::vector<float> packed(sg::packed_size(K, N),
                                  -7.0f);  // pack() must write all of it
        sg::pack(b32.data<float>(), K, N, trans_b, packed.data());
        const Tensor prod = ops::matmul(a, b, false, trans_b);
        for (const bool with_bias : {false, true}) {
          for (const bool relu : {false, true}) {
            SCOPED_TRACE(std::string(relu ? "relu" : "linear") + (with_bias ? " bias" : ""));
            Tensor ref = with_bias ? ops::add(prod, bias) : prod;
            if (relu) ref = ops::relu(ref);
            Tensor c = ops::full({M, N}, 99.0);
            sg::run(a32.data<float>(), M, K, N, packed.data(), with_bias ? bias32.data<float>() : nullptr, relu,
                    c.data<float>());
            EXPECT_CLOSE(c, ref, 1e-5, 1e-5 * static_cast<double>(K));
          }
        }
      }
    }
  }
}

TEST(SmallGemm, ShapesItDeclines) {
  EXPECT_TRUE(sg::supports(1, 784, 256)) << "built without AVX2/FMA?";
  EXPECT_TRUE(sg::supports(3, 3136, 128));   // few rows: any B
  EXPECT_TRUE(sg::supports(8, 784, 256));    // up to 8 rows while B is <= 1 MiB
  EXPECT_FALSE(sg::supports(4, 3136, 128));  // a 1.6 MB B re-streamed per row group
  EXPECT_FALSE(sg::supports(9, 256, 128));   // oneDNN's GEMM from 9 rows on
  EXPECT_TRUE(sg::supports(64, 128, 10));    // unless B fits in L1: any rows
  EXPECT_TRUE(sg::supports(1000, 64, 64));
  EXPECT_FALSE(sg::supports(64, 64, 65));
  EXPECT_FALSE(sg::supports(0, 16, 16));
  EXPECT_FALSE(sg::supports(1, 0, 16));
  EXPECT_FALSE(sg::supports(1, 16, 0));
  ScopedKernelPreferences off([](KernelPreferences& k) { k.small_gemm = false; });
  EXPECT_FALSE(sg::supports(1, 784, 256));
}

// Graphs: a constant B takes the kernel (packed once per node); every batch
// size of a pinned signature, and A with batch dims, must equal the eager op
// (oneDNN) and the kernel turned off.
TEST(SmallGemm, GraphsWithConstantWeightsMatchEagerCalls) {
  const Tensor w = rand_tensor({96, 70}, DType::kF32, -1, 1, 50), wt = rand_tensor({40, 70}, DType::kF32, -1, 1, 51);
  const Tensor bias = rand_tensor({70}, DType::kF32, -1, 1, 52), w2 = rand_tensor({96, 3}, DType::kF32, -1, 1, 53);
  auto model = [&](const std::vector<Tensor>& x) {
    Tensor h = ops::relu(ops::add(ops::matmul(x[0], w), bias));  // fused_matmul with relu
    return std::vector<Tensor>{ops::matmul(h, wt, false, true), ops::matmul(x[0], w2)};
  };
  FunctionOptions o;
  o.input_signature = std::vector<TensorSpec>{{{-1, 96}, DType::kF32}};
  Function f = function(model, o);
  for (const bool on : {true, false}) {
    ScopedKernelPreferences prefs([&](KernelPreferences& k) { k.small_gemm = on; });
    for (int64_t batch : {1, 2, 3, 5, 8, 9, 33, 1}) {
      SCOPED_TRACE(std::string("small_gemm ") + (on ? "on" : "off") + " batch " + std::to_string(batch));
      const Tensor x = rand_tensor({batch, 96}, DType::kF32, -1, 1, static_cast<uint64_t>(batch));
      const std::vector<Tensor> got = f({x}), want = model({x});
      ASSERT_EQ(got.size(), 2u);
      EXPECT_CLOSE(got[0], want[0], 1e-5, 1e-4);
      EXPECT_CLOSE(got[1], want[1], 1e-5, 1e-4);
    }
  }
  EXPECT_EQ(f.num_traces(), 1);
  const graph::Graph& traced = f.concrete({rand_tensor({1, 96}, DType::kF32)}).graph();
  EXPECT_EQ(traced.count_ops("fused_matmul"), 1) << traced.str();
  EXPECT_EQ(traced.count_ops("matmul"), 2);
  // A [2, 3, 96] against a 2-D constant B: 6 rows.
  Function g = function([&](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::matmul(x[0], w)}; });
  const Tensor x3 = rand_tensor({2, 3, 96}, DType::kF32, -1, 1, 60);
  EXPECT_CLOSE(g({x3})[0], ops::matmul(x3, w), 1e-5, 1e-4);
}

}  // namespace
}  // namespace kiln::testing
