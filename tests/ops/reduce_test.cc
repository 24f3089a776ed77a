#include <cmath>
#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/core/parallel.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"

#include "op_table.h"

namespace kiln::testing {
namespace {

using Axes = std::vector<int64_t>;
using In = std::vector<Tensor>;
using RedFn = Tensor (*)(const Tensor&, const Axes&, bool);
const std::vector<DType> kLabelOnly = {DType::kI32};  // integer/bool inputs: one exact run

OpFn red(RedFn f, Axes axes = {}, bool keepdims = false) {
  return [=](const In& in) { return In{f(in[0], axes, keepdims)}; };
}
OpFn var_fn(Tensor (*f)(const Tensor&, const Axes&, bool, int64_t), Axes axes, bool keepdims, int64_t ddof) {
  return [=](const In& in) { return In{f(in[0], axes, keepdims, ddof)}; };
}
OpFn arg(Tensor (*f)(const Tensor&, int64_t, bool), int64_t axis, bool keepdims = false) {
  return [=](const In& in) { return In{f(in[0], axis, keepdims)}; };
}
Tensor (*const kArgmax)(const Tensor&, int64_t, bool) = ops::argmax;
Tensor (*const kArgmin)(const Tensor&, int64_t, bool) = ops::argmin;

std::vector<OpCase> reduce_cases() {
  using namespace ops;
  return {
      {"sum_all", red(sum)},
      {"sum_axis0", red(sum, {0})},
      {"sum_axis1_keep", red(sum, {1}, true)},
      {"sum_neg", red(sum, {-1})},
      {"sum_mid", red(sum, {1})},
      {"sum_02", red(sum, {0, 2})},
      {"sum_13_keep", red(sum, {1, 3}, true)},
      {"sum_neg_multi", red(sum, {-4, -2})},
      {"sum_023", red(sum, {0, 2, 3})},
      {"sum_size1", red(sum, {1})},
      {"sum_rank0", red(sum)},
      {"sum_empty", red(sum, {0})},
      {"sum_empty_out", red(sum, {1})},
      {"sum_long_rows", red(sum, {1})},
      {"sum_long_cols", red(sum, {0})},
      {"sum_int", red(sum, {1}), kLabelOnly},
      {"sum_bool", red(sum, {0}), kLabelOnly},
      {"mean_all", red(mean)},
      {"mean_axis0", red(mean, {0})},
      {"mean_13_keep", red(mean, {1, 3}, true)},
      {"mean_empty", red(mean, {0})},
      {"prod_axis1", red(prod, {1})},
      {"prod_02", red(prod, {0, 2})},
      {"prod_empty", red(prod, {1})},
      {"prod_int", red(prod, {0}), kLabelOnly},
      {"max_axis1", red(max, {1})},
      {"max_02", red(max, {0, 2})},
      {"min_axis0_keep", red(min, {0}, true)},
      {"min_all", red(min)},
      {"max_negative", red(max, {1})},
      {"max_nan", red(max, {1})},
      {"min_nan", red(min, {0})},
      {"max_int", red(max, {1}), kLabelOnly},
      {"min_u8", red(min, {0}), kLabelOnly},
      {"argmax_axis1", arg(kArgmax, 1)},
      {"argmax_axis0", arg(kArgmax, 0)},
      {"argmin_neg_keep", arg(kArgmin, -1, true)},
      {"argmax_mid", arg(kArgmax, 1)},
      {"argmin_axis0", arg(kArgmin, 0)},
      {"argmax_nan", arg(kArgmax, 1)},
      {"argmin_nan", arg(kArgmin, 0)},
      {"argmax_int", arg(kArgmax, 1), kLabelOnly},
      {"var_all", var_fn(var, {}, false, 0)},
      {"var_axis0_ddof1", var_fn(var, {0}, false, 1)},
      {"var_02_keep", var_fn(var, {0, 2}, true, 0)},
      {"var_offset", var_fn(var, {1}, false, 0)},
      {"var_empty", var_fn(var, {0}, false, 0)},
      {"var_ddof_big", var_fn(var, {1}, false, 3)},
      {"std_axis1", var_fn(ops::std, {1}, false, 0)},
      {"std_13_ddof1", var_fn(ops::std, {1, 3}, false, 1)},
      {"lse_axis1", red(logsumexp, {1})},
      {"lse_big", red(logsumexp, {0})},
      {"lse_all", red(logsumexp)},
      {"lse_02", red(logsumexp, {0, 2})},
      {"lse_inf", red(logsumexp, {1})},
      {"lse_empty", red(logsumexp, {0})},
      {"all_axis1", red(all, {1}), kLabelOnly},
      {"any_axis0", red(any, {0}), kLabelOnly},
      {"all_float", red(all, {1})},
      {"any_float", red(any, {1})},
      {"all_02", red(all, {0, 2}), kLabelOnly},
      {"all_empty", red(all, {0}), kLabelOnly},
      {"any_empty", red(any, {0}), kLabelOnly},
  };
}

class ReduceOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(ReduceOps, MatchesNumpy) { run_op_case("reduce", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, ReduceOps, ::testing::ValuesIn(reduce_cases()),
                         [](const auto& info) { return info.param.name; });
KILN_CUDA_OP_TABLE(ReduceOps, "reduce", reduce_cases());

// ---- large reductions: input rebuilt here, NumPy outputs from the fixtures ---------

// Must match large_input() in scripts/fixtures/gen_reduce.py bit for bit.
Tensor large_input(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(static_cast<double>((static_cast<int64_t>(i) * 7919) % 10007) / 10007.0);
  return Tensor::from_vector(v, shape);
}

struct LargeCase {
  std::string name;
  Shape shape;
  std::function<Tensor(const Tensor&)> fn;
  double rtol;  // for the f32 run; f64 runs use 1e-10
};

std::vector<LargeCase> large_cases() {
  using namespace ops;
  const Shape m{1024, 1024}, row{1, 1 << 20}, cols{1 << 18, 4};
  return {
      // A plain f32 running sum of 1M values in [0, 1) is off by ~1e-4 relative;
      // these tolerances demand (near-)exact accumulation.
      {"large_sum_all", m, [](const Tensor& x) { return sum(x); }, 1e-7},
      {"large_sum_axis0", m, [](const Tensor& x) { return sum(x, {0}); }, 1e-7},
      {"large_sum_axis1", m, [](const Tensor& x) { return sum(x, {1}); }, 1e-7},
      {"large_mean_all", m, [](const Tensor& x) { return mean(x); }, 1e-7},
      {"large_var_all", m, [](const Tensor& x) { return var(x); }, 1e-6},
      {"large_std_axis0", m, [](const Tensor& x) { return ops::std(x, {0}); }, 1e-6},
      {"large_lse_all", m, [](const Tensor& x) { return logsumexp(x); }, 1e-6},
      {"large_max_axis0", m, [](const Tensor& x) { return max(x, {0}); }, 0},
      {"large_argmax_axis1", m, [](const Tensor& x) { return argmax(x, 1); }, 0},
      {"large_argmin_axis0", m, [](const Tensor& x) { return argmin(x, 0); }, 0},
      {"large_row_sum", row, [](const Tensor& x) { return sum(x, {1}); }, 1e-7},
      {"large_row_argmax", row, [](const Tensor& x) { return argmax(x, 1); }, 0},
      {"large_cols_sum", cols, [](const Tensor& x) { return sum(x, {0}); }, 1e-7},
      {"large_cols_var", cols, [](const Tensor& x) { return var(x, {0}); }, 1e-6},
      {"large_cols_argmin", cols, [](const Tensor& x) { return argmin(x, 0); }, 0},
  };
}

TEST(Reduce, LargeReductionsMatchNumpy) {
  const Tensor base = large_input({1 << 20});
  for (const LargeCase& c : large_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> ref = load_outputs("reduce", c.name);
    ASSERT_EQ(ref.size(), 1u) << "run scripts/fixtures/gen_reduce.py";
    const Tensor x = base.reshape(c.shape);
    Tensor got = c.fn(x);
    ASSERT_EQ(got.shape(), ref[0].shape());
    EXPECT_CLOSE(got, ref[0], c.rtol, 0);
    Tensor got64 = c.fn(ops::cast(x, DType::kF64));
    EXPECT_CLOSE(got64, ref[0], 1e-10, 0);
  }
}

TEST(Reduce, ResultsDoNotDependOnThreadCount) {
  const Tensor x = large_input({1 << 20});
  const int saved = num_threads();
  std::vector<Tensor> runs[2];
  for (int k = 0; k < 2; ++k) {
    set_num_threads(k + 1);
    runs[k] = {ops::sum(x), ops::sum(x.reshape({1 << 18, 4}), {0}), ops::var(x.reshape({1024, 1024}), {1}),
               ops::logsumexp(x), ops::argmax(x)};
  }
  set_num_threads(saved);
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(array_equal(runs[0][i], runs[1][i])) << "result " << i;
}

// ---- dtype rules -------------------------------------------------------------------

TEST(Reduce, IntegerAndBoolDtypeRules) {
  Tensor i = make<int32_t>({1, 2, 3, 4, 5, 7}, {2, 3});
  Tensor s = ops::sum(i, {1});
  EXPECT_EQ(s.dtype(), DType::kI64);
  EXPECT_EQ(s.to_vector<int64_t>(), (std::vector<int64_t>{6, 16}));
  Tensor m = ops::mean(i, {0});
  EXPECT_EQ(m.dtype(), DType::kF32);
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{2.5f, 3.5f, 5.0f}));
  Tensor v = ops::var(i);
  EXPECT_EQ(v.dtype(), DType::kF32);
  EXPECT_FLOAT_EQ(v.item<float>(), 35.0f / 9.0f);  // np.var([1, 2, 3, 4, 5, 7])
  EXPECT_EQ(ops::std(i).dtype(), DType::kF32);
  EXPECT_EQ(ops::logsumexp(i).dtype(), DType::kF32);
  EXPECT_EQ(ops::prod(i).to_vector<int64_t>(), (std::vector<int64_t>{840}));
  Tensor u = make<uint8_t>({200, 100, 250}, {3});
  EXPECT_EQ(ops::sum(u).item<int64_t>(), 550);  // no u8 overflow
  EXPECT_EQ(ops::max(u).dtype(), DType::kU8);
  EXPECT_EQ(ops::max(u).item<int>(), 250);
  Tensor b = make<bool>({true, false, true, true}, {4});
  EXPECT_EQ(ops::sum(b).dtype(), DType::kI64);
  EXPECT_EQ(ops::sum(b).item<int64_t>(), 3);
  EXPECT_EQ(ops::mean(b).item<float>(), 0.75f);
  EXPECT_EQ(ops::max(b).dtype(), DType::kBool);
  EXPECT_EQ(ops::argmin(b).item<int64_t>(), 1);
  EXPECT_EQ(ops::all(b).dtype(), DType::kBool);
  EXPECT_FALSE(ops::all(b).item<bool>());
  EXPECT_TRUE(ops::any(b).item<bool>());
  // int64 sums wrap like two's complement rather than saturating.
  Tensor big = make<int64_t>({std::numeric_limits<int64_t>::max(), 1}, {2});
  EXPECT_EQ(ops::sum(big).item<int64_t>(), std::numeric_limits<int64_t>::min());
}

TEST(Reduce, HalfPrecisionAccumulatesInF32) {
  // Accumulating in the 16-bit type itself would stall at 2048 (f16) and 256 (bf16).
  Tensor h = ops::cast(Tensor::from_vector(std::vector<float>(4096, 1.0f), {4096}), DType::kF16);
  Tensor sh = ops::sum(h);
  EXPECT_EQ(sh.dtype(), DType::kF16);
  EXPECT_EQ(sh.item<float>(), 4096.0f);
  Tensor b = ops::cast(Tensor::from_vector(std::vector<float>(1000, 1.0f), {1000}), DType::kBF16);
  EXPECT_EQ(ops::sum(b).item<float>(), 1000.0f);
  EXPECT_EQ(ops::mean(b).item<float>(), 1.0f);
}

// sum and mean read f16/bf16 directly (no widened copy): the same values as the f32
// kernel on the widened tensor, rounded once, over leading, inner and all axes.
TEST(Reduce, HalfPrecisionSumsEqualTheWidenedOnes) {
  for (const DType dt : {DType::kF16, DType::kBF16}) {
    const Tensor x = rand_tensor({3, 5, 7, 16}, DType::kF32, -4, 4, 9).to(dt);
    const Tensor x32 = x.to(DType::kF32);
    for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0, 1, 2}, {3}, {1}, {0, 1, 2, 3}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " axes " + std::to_string(axes.size()) + " from " +
                   std::to_string(axes[0]));
      const Tensor s = ops::sum(x, axes), m = ops::mean(x, axes);
      ASSERT_EQ(s.dtype(), dt);
      EXPECT_TRUE(array_equal(s.to(DType::kF32), ops::sum(x32, axes).to(dt).to(DType::kF32)));
      EXPECT_TRUE(array_equal(m.to(DType::kF32), ops::mean(x32, axes).to(dt).to(DType::kF32)));
    }
  }
}

TEST(Reduce, ArgmaxFlatAndFirstOccurrence) {
  Tensor x = make<float>({1, 5, 2, 5, 0, 5}, {2, 3});
  Tensor a = ops::argmax(x);
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(a.dtype(), DType::kI64);
  EXPECT_EQ(a.item<int64_t>(), 1);
  EXPECT_EQ(ops::argmin(x).item<int64_t>(), 4);
  EXPECT_EQ(ops::argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  Tensor k = ops::argmax(x, 1, true);
  EXPECT_EQ(k.shape(), (Shape{2, 1}));
  EXPECT_EQ(k.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
}

TEST(Reduce, ZeroSizeReductions) {
  Tensor e = Tensor::zeros({3, 0});
  EXPECT_EQ(ops::sum(e, {1}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(ops::prod(e, {1}).to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_TRUE(std::isnan(ops::mean(e).item<float>()));
  EXPECT_EQ(ops::logsumexp(e).item<float>(), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(ops::all(e).item<bool>());
  EXPECT_FALSE(ops::any(e).item<bool>());
  Tensor ei = Tensor::zeros({0, 4}, DType::kI32);
  EXPECT_EQ(ops::sum(ei).item<int64_t>(), 0);
  EXPECT_EQ(ops::max(ei, {1}).shape(), (Shape{0}));  // empty output: nothing to reduce
}

// ---- errors ------------------------------------------------------------------------

TEST(Reduce, BadArgumentsGiveTypedErrors) {
  Tensor x = Tensor::zeros({2, 3, 4});
  EXPECT_KILN_ERROR(ops::sum(x, {1, -2}), kInvalidArgument, "repeated axis");
  EXPECT_KILN_ERROR(ops::mean(x, {3}), kOutOfRange, "mean axis 3 is out of range");
  EXPECT_KILN_ERROR(ops::max(x, {-4}), kOutOfRange, "axis");
  EXPECT_KILN_ERROR(ops::argmax(x, 3), kOutOfRange, "axis");
  EXPECT_KILN_ERROR(ops::argmin(x, -4), kOutOfRange, "axis");
  EXPECT_KILN_ERROR(ops::sum(Tensor::scalar(1.0f), {0}), kOutOfRange, "axis");
  EXPECT_KILN_ERROR(ops::var(x, {}, false, -1), kInvalidArgument, "ddof");
  EXPECT_KILN_ERROR(ops::sum(Tensor()), kInvalidArgument, "undefined");
  EXPECT_KILN_ERROR(ops::var(Tensor()), kInvalidArgument, "undefined");
  Tensor e = Tensor::zeros({2, 0});
  EXPECT_KILN_ERROR(ops::max(e, {1}), kInvalidArgument, "empty");
  EXPECT_KILN_ERROR(ops::min(e), kInvalidArgument, "empty");
  EXPECT_KILN_ERROR(ops::argmax(e, 1), kInvalidArgument, "empty");
  EXPECT_KILN_ERROR(ops::argmin(Tensor::zeros({0})), kInvalidArgument, "empty");
  // NumPy raises even when the output is empty too.
  EXPECT_KILN_ERROR(ops::max(Tensor::zeros({0, 0}), {1}), kInvalidArgument, "empty");
}

}  // namespace
}  // namespace kiln::testing
