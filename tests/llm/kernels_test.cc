// The quantised row kernels against exact f32 products (rows decoded by dequantize_row),
// on the random blocks of every type in the GGUF fixture; the ISA paths and the token
// tiles give bit-identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kiln/core/cpu_isa.h"
#include "kiln/llm/gguf.h"
#include "llm/quant_kernels.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

using kernels::Q8Block;
using kernels::QMatrix;

struct Case {
  QMatrix w;
  std::vector<float> x;        // n x cols
  std::vector<Q8Block> xq;
  int64_t n;
};

Case make_case(const GgufFile& f, const char* type, int64_t n, uint32_t seed) {
  const GgufTensor& t = f.tensor(std::string("q.") + type);
  Case c{{t.type, t.data, t.rows(), t.row_length(), ggml_row_bytes(t.type, t.row_length())}, {}, {}, n};
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  c.x.resize(static_cast<size_t>(n * c.w.cols));
  for (float& v : c.x) v = dist(rng);
  c.x[5] = 40.0f;  // an outlier, as real activations have
  c.xq.resize(static_cast<size_t>(n * c.w.cols / 32));
  for (int64_t i = 0; i < n; ++i) kernels::quantize_q8(c.x.data() + i * c.w.cols, c.xq.data() + i * c.w.cols / 32, c.w.cols);
  return c;
}

std::vector<float> run(const Case& c, bool integer) {
  std::vector<float> y(static_cast<size_t>(c.n * c.w.rows));
  kernels::matmul_rows(c.w, integer ? c.xq.data() : nullptr, c.x.data(), c.n, y.data(), c.w.rows, 0, c.w.rows);
  return y;
}

TEST(LlmKernels, IntegerKernelsMatchExactProducts) {
  auto f = GgufFile::open(kiln::testing::fixture("gguf/quant_blocks.gguf"));
  for (const char* type : {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"}) {
    SCOPED_TRACE(type);
    const Case c = make_case(*f, type, 3, 7);
    ASSERT_TRUE(kernels::has_integer_kernel(c.w.type));
    const std::vector<float> exact = run(c, false), got = run(c, true);
    // Exact reference in double from the decoded rows.
    std::vector<float> row(static_cast<size_t>(c.w.cols));
    for (int64_t r = 0; r < c.w.rows; ++r) {
      dequantize_row(c.w.type, c.w.data + r * c.w.row_bytes, row.data(), c.w.cols);
      for (int64_t t = 0; t < c.n; ++t) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < c.w.cols; ++k) {
          ref += static_cast<double>(row[k]) * c.x[t * c.w.cols + k];
          mag += std::fabs(static_cast<double>(row[k]) * c.x[t * c.w.cols + k]);
        }
        EXPECT_NEAR(exact[t * c.w.rows + r], ref, 1e-5 * mag) << "f32 path, row " << r;
        // 8-bit activations: the error is a fraction of a percent of the terms' magnitude.
        EXPECT_NEAR(got[t * c.w.rows + r], ref, 5e-3 * mag) << "integer path, row " << r << " token " << t;
      }
    }
  }
  for (const char* type : {"q4_K", "q5_K", "q6_K", "f16", "bf16", "f32"})
    EXPECT_FALSE(kernels::has_integer_kernel(f->tensor(std::string("q.") + type).type)) << type << " (f32 path)";
}

// A token's result does not depend on how many tokens share the call (tiles of 8, 4, 1)
// nor on the instruction set.
TEST(LlmKernels, TilesAndIsaPathsAreBitIdentical) {
  auto f = GgufFile::open(kiln::testing::fixture("gguf/quant_blocks.gguf"));
  for (const char* type : {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"}) {
    SCOPED_TRACE(type);
    const Case many = make_case(*f, type, 13, 11);
    const std::vector<float> all = run(many, true);
    for (int64_t t = 0; t < many.n; ++t) {
      Case one = many;
      one.n = 1;
      one.x.assign(many.x.begin() + t * many.w.cols, many.x.begin() + (t + 1) * many.w.cols);
      one.xq.assign(many.xq.begin() + t * many.w.cols / 32, many.xq.begin() + (t + 1) * many.w.cols / 32);
      const std::vector<float> alone = run(one, true);
      for (int64_t r = 0; r < many.w.rows; ++r) EXPECT_EQ(alone[r], all[t * many.w.rows + r]) << "token " << t << " row " << r;
    }
    if (cpu_has(CpuIsa::kAvx512Vnni)) {
      set_cpu_isa_cap(CpuIsa::kAvx2);
      const std::vector<float> avx2 = run(many, true);
      set_cpu_isa_cap(CpuIsa::kAvx512Bf16);
      EXPECT_EQ(avx2, all) << "AVX2 and AVX-512 VNNI differ";
    }
  }
  if (!cpu_has(CpuIsa::kAvx512Vnni))
    std::printf("AVX-512 VNNI path not run: this CPU is %s\n", cpu_isa_name(detected_cpu_isa()));
}

}  // namespace
}  // namespace kiln::llm
