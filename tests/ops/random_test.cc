#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "kiln/core/dtype.h"
#include "kiln/core/parallel.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"

#include "test_util.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;
constexpr int64_t kN = 100000;

struct Moments {
  double mean, var, skew, kurt, min, max;
};
Moments moments(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  Moments m{0, 0, 0, 0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  double m2 = 0, m3 = 0, m4 = 0;
  for (double x : v) {
    const double d = x - m.mean;
    m2 += d * d;
    m3 += d * d * d;
    m4 += d * d * d * d;
  }
  const double n = static_cast<double>(v.size());
  m.var = m2 / n;
  m.skew = (m3 / n) / std::pow(m.var, 1.5);
  m.kurt = (m4 / n) / (m.var * m.var);
  return m;
}

// Restores the thread count and the default generator's seed after a test changes them.
class RandomTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_num_threads(saved_threads_);
    set_seed(0);
  }
  int saved_threads_ = num_threads();
};

TEST_F(RandomTest, UniformMomentsAndBounds) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Tensor x = random_uniform({kN}, 2.0, 5.0, t, 11);
    EXPECT_EQ(x.dtype(), t);
    EXPECT_EQ(x.shape(), (Shape{kN}));
    Moments m = moments(x);
    EXPECT_GE(m.min, 2.0);
    EXPECT_LT(m.max, 5.0);
    EXPECT_NEAR(m.mean, 3.5, 0.02);  // sd of the mean: 0.0027
    EXPECT_NEAR(m.var, 0.75, 0.02);  // 3^2 / 12
    EXPECT_NEAR(m.skew, 0.0, 0.05);
    EXPECT_NEAR(m.kurt, 1.8, 0.05);  // uniform: 9/5
  }
}

TEST_F(RandomTest, UniformStaysBelowHiAfterRounding) {
  // Near 1, f16/bf16 (and f32 for [0, 1) scaled) round up to hi; results must not.
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Moments m = moments(random_uniform({kN}, 0.0, 1.0, t, 3));
    EXPECT_LT(m.max, 1.0);
    EXPECT_GE(m.min, 0.0);
    EXPECT_GT(m.max, t == DType::kBF16 ? 0.99 : 0.999);
  }
  Moments m = moments(random_uniform({kN}, 1.0, 1.0 + 1e-6, DType::kF32, 4));  // a few f32 values only
  EXPECT_GE(m.min, 1.0);
  EXPECT_LT(m.max, 1.0 + 1e-6);
}

TEST_F(RandomTest, UniformUsesPhiloxCountersOfSeedAndIndex) {
  // Element i of an f32 draw is word i % 4 of Philox block (seed, i / 4).
  const uint64_t seed = 0x123456789abcdefULL;
  std::vector<float> v = random_uniform({1001}, 0.0, 1.0, DType::kF32, seed).to_vector<float>();
  for (int64_t i : {0, 1, 2, 3, 4, 7, 500, 1000}) {
    auto b = Philox::block(seed, 0, static_cast<uint64_t>(i / 4));
    EXPECT_EQ(v[i], uint_to_unit_float(b[i % 4])) << "element " << i;
  }
  // f64: 64 bits per element, two elements per block.
  std::vector<double> d = random_uniform({9}, 0.0, 1.0, DType::kF64, seed).to_vector<double>();
  for (int64_t i : {0, 1, 8}) {
    auto b = Philox::block(seed, 0, static_cast<uint64_t>(i / 2));
    EXPECT_EQ(d[i], uints_to_unit_double(b[2 * (i % 2)], b[2 * (i % 2) + 1])) << "element " << i;
  }
  // A longer draw with the same seed extends a shorter one.
  Tensor shorter = random_normal({10}, 0, 1, DType::kF32, 5);
  Tensor longer = random_normal({1000}, 0, 1, DType::kF32, 5);
  std::vector<float> prefix = longer.to_vector<float>();
  prefix.resize(10);
  EXPECT_EQ(shorter.to_vector<float>(), prefix);
}

TEST_F(RandomTest, SeedsAreReproducibleAndDistinct) {
  EXPECT_TRUE(array_equal(random_normal({64}, 0, 1, DType::kF32, 42), random_normal({64}, 0, 1, DType::kF32, 42)));
  EXPECT_FALSE(array_equal(random_normal({64}, 0, 1, DType::kF32, 42), random_normal({64}, 0, 1, DType::kF32, 43)));
  EXPECT_TRUE(array_equal(bernoulli({64}, 0.5, 9), bernoulli({64}, 0.5, 9)));
  EXPECT_FALSE(array_equal(bernoulli({64}, 0.5, 9), bernoulli({64}, 0.5, 10)));
}

TEST_F(RandomTest, DefaultGeneratorReservesCounters) {
  set_seed(7);
  Tensor a = random_uniform({8});
  Tensor b = random_uniform({8});
  EXPECT_FALSE(array_equal(a, b));
  // Unseeded draws continue the seed's stream: together they are one seeded draw.
  std::vector<float> c = random_uniform({16}, 0, 1, DType::kF32, 7).to_vector<float>();
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(c.begin(), c.begin() + 8));
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(c.begin() + 8, c.end()));
  // set_seed restarts the stream; every op advances it.
  set_seed(7);
  EXPECT_TRUE(array_equal(random_uniform({8}), a));
  for (int k = 0; k < 2; ++k) {
    set_seed(8);
    Tensor n1 = random_normal({5}), n2 = random_normal({5});
    Tensor t1 = truncated_normal({5}), t2 = truncated_normal({5});
    Tensor b1 = bernoulli({64}), b2 = bernoulli({64});
    EXPECT_FALSE(array_equal(n1, n2));
    EXPECT_FALSE(array_equal(t1, t2));
    EXPECT_FALSE(array_equal(b1, b2));
  }
  // A call that fails validation leaves the stream where it was.
  set_seed(7);
  EXPECT_KILN_ERROR(random_uniform({8}, 1.0, 0.0), kInvalidArgument, "must be < hi");
  EXPECT_TRUE(array_equal(random_uniform({8}), a));
}

TEST_F(RandomTest, ResultsDoNotDependOnThreadCount) {
  const Shape shape{(1 << 18) + 3};  // enough blocks for several parallel chunks, and a ragged end
  std::vector<Tensor> runs[2];
  for (int k = 0; k < 2; ++k) {
    set_num_threads(k + 1);
    runs[k] = {random_uniform(shape, -1, 1, DType::kF32, 1), random_uniform(shape, -1, 1, DType::kF64, 1),
               random_uniform(shape, -1, 1, DType::kBF16, 1), random_uniform(shape, -5, 9, DType::kI32, 1),
               random_normal(shape, 0, 1, DType::kF32, 2),    random_normal(shape, 0, 1, DType::kF64, 2),
               truncated_normal(shape, 0, 1, DType::kF32, 3), truncated_normal(shape, 0, 1, DType::kF64, 3),
               bernoulli(shape, 0.25, 4)};
  }
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(array_equal(runs[0][i], runs[1][i])) << "draw " << i;
}

TEST_F(RandomTest, NormalMoments) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Tensor x = random_normal({kN}, 1.5, 2.0, t, 21);
    EXPECT_EQ(x.dtype(), t);
    Moments m = moments(x);
    EXPECT_NEAR(m.mean, 1.5, 0.04);            // sd of the mean: 0.0063
    EXPECT_NEAR(std::sqrt(m.var), 2.0, 0.03);  // sd of the sd: ~0.0045
    EXPECT_NEAR(m.skew, 0.0, 0.05);
    EXPECT_NEAR(m.kurt, 3.0, 0.1);
    std::vector<double> v = x.to_vector<double>();
    const double within = static_cast<double>(std::count_if(v.begin(), v.end(), [](double z) {
                            return std::abs(z - 1.5) < 2.0;
                          })) / kN;
    EXPECT_NEAR(within, 0.6827, 0.01);
  }
  std::vector<float> c = random_normal({100}, 3.0, 0.0, DType::kF32, 1).to_vector<float>();
  EXPECT_EQ(c, std::vector<float>(100, 3.0f));  // stddev 0: constant
}

TEST_F(RandomTest, TruncatedNormalStaysWithinTwoStddev) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Tensor x = truncated_normal({kN}, -1.0, 0.5, t, 31);
    EXPECT_EQ(x.dtype(), t);
    Moments m = moments(x);
    const double slack = t == DType::kF16 ? 1e-3 : 1e-6;  // rounding of mean + stddev * z
    EXPECT_GE(m.min, -2.0 - slack);
    EXPECT_LE(m.max, 0.0 + slack);
    EXPECT_LT(m.min, -1.95);  // and it does reach out near the bounds
    EXPECT_GT(m.max, -0.05);
    EXPECT_NEAR(m.mean, -1.0, 0.01);
    EXPECT_NEAR(std::sqrt(m.var), 0.5 * 0.87962, 0.005);  // sd of N(0,1) truncated at +-2
    EXPECT_NEAR(m.kurt, 2.37, 0.05);
  }
}

TEST_F(RandomTest, BernoulliFrequencies) {
  Tensor b = bernoulli({kN}, 0.3, 41);
  EXPECT_EQ(b.dtype(), DType::kBool);
  EXPECT_NEAR(moments(b).mean, 0.3, 0.01);  // sd: 0.0015
  std::vector<bool> none = bernoulli({1000}, 0.0, 1).to_vector<bool>();
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
  std::vector<bool> every = bernoulli({1000}, 1.0, 1).to_vector<bool>();
  EXPECT_EQ(std::count(every.begin(), every.end(), true), 1000);
}

TEST_F(RandomTest, IntegerUniformCoversTheRangeEvenly) {
  std::vector<int32_t> v = random_uniform({70000}, -3, 4, DType::kI32, 51).to_vector<int32_t>();
  std::map<int32_t, int> count;
  for (int32_t x : v) ++count[x];
  ASSERT_EQ(count.size(), 7u);
  EXPECT_EQ(count.begin()->first, -3);
  EXPECT_EQ(count.rbegin()->first, 3);
  for (auto& [value, c] : count) EXPECT_NEAR(c, 10000, 500) << "value " << value;  // sd ~93
  Tensor u8 = random_uniform({kN}, 0, 256, DType::kU8, 52);
  Moments m = moments(u8);
  EXPECT_EQ(m.min, 0);
  EXPECT_EQ(m.max, 255);
  EXPECT_NEAR(m.mean, 127.5, 1.0);
  Tensor i64 = random_uniform({1000}, -1e15, 1e15, DType::kI64, 53);
  EXPECT_EQ(i64.dtype(), DType::kI64);
  EXPECT_GT(moments(i64).max, 1e14);
  // The whole i64 range: [-2^63, 2^63) spans 2^64 values.
  Moments full = moments(random_uniform({10000}, -9223372036854775808.0, 9223372036854775808.0, DType::kI64, 54));
  EXPECT_LT(full.min, -8e18);
  EXPECT_GT(full.max, 8e18);
  EXPECT_KILN_ERROR(random_uniform({1}, 0, 9223372036854777856.0, DType::kI64), kInvalidArgument, "outside the range");
}

TEST_F(RandomTest, BadArgumentsGiveTypedErrors) {
  EXPECT_KILN_ERROR(random_uniform({3}, 1.0, 1.0), kInvalidArgument, "lo (1) must be < hi (1)");
  EXPECT_KILN_ERROR(random_uniform({3}, 2.0, 1.0), kInvalidArgument, "must be < hi");
  EXPECT_KILN_ERROR(random_uniform({3}, 0.0, INFINITY), kInvalidArgument, "hi must be finite");
  EXPECT_KILN_ERROR(random_uniform({3}, 1.0 + 1e-12, 1.0 + 2e-12, DType::kF32), kInvalidArgument, "no f32 value");
  EXPECT_KILN_ERROR(random_uniform({3}, 1.0 + 1e-5, 1.0 + 2e-4, DType::kBF16), kInvalidArgument, "no bf16 value");
  EXPECT_KILN_ERROR(random_uniform({3}, 0.0, 1.0, DType::kBool), kInvalidArgument, "bool");
  EXPECT_KILN_ERROR(random_uniform({3}, 0.5, 4.0, DType::kI32), kInvalidArgument, "integer bounds");
  EXPECT_KILN_ERROR(random_uniform({3}, 0.0, 257.0, DType::kU8), kInvalidArgument, "outside the range of u8");
  EXPECT_KILN_ERROR(random_uniform({-1}), kInvalidArgument, "negative dimension");
  EXPECT_KILN_ERROR(random_normal({3}, 0.0, -1.0), kInvalidArgument, "stddev must be >= 0");
  EXPECT_KILN_ERROR(random_normal({3}, NAN, 1.0), kInvalidArgument, "mean must be finite");
  EXPECT_KILN_ERROR(random_normal({3}, 0.0, 1.0, DType::kI32), kInvalidArgument, "dtype must be floating");
  EXPECT_KILN_ERROR(truncated_normal({3}, 0.0, -0.5), kInvalidArgument, "truncated_normal: stddev must be >= 0");
  EXPECT_KILN_ERROR(bernoulli({3}, -0.1), kInvalidArgument, "p must be in [0, 1]");
  EXPECT_KILN_ERROR(bernoulli({3}, 1.5), kInvalidArgument, "p must be in [0, 1]");
  EXPECT_KILN_ERROR(bernoulli({3}, NAN), kInvalidArgument, "p must be in [0, 1]");
}

TEST_F(RandomTest, EmptyAndScalarShapes) {
  EXPECT_EQ(random_uniform({0, 4}).numel(), 0);
  EXPECT_EQ(truncated_normal({0}).numel(), 0);
  Tensor s = random_normal({}, 0, 1, DType::kF64, 1);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_TRUE(std::isfinite(s.item<double>()));
}

}  // namespace
}  // namespace kiln::testing
