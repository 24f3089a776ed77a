#include <cmath>
#include <limits>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/shape.h"

#include "op_table.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;
const std::vector<DType> kF32Only = {DType::kF32, DType::kF64};
const std::vector<DType> kExact = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};

std::vector<OpCase> elementwise_cases() {
  return {
      {"add_same", binary_fn(add)},
      {"add_bcast", binary_fn(add)},
      {"add_scalar", binary_fn(add)},
      {"add_empty", binary_fn(add)},
      {"add_large", binary_fn(add)},
      {"sub_bcast", binary_fn(sub)},
      {"mul_bcast", binary_fn(mul)},
      {"div", binary_fn(div)},
      {"pow", binary_fn(ops::pow), kExact, 4.0},
      {"maximum", binary_fn(maximum)},
      {"minimum", binary_fn(minimum)},
      {"equal", binary_fn(equal)},
      {"less", binary_fn(less)},
      {"greater_equal", binary_fn(greater_equal)},
      {"neg", unary_fn(neg)},
      {"abs", unary_fn(ops::abs)},
      {"sign", unary_fn(sign)},
      {"square", unary_fn(square)},
      {"exp", unary_fn(ops::exp)},
      {"sin", unary_fn(ops::sin)},
      {"cos", unary_fn(ops::cos)},
      {"tanh", unary_fn(ops::tanh)},
      {"sigmoid", unary_fn(sigmoid)},
      {"relu", unary_fn(relu)},
      {"relu6", unary_fn(relu6)},
      {"leaky_relu", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{leaky_relu(in[0], 0.2)}; }},
      {"elu", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{elu(in[0], 1.0)}; }},
      {"gelu", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0], false)}; }},
      {"gelu_tanh", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0], true)}; }},
      {"silu", unary_fn(silu)},
      {"softplus", unary_fn(softplus)},
      {"erf", unary_fn(ops::erf)},
      {"log", unary_fn(ops::log)},
      {"log1p", unary_fn(ops::log1p)},
      {"sqrt", unary_fn(ops::sqrt)},
      {"rsqrt", unary_fn(rsqrt)},
      {"reciprocal", unary_fn(reciprocal)},
      {"floor", unary_fn(ops::floor)},
      {"ceil", unary_fn(ops::ceil)},
      {"round", unary_fn(ops::round)},
      {"clip", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{clip(in[0], -1, 0.5)}; }},
      {"exp_large", unary_fn(ops::exp)},
      {"where", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[0], in[1], in[2])}; }},
  };
}

class ElementwiseOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(ElementwiseOps, MatchesNumpy) { run_op_case("elementwise", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, ElementwiseOps, ::testing::ValuesIn(elementwise_cases()),
                         [](const auto& info) { return info.param.name; });
KILN_CUDA_OP_TABLE(ElementwiseOps, "elementwise", elementwise_cases());

TEST(Elementwise, IntegerArithmeticIsExact) {
  Tensor a = make<int32_t>({1, -2, 3, 7}, {4});
  Tensor b = make<int32_t>({5, 6, -7, 2}, {4});
  EXPECT_EQ(add(a, b).to_vector<int32_t>(), (std::vector<int32_t>{6, 4, -4, 9}));
  EXPECT_EQ(mul(a, b).to_vector<int32_t>(), (std::vector<int32_t>{5, -12, -21, 14}));
  EXPECT_EQ(ops::pow(a, make<int32_t>({2, 3, 0, 2}, {4})).to_vector<int32_t>(), (std::vector<int32_t>{1, -8, 1, 49}));
  // true division promotes to f32
  Tensor q = div(a, b);
  EXPECT_EQ(q.dtype(), DType::kF32);
  EXPECT_FLOAT_EQ(q.to_vector<float>()[3], 3.5f);
  EXPECT_EQ(ops::abs(make<int8_t>({-3, 4}, {2})).to_vector<int8_t>(), (std::vector<int8_t>{3, 4}));
}

TEST(Elementwise, PromotesMixedDtypes) {
  Tensor i = make<int32_t>({1, 2}, {2});
  Tensor f = make<float>({0.5f, 0.25f}, {2});
  Tensor r = add(i, f);
  EXPECT_EQ(r.dtype(), DType::kF32);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1.5f, 2.25f}));
  EXPECT_EQ(add(make<uint8_t>({200}, {1}), make<int8_t>({-1}, {1})).dtype(), DType::kI32);
  EXPECT_EQ(add(f.to(DType::kF16), f.to(DType::kBF16)).dtype(), DType::kF32);
  EXPECT_EQ(ops::exp(i).dtype(), DType::kF32);
  Tensor s = f * 2.0;
  EXPECT_EQ(s.dtype(), DType::kF32);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1.0f, 0.5f}));
}

TEST(Elementwise, LogicalAndCast) {
  Tensor a = make<bool>({true, false, true}, {3});
  Tensor b = make<int32_t>({0, 0, 5}, {3});
  EXPECT_EQ(logical_and(a, b).to_vector<bool>(), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(logical_or(a, b).to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(logical_not(b).to_vector<bool>(), (std::vector<bool>{true, true, false}));
  Tensor c = cast(make<float>({1.7f, -2.2f, 300.0f}, {3}), DType::kI32);
  EXPECT_EQ(c.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 300}));
  Tensor h = cast(make<float>({1.0f / 3}, {1}), DType::kBF16);
  EXPECT_EQ(h.dtype(), DType::kBF16);
  EXPECT_FLOAT_EQ(h.to_vector<float>()[0], 0.333984375f);  // round to nearest even
}

TEST(Elementwise, NanPropagatesThroughMaximum) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor m = maximum(make<float>({nan, 1.0f}, {2}), make<float>({0.0f, nan}, {2}));
  auto v = m.to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_TRUE(std::isnan(v[1]));
}

TEST(Elementwise, WorksOnTransposedInputs) {
  // Inputs that were permuted (and so laid out differently from their source) give
  // the same values as computing first and permuting after.
  Tensor a = rand_tensor({3, 4, 5}, DType::kF32, -2, 2, 11);
  Tensor b = rand_tensor({5, 4, 3}, DType::kF32, -2, 2, 12);
  Tensor at = transpose(a);  // [5, 4, 3]
  EXPECT_CLOSE(add(at, b), transpose(add(a, transpose(b))), 0, 0);
  // exp may differ by an ulp between vector lanes and the scalar tail.
  EXPECT_CLOSE(ops::exp(at), transpose(ops::exp(a)), 1e-6, 0);
  Tensor row = rand_tensor({3}, DType::kF32, -2, 2, 13);
  EXPECT_CLOSE(mul(at, row), transpose(mul(a, reshape(row, {3, 1, 1}))), 0, 0);
}

TEST(Elementwise, BadInputGivesTypedErrors) {
  Tensor a = Tensor::zeros({2, 3});
  Tensor b = Tensor::zeros({4});
  EXPECT_KILN_ERROR(add(a, b), kInvalidArgument, "not broadcast-compatible");
  EXPECT_KILN_ERROR(clip(a, 1, 0), kInvalidArgument, "must be <=");
  EXPECT_KILN_ERROR(add(a, Tensor()), kInvalidArgument, "undefined");
  EXPECT_KILN_ERROR(neg(make<uint8_t>({1}, {1})), kUnimplemented, "no cpu kernel for dtype u8");
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// relu and relu_grad on f16/bf16 work on the bits (no round trip through f32): the same
// results as on the widened values, for zeros of both signs, NaNs of both signs,
// infinities, subnormals and ordinary values.
TEST(Elementwise, SixteenBitReluEqualsTheWidenedOne) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {0.0f, -0.0f, nan, -nan, inf, -inf, 1e-40f, -1e-40f, 1.5f, -2.25f, 3e38f, -7.0f};
  const Tensor g = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {12});
  for (const DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = Tensor::from_vector<float>(v, {12}).to(dt);
    const Tensor got = ops::relu(x);
    ASSERT_EQ(got.dtype(), dt);
    EXPECT_TRUE(array_equal(got.to(DType::kF32), ops::relu(x.to(DType::kF32)).to(dt).to(DType::kF32)));
    const Tensor dx = ops::relu_grad(g.to(dt), x);
    ASSERT_EQ(dx.dtype(), dt);
    EXPECT_TRUE(array_equal(dx.to(DType::kF32), ops::relu_grad(g, x.to(DType::kF32)).to(dt).to(DType::kF32)));
  }
}

}  // namespace
}  // namespace kiln::testing
