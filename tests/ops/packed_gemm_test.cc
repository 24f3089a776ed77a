// The GEMM over a packed B (src/backends/cpu/packed_gemm.h), its 6x16 AVX2 tile and its
// 6x64 AVX-512 one, against kiln's f64 matmul loop: every row remainder (1-6 rows), full and partial 16-column
// panels (masked stores that must not write past N), K over several blocks, A
// transposed or not, B transposed or not, bias and ReLU, 1-3 threads (the
// panel and the row split); and the graphs and weight gradients that take it
// agreeing with oneDNN (the kernel turned off).
#include "backends/cpu/packed_gemm.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/dtype.h"
#include "kiln/core/parallel.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "isa_levels.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

namespace pg = cpu::packed_gemm;

// At each ISA level (kernel tests run in: the 6x16 AVX2 tile, the 6x64 AVX-512 one).
void check_against_f64() {
  ASSERT_TRUE(pg::available()) << "built without AVX2/FMA?";
  struct Case {
    int64_t M, K, N;
  };
  // Rows: every remainder of 6; columns: 1-13 panels (the AVX-512 tile's last group of
  // 1-3 panels), partial ones; K over several blocks of both tiles.
  const std::vector<Case> cases = {{1, 1, 1},      {5, 3, 10},    {6, 7, 17},    {7, 16, 16},    {11, 5, 33},
                                   {12, 33, 130},  {13, 300, 33}, {64, 600, 40}, {65, 1100, 9},  {23, 257, 48},
                                   {64, 784, 256}, {200, 20, 48}, {3, 513, 31},  {36, 64, 32},   {25, 40, 200}};
  const int saved = num_threads();
  uint64_t seed = 1;
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const auto& [M, K, N] : cases) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + " M " + std::to_string(M) + " K " + std::to_string(K) +
                       " N " + std::to_string(N) + (trans_a ? " A^T" : "") + (trans_b ? " B^T" : ""));
          const Tensor a = rand_tensor(trans_a ? Shape{K, M} : Shape{M, K}, DType::kF64, -1, 1, ++seed);
          const Tensor b = rand_tensor(trans_b ? Shape{N, K} : Shape{K, N}, DType::kF64, -1, 1, ++seed);
          const Tensor bias = rand_tensor({N}, DType::kF64, -1, 1, ++seed);
          const Tensor a32 = a.to(DType::kF32), b32 = b.to(DType::kF32), bias32 = bias.to(DType::kF32);
          std::vector<float> packed(pg::packed_size(K, N), -7.0f);  // pack() must write all of it
          pg::pack(b32.data<float>(), K, N, trans_b, packed.data());
          const Tensor prod = ops::matmul(a, b, trans_a, trans_b);
          for (const bool with_bias : {false, true}) {
            for (const bool relu : {false, true}) {
              SCOPED_TRACE(std::string(relu ? "relu" : "linear") + (with_bias ? " bias" : ""));
              Tensor ref = with_bias ? ops::add(prod, bias) : prod;
              if (relu) ref = ops::relu(ref);
              // c with 16 guard floats after it: the partial panel's masked stores stop at N.
              std::vector<float> c(static_cast<size_t>(M * N + 16), 99.0f);
              pg::run(a32.data<float>(), trans_a, M, K, N, packed.data(), with_bias ? bias32.data<float>() : nullptr,
                      relu, c.data());
              for (size_t i = static_cast<size_t>(M * N); i < c.size(); ++i) ASSERT_EQ(c[i], 99.0f) << i;
              Tensor got = ops::full({M, N}, 0.0f);
              std::copy(c.begin(), c.begin() + M * N, got.data<float>());
              EXPECT_CLOSE(got, ref, 1e-5, 1e-5 * static_cast<double>(K));
            }
          }
        }
      }
    }
  }
  set_num_threads(saved);
}

TEST(PackedGemm, KernelMatchesF64Loops) { at_each_isa_level([] { check_against_f64(); }); }

TEST(PackedGemm, ReluKeepsNaN) {
  const int64_t M = 6, K = 4, N = 16;
  std::vector<float> a(M * K, 1.0f), b(K * N, 1.0f), packed(pg::packed_size(K, N)), c(M * N);
  a[2 * K + 1] = std::numeric_limits<float>::quiet_NaN();  // row 2 is NaN throughout
  b[3] = -10.0f;                                           // column 3 is negative elsewhere
  pg::pack(b.data(), K, N, false, packed.data());
  pg::run(a.data(), false, M, K, N, packed.data(), nullptr, true, c.data());
  for (int64_t j = 0; j < N; ++j) EXPECT_TRUE(std::isnan(c[2 * N + j])) << j;
  EXPECT_EQ(c[3], 0.0f);
  EXPECT_EQ(c[4], 4.0f);
}

TEST(PackedGemm, SwitchedOffByPreference) {
  ScopedKernelPreferences off([](KernelPreferences& k) { k.packed_gemm = false; });
  EXPECT_FALSE(pg::available());
}

// Graphs with constant weights take the kernel for 9..512 rows (fewer go to the small-M
// kernel); every batch of a pinned signature must equal the kernels turned off (oneDNN).
TEST(PackedGemm, GraphsWithConstantWeightsMatchOneDnn) {
  const Tensor w = rand_tensor({300, 70}, DType::kF32, -1, 1, 50), wt = rand_tensor({40, 70}, DType::kF32, -1, 1, 51);
  const Tensor bias = rand_tensor({70}, DType::kF32, -1, 1, 52);
  auto model = [&](const std::vector<Tensor>& x) {
    Tensor h = ops::relu(ops::add(ops::matmul(x[0], w), bias));  // fused_matmul with relu
    return std::vector<Tensor>{ops::matmul(h, wt, false, true)};
  };
  FunctionOptions o;
  o.input_signature = std::vector<TensorSpec>{{{-1, 300}, DType::kF32}};
  Function on = function(model, o), off = function(model, o);
  for (int64_t batch : {9, 33, 64, 130, 512, 600}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Tensor x = rand_tensor({batch, 300}, DType::kF32, -1, 1, static_cast<uint64_t>(batch));
    const Tensor got = on({x})[0];
    ScopedKernelPreferences oneDnn([](KernelPreferences& k) { k.packed_gemm = k.small_gemm = false; });
    EXPECT_CLOSE(got, off({x})[0], 1e-5, 1e-4);
  }
}

// A dense layer's weight gradient x^T @ dy (batch <= 256 rows) packs dy per call, eagerly
// and in graphs: equal to oneDNN's, with the bias-free, activation-free store.
TEST(PackedGemm, WeightGradientsMatchOneDnn) {
  for (const auto& [batch, in, out] :
       std::vector<std::array<int64_t, 3>>{{32, 784, 256}, {7, 100, 10}, {256, 64, 33}}) {
    SCOPED_TRACE(std::to_string(batch) + "x" + std::to_string(in) + "x" + std::to_string(out));
    const Tensor x = rand_tensor({batch, in}, DType::kF32, -1, 1, 7),
                 dy = rand_tensor({batch, out}, DType::kF32, -1, 1, 8);
    const Tensor got = ops::matmul(x, dy, true, false);
    ScopedKernelPreferences off([](KernelPreferences& k) { k.packed_gemm = false; });
    EXPECT_CLOSE(got, ops::matmul(x, dy, true, false), 1e-5, 1e-4);
    EXPECT_CLOSE(got, ops::matmul(x.to(DType::kF64), dy.to(DType::kF64), true, false), 1e-5, 1e-4);
  }
}

}  // namespace
}  // namespace kiln::testing
