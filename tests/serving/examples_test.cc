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

Features int64_example(std::vector<int64_t> values) { return {{"x", Feature::of_ints(std::move(values))}}; }

Features float_example(std::vector<float> values) { return {{"x", Feature::of_floats(std::move(values))}}; }

TensorMap to_inputs(const package::Signature& sig, std::vector<Features> examples, const Features* context = nullptr) {
  return Service::examples_to_inputs(sig, examples, context);
}

TEST(ExamplesToInputs, Int64AboveTwoToThe53IsExact) {
  const int64_t big = (int64_t{1} << 53) + 1, max = std::numeric_limits<int64_t>::max();
  const Features a = int64_example({big, -big, max}), b = int64_example({1, 2, 3});
  const TensorMap in = to_inputs(sig_of(DType::kI64, {-1, 3}), {a, b});
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
  const Features f = float_example({0.1f, -2.5f}), i = int64_example({7, -9});
  {
    const Tensor x = to_inputs(sig_of(DType::kF32, {-1, 2}), {f}).at("x");
    ASSERT_EQ(x.dtype(), DType::kF32);
    EXPECT_EQ(x.data<float>()[0], 0.1f);  // the float itself, bit for bit
    EXPECT_EQ(x.data<float>()[1], -2.5f);
  }
  {
    const Tensor x = to_inputs(sig_of(DType::kI32, {-1, 2}), {i}).at("x");
    ASSERT_EQ(x.dtype(), DType::kI32);
    EXPECT_EQ(x.data<int32_t>()[1], -9);
  }
  {
    const Tensor x = to_inputs(sig_of(DType::kF64, {-1, 2}), {f}).at("x");
    EXPECT_EQ(x.data<double>()[0], static_cast<double>(0.1f));
  }
}

TEST(ExamplesToInputs, IntegersAnInputCannotHoldAreRejected) {
  const Features too_big = int64_example({int64_t{1} << 40, 1});
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kI32, {-1, 2}), {too_big}), kInvalidArgument,
                    "examples[0] feature 'x': value 1099511627776 does not fit the input's i32");
  const Features neg = int64_example({-1, 300});
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kU8, {-1, 2}), {neg}), kInvalidArgument,
                    "does not fit the input's u8");
  const Features frac = float_example({1.5f, 2});
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kI64, {-1, 2}), {frac}), kInvalidArgument,
                    "examples[0] feature 'x': float value 1.5 for the integer input (i64)");
}

TEST(ExamplesToInputs, BadExamplesNameTheExampleAndFeature) {
  const Features ok = int64_example({1, 2}), short_one = int64_example({1});
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kI64, {-1, 2}), {ok, short_one}),
                    kInvalidArgument, "examples[1] feature 'x': expected 2 values");
  const Features missing;
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kI64, {-1, 2}), {missing}), kInvalidArgument,
                    "examples[0] feature 'x': missing");
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kI64, {-1, 2}), {}), kInvalidArgument,
                    "the request has no examples");
}

TEST(ExamplesToInputs, ContextBytesAndConvertedDtypes) {
  // A feature an example lacks comes from the context; one bytes string fills a u8 row.
  const Features context{{"x", Feature::of_ints({5, 6})}};
  const Tensor x = to_inputs(sig_of(DType::kI64, {-1, 2}), {Features{}, int64_example({1, 2})}, &context).at("x");
  EXPECT_EQ(x.to_vector<int64_t>(), (std::vector<int64_t>{5, 6, 1, 2}));
  const Features img{{"x", Feature::of_bytes({std::string("\x00\xff\x10", 3)})}};
  EXPECT_EQ(to_inputs(sig_of(DType::kU8, {-1, 3}), {img}).at("x").to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 255, 16}));
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kF32, {-1, 3}), {img}), kInvalidArgument,
                    "bytes values fill only u8/i8 inputs");
  // bf16 is filled in f32 and converted once; bool from int64 (nonzero: true).
  const Tensor h = to_inputs(sig_of(DType::kBF16, {-1, 2}), {float_example({1.5f, -3.0f})}).at("x");
  ASSERT_EQ(h.dtype(), DType::kBF16);
  EXPECT_EQ(h.to(DType::kF32).to_vector<float>(), (std::vector<float>{1.5f, -3.0f}));
  const Tensor b = to_inputs(sig_of(DType::kBool, {-1, 2}), {int64_example({0, 7})}).at("x");
  ASSERT_EQ(b.dtype(), DType::kBool);
  EXPECT_EQ(b.to(DType::kI64).to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  // A feature with no list (JSON's []) has no values.
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kF32, {-1, 2}), {Features{{"x", Feature{}}}}), kInvalidArgument,
                    "examples[0] feature 'x': the feature has no values");
}

TEST(ExamplesToInputs, InputsWithoutABatchDimensionAreRefused) {
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kF32, {2}), {float_example({1, 2})}), kInvalidArgument,
                    "has no batch dimension");
  EXPECT_KILN_ERROR(to_inputs(sig_of(DType::kF32, {-1, -1}), {float_example({1, 2})}), kInvalidArgument,
                    "open non-batch dimension");
}

// gRPC and warm-up requests bring tensorflow.Example protos: every list kind and the
// context arrive in kiln's feature model unchanged.
TEST(ExamplesOf, ProtosBecomeFeatures) {
  tensorflow::serving::Input input;
  auto* list = input.mutable_example_list_with_context();
  auto* fm = list->add_examples()->mutable_features()->mutable_feature();
  (*fm)["f"].mutable_float_list()->add_value(0.25f);
  (*fm)["i"].mutable_int64_list()->add_value((int64_t{1} << 60) + 1);
  (*fm)["b"].mutable_bytes_list()->add_value(std::string("a\0b", 3));
  (*fm)["none"];
  (*list->mutable_context()->mutable_features()->mutable_feature())["c"].mutable_int64_list()->add_value(9);
  const Service::Examples ex = Service::examples_of(input);
  ASSERT_EQ(ex.examples.size(), 1u);
  const Features& f = ex.examples[0];
  EXPECT_EQ(f.at("f"), Feature::of_floats({0.25f}));
  EXPECT_EQ(f.at("i"), Feature::of_ints({(int64_t{1} << 60) + 1}));
  EXPECT_EQ(f.at("b"), Feature::of_bytes({std::string("a\0b", 3)}));
  EXPECT_EQ(f.at("none").kind, Feature::kNone);
  ASSERT_TRUE(ex.context.has_value());
  EXPECT_EQ(ex.context->at("c"), Feature::of_ints({9}));
  EXPECT_KILN_ERROR(Service::examples_of(tensorflow::serving::Input()), kInvalidArgument,
                    "Input is empty: it holds no examples");
}

}  // namespace
}  // namespace kiln::serving
