// tf.Examples -> a signature's inputs (Service::examples_to_inputs, classify/regress):
// every value lands exactly in the input's dtype (no detour through f64: an int64 above
// 2^53 keeps its last bit), values an integer input cannot hold are rejected, and bad
// examples get INVALID_ARGUMENT naming the example and feature.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "serving/service.h"
#include "test_util.h"

namespace kiln::serving {
namespace {

package::Signature sig_of(DType dtype, std::vector<int64_t> shape) {
  package::Signature s;
  s.name = "classify";
  s.method = package::kClassifyMethod;
  s.inputs.push_back({"x", TensorSpec{std::move(shape), dtype}});
  return s;
}

tensorflow::Example int64_example(std::vector<int64_t> values) {
  tensorflow::Example e;
  auto* list = (*e.mutable_features()->mutable_feature())["x"].mutable_int64_list();
  for (int64_t v : values) list->add_value(v);
  return e;
}

tensorflow::Example float_example(std::vector<float> values) {
  tensorflow::Example e;
  auto* list = (*e.mutable_features()->mutable_feature())["x"].mutable_float_list();
  for (float v : values) list->add_value(v);
  return e;
}

TEST(ExamplesToInputs, Int64AboveTwoToThe53IsExact) {
  const int64_t big = (int64_t{1} << 53) + 1, max = std::numeric_limits<int64_t>::max();
  const tensorflow::Example a = int64_example({big, -big, max}), b = int64_example({1, 2, 3});
  const TensorMap in = Service::examples_to_inputs(sig_of(DType::kI64, {-1, 3}), {&a, &b}, nullptr);
  const Tensor& x = in.at("x");
  ASSERT_EQ(x.dtype(), DType::kI64);
  ASSERT_EQ(x.shape(), Shape({2, 3}));
  const int64_t* v = x.data<int64_t>();
  EXPECT_EQ(v[0], big);
  EXPECT_EQ(v[1], -big);
  EXPECT_EQ(v[2], max);
  EXPECT_EQ(v[5], 3);
}

TEST(ExamplesToInputs, ValuesLandInTheInputDtype) {
  const tensorflow::Example f = float_example({0.1f, -2.5f}), i = int64_example({7, -9});
  {
    const Tensor x = Service::examples_to_inputs(sig_of(DType::kF32, {-1, 2}), {&f}, nullptr).at("x");
    ASSERT_EQ(x.dtype(), DType::kF32);
    EXPECT_EQ(x.data<float>()[0], 0.1f);  // the float itself, bit for bit
    EXPECT_EQ(x.data<float>()[1], -2.5f);
  }
  {
    const Tensor x = Service::examples_to_inputs(sig_of(DType::kI32, {-1, 2}), {&i}, nullptr).at("x");
    ASSERT_EQ(x.dtype(), DType::kI32);
    EXPECT_EQ(x.data<int32_t>()[1], -9);
  }
  {
    const Tensor x = Service::examples_to_inputs(sig_of(DType::kF64, {-1, 2}), {&f}, nullptr).at("x");
    EXPECT_EQ(x.data<double>()[0], static_cast<double>(0.1f));
  }
}

TEST(ExamplesToInputs, IntegersAnInputCannotHoldAreRejected) {
  const tensorflow::Example too_big = int64_example({int64_t{1} << 40, 1});
  EXPECT_KILN_ERROR(Service::examples_to_inputs(sig_of(DType::kI32, {-1, 2}), {&too_big}, nullptr), kInvalidArgument,
                    "examples[0] feature 'x': value 1099511627776 does not fit the input's i32");
  const tensorflow::Example neg = int64_example({-1, 300});
  EXPECT_KILN_ERROR(Service::examples_to_inputs(sig_of(DType::kU8, {-1, 2}), {&neg}, nullptr), kInvalidArgument,
                    "does not fit the input's u8");
  const tensorflow::Example frac = float_example({1.5f, 2});
  EXPECT_KILN_ERROR(Service::examples_to_inputs(sig_of(DType::kI64, {-1, 2}), {&frac}, nullptr), kInvalidArgument,
                    "examples[0] feature 'x': float value 1.5 for the integer input (i64)");
}

TEST(ExamplesToInputs, BadExamplesNameTheExampleAndFeature) {
  const tensorflow::Example ok = int64_example({1, 2}), short_one = int64_example({1});
  EXPECT_KILN_ERROR(Service::examples_to_inputs(sig_of(DType::kI64, {-1, 2}), {&ok, &short_one}, nullptr),
                    kInvalidArgument, "examples[1] feature 'x': expected 2 values");
  tensorflow::Example missing;
  EXPECT_KILN_ERROR(Service::examples_to_inputs(sig_of(DType::kI64, {-1, 2}), {&missing}, nullptr), kInvalidArgument,
                    "examples[0] feature 'x': missing");
  EXPECT_KILN_ERROR(Service::examples_to_inputs(sig_of(DType::kI64, {-1, 2}), {}, nullptr), kInvalidArgument,
                    "the request has no examples");
}

}  // namespace
}  // namespace kiln::serving
