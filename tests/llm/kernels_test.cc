// The quantised row kernels against exact f32 products (rows decoded by dequantize_row),
// on the random blocks of every type in the GGUF fixture; the ISA paths and the token
// tiles give bit-identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/error.h"
#include "kiln/core/half.h"
#include "kiln/llm/gguf.h"
#include "llm/attention_kernels.h"
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
      set_cpu_isa_cap(kBestCpuIsa);
      EXPECT_EQ(avx2, all) << "AVX2 and AVX-512 VNNI differ";
    }
  }
  if (!cpu_has(CpuIsa::kAvx512Vnni))
    std::printf("AVX-512 VNNI path not run: this CPU is %s\n", cpu_isa_name(detected_cpu_isa()));
}

// The activation quantiser: per half block, d = max|x| / 127 and q = x / d rounded to
// nearest even; integer and float sums consistent.
TEST(LlmKernels, QuantizeQ8MatchesScalarDefinition) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> x(256);
  for (float& v : x) v = dist(rng);
  x[40] = 0.0f;
  std::fill(x.begin() + 64, x.begin() + 80, 0.0f);  // an all-zero half
  x[100] = 127.0f * 0.5f, x[101] = -63.5f;          // exact ties after scaling
  std::vector<Q8Block> q(x.size() / 32);
  kernels::quantize_q8(x.data(), q.data(), static_cast<int64_t>(x.size()));
  for (size_t b = 0; b < q.size(); ++b)
    for (int h = 0; h < 2; ++h) {
      const float* xh = x.data() + 32 * b + 16 * h;
      float mx = 0;
      for (int k = 0; k < 16; ++k) mx = std::max(mx, std::fabs(xh[k]));
      const float d = mx / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      int isum = 0;
      for (int k = 0; k < 16; ++k) {
        const int want = static_cast<int>(std::nearbyint(xh[k] * id));
        EXPECT_EQ(q[b].q[16 * h + k], want) << "block " << b << " element " << 16 * h + k;
        isum += want;
      }
      EXPECT_EQ(q[b].isum[h], isum);
      for (int k = 0; k < 4; ++k) EXPECT_EQ(q[b].d[4 * h + k], d);
    }
}

// ---- Packed matrices and the group kernels ----

// Random blocks of `type` (rows x cols): random quant bytes, sane f16 scales.
std::vector<uint8_t> random_rows(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  const size_t row_bytes = ggml_row_bytes(type, cols);
  std::vector<uint8_t> raw(row_bytes * static_cast<size_t>(rows));
  std::mt19937 rng(seed);
  for (uint8_t& b : raw) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), offset(-0.1f, 0.1f);
  auto put = [&](uint8_t* p, float v) {
    const uint16_t h = half::from_float(v);
    std::memcpy(p, &h, 2);
  };
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  for (size_t at = 0; at < raw.size(); at += info->block_bytes) {
    uint8_t* b = raw.data() + at;
    switch (type) {
      case GgmlType::kQ4_1: case GgmlType::kQ5_1: put(b, scale(rng)), put(b + 2, offset(rng)); break;
      case GgmlType::kQ4_K: case GgmlType::kQ5_K: put(b, scale(rng) / 16), put(b + 2, scale(rng) / 16); break;
      case GgmlType::kQ6_K: put(b + 208, scale(rng) / 32); break;
      default: put(b, scale(rng)); break;
    }
  }
  return raw;
}

struct PackedCase {
  std::vector<uint8_t> raw;
  QMatrix w;
  std::vector<float> x;
  std::vector<Q8Block> xq;
  int64_t n;
};

PackedCase packed_case(GgmlType type, int64_t rows, int64_t cols, int64_t n, uint32_t seed) {
  PackedCase c;
  c.raw = random_rows(type, rows, cols, seed);
  c.w = QMatrix{type, c.raw.data(), rows, cols, ggml_row_bytes(type, cols)};
  c.n = n;
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  c.x.resize(static_cast<size_t>(n * cols));
  for (float& v : c.x) v = dist(rng);
  c.x[7] = -35.0f;
  c.xq.resize(static_cast<size_t>(n * cols / 32));
  for (int64_t t = 0; t < n; ++t) kernels::quantize_q8(c.x.data() + t * cols, c.xq.data() + t * cols / 32, cols);
  return c;
}

std::vector<float> run_groups(const kernels::PackedMatrix& p, const Q8Block* xq, int64_t n, int64_t g0, int64_t g1) {
  std::vector<float> y(static_cast<size_t>(n * p.rows()), -1.0f);
  kernels::matmul_groups(p, xq, n, y.data(), p.rows(), g0, g1);
  return y;
}

const GgmlType kPackable[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                              GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

// Every packable type against the exact product of the decoded rows, in double; 37 rows
// (a partial last group), 512 columns (two K super-blocks).
TEST(LlmKernels, PackedGroupKernelsMatchExactProducts) {
  for (GgmlType type : kPackable) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)));
    const PackedCase c = packed_case(type, 37, 512, 11, 3);
    const kernels::PackedMatrix p(c.w);
    EXPECT_EQ(p.groups(), 3);
    const std::vector<float> got = run_groups(p, c.xq.data(), c.n, 0, p.groups());
    std::vector<float> row(static_cast<size_t>(c.w.cols));
    double worst = 0;
    for (int64_t r = 0; r < c.w.rows; ++r) {
      dequantize_row(type, c.w.data + r * c.w.row_bytes, row.data(), c.w.cols);
      for (int64_t t = 0; t < c.n; ++t) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < c.w.cols; ++k) {
          ref += static_cast<double>(row[k]) * c.x[t * c.w.cols + k];
          mag += std::fabs(static_cast<double>(row[k]) * c.x[t * c.w.cols + k]);
        }
        const double err = std::fabs(got[t * c.w.rows + r] - ref) / mag;
        worst = std::max(worst, err);
        EXPECT_LT(err, 5e-3) << "row " << r << " token " << t << ": " << got[t * c.w.rows + r] << " vs " << ref;
      }
    }
    // The packed kernels compute the same integer dots as the row kernels: within float rounding of them.
    if (kernels::has_integer_kernel(type)) {
      std::vector<float> rows(static_cast<size_t>(c.n * c.w.rows));
      kernels::matmul_rows(c.w, c.xq.data(), c.x.data(), c.n, rows.data(), c.w.rows, 0, c.w.rows);
      for (size_t i = 0; i < rows.size(); ++i) EXPECT_NEAR(got[i], rows[i], 1e-4 * (1 + std::fabs(rows[i]))) << i;
    }
    std::printf("%s: worst error / magnitude %.2e\n", ggml_type_name(static_cast<uint32_t>(type)).c_str(), worst);
  }
}

// Tiles, group ranges and instruction sets: bit-identical. 37 tokens: two full AMX tiles
// of 16 and 5 on the VNNI kernel where the CPU has AMX; 40 rows: a partial last group.
TEST(LlmKernels, PackedTilesRangesAndIsaAreBitIdentical) {
  const CpuIsa found = cpu_isa();
  for (GgmlType type : kPackable) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)));
    const PackedCase c = packed_case(type, 40, 256, 37, 9);
    const kernels::PackedMatrix p(c.w);
    const std::vector<float> all = run_groups(p, c.xq.data(), c.n, 0, p.groups());
    for (int64_t t = 0; t < c.n; ++t) {
      const std::vector<float> alone = run_groups(p, c.xq.data() + t * c.w.cols / 32, 1, 0, p.groups());
      for (int64_t r = 0; r < c.w.rows; ++r) ASSERT_EQ(alone[r], all[t * c.w.rows + r]) << "token " << t << " row " << r;
    }
    std::vector<float> split(static_cast<size_t>(c.n * c.w.rows), -1.0f);
    for (int64_t g = 0; g < p.groups(); ++g) kernels::matmul_groups(p, c.xq.data(), c.n, split.data(), c.w.rows, g, g + 1);
    EXPECT_EQ(split, all) << "one group at a time";
    for (CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx512Vnni, CpuIsa::kAmx}) {
      if (level > found) continue;
      set_cpu_isa_cap(level);
      const std::vector<float> at_level = run_groups(p, c.xq.data(), c.n, 0, p.groups());
      set_cpu_isa_cap(found);
      EXPECT_EQ(at_level, all) << cpu_isa_name(level) << " differs from " << cpu_isa_name(found);
    }
  }
  for (CpuIsa level : {CpuIsa::kAvx512Vnni, CpuIsa::kAmx})
    if (level > found) std::printf("%s group kernels not run: kiln runs %s here\n", cpu_isa_name(level), cpu_isa_name(found));
}

// Attention's block products (f16 keys and values, read in place) against double sums,
// and bit-identical whatever the rows sharing a call and the instruction set. hd 72:
// four AVX-512 vectors and a half (the lane tail); keys of 21 positions in rows of 24
// (the last vector read from a padded copy), values in rows of 80.
TEST(LlmKernels, AttentionBlockProductsMatchDoubleSumsAndAreBitIdentical) {
  constexpr int64_t rows = 11, hd = 72, kt_stride = 24, m = 21, v_stride = 80, s_stride = 32;
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(rows * hd), p(rows * s_stride);
  std::vector<half> kt(hd * kt_stride), v(m * v_stride);
  for (float& x : q) x = dist(rng);
  for (half& x : kt) x = half(dist(rng));
  for (half& x : v) x = half(dist(rng));
  for (float& x : p) x = std::fabs(dist(rng));
  std::vector<const float*> qr;
  for (int64_t r = 0; r < rows; ++r) qr.push_back(q.data() + r * hd);
  auto run = [&](int64_t per_call, std::vector<float>& s, std::vector<float>& out) {
    s.assign(rows * s_stride, -1.0f);
    out.assign(rows * hd, 0.5f);
    std::vector<float*> o;
    for (int64_t r = 0; r < rows; ++r) o.push_back(out.data() + r * hd);
    for (int64_t r = 0; r < rows; r += per_call) {
      const int64_t n = std::min(per_call, rows - r);
      kernels::attn_scores(qr.data() + r, n, kt.data(), kt_stride, m, hd, 0.125f, s.data() + r * s_stride, s_stride);
      kernels::attn_values(p.data() + r * s_stride, s_stride, n, m, v.data(), v_stride, hd, o.data() + r);
    }
  };
  std::vector<float> s, out;
  run(rows, s, out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < m; ++j) {
      double ref = 0;
      for (int64_t d = 0; d < hd; ++d) ref += static_cast<double>(q[r * hd + d]) * static_cast<float>(kt[d * kt_stride + j]);
      EXPECT_NEAR(s[r * s_stride + j], 0.125 * ref, 1e-5) << r << " " << j;
    }
    for (int64_t i = 0; i < hd; ++i) {
      double ref = 0.5;
      for (int64_t j = 0; j < m; ++j) ref += static_cast<double>(p[r * s_stride + j]) * static_cast<float>(v[j * v_stride + i]);
      EXPECT_NEAR(out[r * hd + i], ref, 1e-4) << r << " " << i;
    }
  }
  auto valid = [&](const std::vector<float>& x) {  // positions past m are not results
    std::vector<float> y;
    for (int64_t r = 0; r < rows; ++r) y.insert(y.end(), x.begin() + r * s_stride, x.begin() + r * s_stride + m);
    return y;
  };
  const CpuIsa found = cpu_isa();
  for (int64_t per_call : {1, 3}) {
    std::vector<float> s2, out2;
    run(per_call, s2, out2);
    EXPECT_EQ(valid(s2), valid(s)) << per_call << " rows a call";
    EXPECT_EQ(out2, out) << per_call << " rows a call";
  }
  if (found >= CpuIsa::kAvx512) {
    set_cpu_isa_cap(CpuIsa::kAvx2);
    std::vector<float> s2, out2;
    run(rows, s2, out2);
    set_cpu_isa_cap(found);
    EXPECT_EQ(valid(s2), valid(s)) << "AVX2 and AVX-512 scores differ";
    EXPECT_EQ(out2, out) << "AVX2 and AVX-512 values differ";
  } else {
    std::printf("AVX-512 attention path not run: kiln runs %s here\n", cpu_isa_name(found));
  }
}

TEST(LlmKernels, PackRejectsWhatItCannotTake) {
  std::vector<uint8_t> raw(ggml_row_bytes(GgmlType::kF16, 64) * 16);
  EXPECT_THROW(kernels::PackedMatrix(QMatrix{GgmlType::kF16, raw.data(), 16, 64, ggml_row_bytes(GgmlType::kF16, 64)}),
               InvalidArgumentError);
  EXPECT_FALSE(kernels::packable(GgmlType::kBF16));
  EXPECT_TRUE(kernels::packable(GgmlType::kQ6_K));
}

}  // namespace
}  // namespace kiln::llm
