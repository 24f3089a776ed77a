// The REST JSON codec (src/serving/json_codec.h): predict bodies in row and columnar
// format for every dtype, b64 bytes, every kind of malformed body (each error says
// where), NaN/Infinity both ways, Examples for classify/regress, and the status,
// metadata and error bodies read back with simdjson.
#include <simdjson.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "serving/json_codec.h"
#include "test_util.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln::serving::json {
namespace {

using package::Signature;
using package::TensorInfo;

TensorInfo info(const std::string& name, std::vector<int64_t> shape, DType dt = DType::kF32) {
  TensorInfo t;
  t.name = name;
  t.spec.shape = std::move(shape);
  t.spec.dtype = dt;
  return t;
}

Signature sig_of(std::vector<TensorInfo> inputs, std::vector<TensorInfo> outputs = {}) {
  Signature s;
  s.name = "serving_default";
  s.inputs = std::move(inputs);
  s.outputs = std::move(outputs);
  return s;
}

// decode_predict against one signature whatever the body names.
PredictRequest decode(const std::string& body, const Signature& sig) {
  return decode_predict(body, [&](const std::string&) -> const Signature& { return sig; });
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

const Signature& two_inputs() {
  static const Signature s = sig_of({info("x", {-1, 3}), info("y", {-1, 4}, DType::kU8)});
  return s;
}

// ---- row format ----

TEST(JsonPredict, RowSingleInput) {
  auto sig = sig_of({info("x", {-1, 3})});
  auto r = decode(R"({"instances": [[1, 2.5, -3], [4e1, 0, 6]]})", sig);
  EXPECT_TRUE(r.row_format);
  EXPECT_EQ(r.signature_name, "");
  ASSERT_EQ(r.inputs.size(), 1u);
  const Tensor& x = r.inputs.at("x");
  EXPECT_EQ(x.dtype(), DType::kF32);
  EXPECT_EQ(x.shape(), Shape({2, 3}));
  EXPECT_EQ(values(x), (std::vector<double>{1, 2.5, -3, 40, 0, 6}));
}

TEST(JsonPredict, RowMultiInput) {
  auto r = decode(R"({"instances": [{"x": [1, 2, 3], "y": [1, 2, 3, 4]},
                                    {"y": [5, 6, 7, 255], "x": [4, 5, 6]}]})",
                  two_inputs());
  ASSERT_EQ(r.inputs.size(), 2u);
  EXPECT_EQ(r.inputs.at("x").shape(), Shape({2, 3}));
  EXPECT_EQ(r.inputs.at("y").shape(), Shape({2, 4}));
  EXPECT_EQ(r.inputs.at("y").dtype(), DType::kU8);
  EXPECT_EQ(values(r.inputs.at("x")), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(values(r.inputs.at("y")), (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 255}));
}

TEST(JsonPredict, RowSingleInputNamedObject) {
  auto sig = sig_of({info("x", {-1, 2})});
  auto r = decode(R"({"instances": [{"x": [1, 2]}, {"x": [3, 4]}]})", sig);
  EXPECT_EQ(values(r.inputs.at("x")), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"z": [1, 2]}]})", sig), kInvalidArgument,
                    "instances[0]: unknown input 'z' (the signature's inputs: x)");
}

TEST(JsonPredict, RowScalarsPerInstance) {
  auto sig = sig_of({info("x", {-1}, DType::kI64)});
  auto r = decode(R"({"instances": [1, -2, 9007199254740993]})", sig);
  EXPECT_EQ(r.inputs.at("x").shape(), Shape({3}));
  EXPECT_EQ(r.inputs.at("x").to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 9007199254740993LL}));
}

TEST(JsonPredict, RowShapesChecked) {
  auto sig = sig_of({info("x", {-1, 784})});
  std::string row783 = "[";
  std::string row784 = "[";
  for (int i = 0; i < 784; ++i) {
    if (i) row784 += ",";
    row784 += std::to_string(i % 10);
    if (i < 783) {
      if (i) row783 += ",";
      row783 += std::to_string(i % 10);
    }
  }
  row783 += "]";
  row784 += "]";
  EXPECT_KILN_ERROR(decode("{\"instances\": [" + row783 + "]}", sig), kInvalidArgument,
                    "instances[0]: expected a list of 784 values, got 783");
  EXPECT_KILN_ERROR(decode("{\"instances\": [" + row784 + "," + row784 + "," + row783 + "]}", sig),
                    kInvalidArgument, "instances[2]: expected a list of 784 values, got 783");
  auto r = decode("{\"instances\": [" + row784 + "," + row784 + "]}", sig);
  EXPECT_EQ(r.inputs.at("x").shape(), Shape({2, 784}));
  EXPECT_EQ(r.inputs.at("x").to_vector<float>()[783], 3.0f);
}

TEST(JsonPredict, RowRaggedAndNesting) {
  auto sig = sig_of({info("x", {-1, -1, -1})});
  EXPECT_KILN_ERROR(decode(R"({"instances": [[[1, 2], [3]]]})", sig), kInvalidArgument,
                    "instances[0][1]: expected a list of 2 values, got 1");
  EXPECT_KILN_ERROR(decode(R"({"instances": [[[1, 2], [3, 4]], [[1, 2]]]})", sig), kInvalidArgument,
                    "instances[1]: expected a list of 2 values, got 1");
  EXPECT_KILN_ERROR(decode(R"({"instances": [[[1, 2], [3, [4]]]]})", sig), kInvalidArgument,
                    "instances[0][1][1]: expected a number, got a list");
  EXPECT_KILN_ERROR(decode(R"({"instances": [[[1, 2], 3]]})", sig), kInvalidArgument,
                    "instances[0][1]: expected a list of 2 values, got 3");
  EXPECT_KILN_ERROR(decode(R"({"instances": [[1, 2]]})", sig), kInvalidArgument,
                    "instances[0][0]: expected a list, got 1");
  // Differently shaped rows of a row-format input.
  auto sig2 = sig_of({info("x", {-1, -1})});
  EXPECT_KILN_ERROR(decode(R"({"instances": [[1, 2], [1, 2, 3]]})", sig2), kInvalidArgument,
                    "instances[1]: expected a list of 2 values, got 3");
  auto ok = decode(R"({"instances": [[], []]})", sig2);
  EXPECT_EQ(ok.inputs.at("x").shape(), Shape({2, 0}));
}

TEST(JsonPredict, RowObjectsAndListsDontMix) {
  EXPECT_KILN_ERROR(decode(R"({"instances": [[1, 2, 3]]})", two_inputs()), kInvalidArgument,
                    "instances[0]: expected an object with the signature's inputs (x, y), got a list");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQIDBA=="}]})", two_inputs()), kInvalidArgument,
                    "instances[0]: expected an object with the signature's inputs (x, y), got a b64 value");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"x": [1, 2, 3], "y": [1, 2, 3, 4]}, [1, 2, 3]]})", two_inputs()),
                    kInvalidArgument, "instances[1]: expected an object with the signature's inputs (x, y)");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"x": [1, 2, 3]}]})", two_inputs()), kInvalidArgument,
                    "instances[0]: missing input 'y'");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"x": [1, 2, 3], "y": [1, 2, 3, 4]}, {"x": [1, 2, 3]}]})",
                           two_inputs()),
                    kInvalidArgument, "instances[1]: missing input 'y'");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"x": [1, 2, 3], "y": [1, 2, 3, 4], "z": 1}]})", two_inputs()),
                    kInvalidArgument, "instances[0]: unknown input 'z' (the signature's inputs: x, y)");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"x": [1, 2, 3], "x": [1, 2, 3], "y": [1, 2, 3, 4]}]})", two_inputs()),
                    kInvalidArgument, "input 'x' appears twice");
  auto single = sig_of({info("x", {-1, 2})});
  EXPECT_KILN_ERROR(decode(R"({"instances": [[1, 2], {"x": [1, 2]}]})", single), kInvalidArgument,
                    "instances[1]: expected a value like instances[0], got an object");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"x": [1, 2, 3], "y": [1, 2, 3]}]})", two_inputs()), kInvalidArgument,
                    "instances[0]['y']: expected a list of 4 values, got 3 (input 'y' is u8[-1, 4])");
}

TEST(JsonPredict, RowNeedsBatchDimension) {
  auto sig = sig_of({info("x", {})});
  EXPECT_KILN_ERROR(decode(R"({"instances": [1, 2]})", sig), kInvalidArgument, "needs a batch dimension");
  auto r = decode(R"({"inputs": 2.5})", sig);
  EXPECT_EQ(r.inputs.at("x").shape(), Shape({}));
  EXPECT_EQ(r.inputs.at("x").item<float>(), 2.5f);
}

// ---- columnar format ----

TEST(JsonPredict, ColumnarSingleAndMulti) {
  auto sig = sig_of({info("x", {-1, 3})});
  auto r = decode(R"({"inputs": [[1, 2, 3]], "signature_name": "s", "extra": {"ignored": [1, "x"]}})", sig);
  EXPECT_FALSE(r.row_format);
  EXPECT_EQ(r.signature_name, "s");
  EXPECT_EQ(r.inputs.at("x").shape(), Shape({1, 3}));
  auto r2 = decode(R"({"inputs": {"x": [[1, 2, 3], [4, 5, 6]], "y": [[1, 2, 3, 4]]}})", two_inputs());
  EXPECT_EQ(r2.inputs.at("x").shape(), Shape({2, 3}));  // columnar inputs may differ in batch
  EXPECT_EQ(r2.inputs.at("y").shape(), Shape({1, 4}));
  auto r3 = decode(R"({"inputs": {"x": [[1, 2, 3]]}})", sig);  // a named object for one input
  EXPECT_EQ(r3.inputs.at("x").shape(), Shape({1, 3}));
  auto r4 = decode(R"({"inputs": []})", sig);
  EXPECT_EQ(r4.inputs.at("x").shape(), Shape({0, 3}));
}

TEST(JsonPredict, ColumnarErrors) {
  EXPECT_KILN_ERROR(decode(R"({"inputs": [[1, 2, 3]]})", two_inputs()), kInvalidArgument,
                    "inputs: expected an object with the signature's inputs (x, y), got a list");
  EXPECT_KILN_ERROR(decode(R"({"inputs": {"x": [[1, 2, 3]]}})", two_inputs()), kInvalidArgument,
                    "inputs: missing input 'y'");
  EXPECT_KILN_ERROR(decode(R"({"inputs": {"x": [[1, 2, 3]], "y": [[1, 2, 3, 4]], "q": 1}})", two_inputs()),
                    kInvalidArgument, "inputs: unknown input 'q'");
  EXPECT_KILN_ERROR(decode(R"({"inputs": {"x": [[1, "2", 3]], "y": [[1, 2, 3, 4]]}})", two_inputs()),
                    kInvalidArgument, "inputs['x'][0][1]: expected a number, got a string");
  EXPECT_KILN_ERROR(decode(R"({"inputs": {"x": [[1, 2, 3]], "y": [[1, 2, 3, 4], [1, 2, 3]]}})", two_inputs()),
                    kInvalidArgument, "inputs['y'][1]: expected a list of 4 values, got 3");
  auto sig = sig_of({info("x", {-1, 3})});
  EXPECT_KILN_ERROR(decode(R"({"inputs": [1, 2, 3]})", sig), kInvalidArgument,
                    "inputs[0]: expected a list of 3 values, got 1");
  EXPECT_KILN_ERROR(decode(R"({"inputs": 5})", sig), kInvalidArgument, "inputs: expected a list, got 5");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [[1, 2, null]]})", sig), kInvalidArgument,
                    "inputs[0][2]: expected a number, got null");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [[1, 2, {"a": 1}]]})", sig), kInvalidArgument,
                    "inputs[0][2]: expected a number, got an object");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [[1, 2, true]]})", sig), kInvalidArgument,
                    "inputs[0][2]: expected a number, got true");
}

// ---- dtypes ----

TEST(JsonPredict, EveryDtype) {
  struct Case {
    DType dt;
    std::string body;
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {DType::kBool, "[true, false, true]", {1, 0, 1}},
      {DType::kU8, "[0, 255, 7]", {0, 255, 7}},
      {DType::kI8, "[-128, 127, 0]", {-128, 127, 0}},
      {DType::kI32, "[-2147483648, 2147483647, 5]", {-2147483648.0, 2147483647.0, 5}},
      {DType::kI64, "[-9223372036854775808, 9223372036854775807, 1]", {-9223372036854775808.0, 9223372036854775807.0, 1}},
      {DType::kF16, "[0.5, -2, 65504]", {0.5, -2, 65504}},
      {DType::kBF16, "[0.5, -2, 256]", {0.5, -2, 256}},
      {DType::kF32, "[0.5, -2, 1e-3]", {0.5, -2, static_cast<double>(1e-3f)}},
      {DType::kF64, "[0.1, -2, 1e300]", {0.1, -2, 1e300}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dt)));
    auto sig = sig_of({info("v", {3}, c.dt)});
    auto r = decode("{\"inputs\": " + c.body + "}", sig);
    const Tensor& t = r.inputs.at("v");
    EXPECT_EQ(t.dtype(), c.dt);
    EXPECT_EQ(t.shape(), Shape({3}));
    EXPECT_EQ(values(t), c.want);
  }
  // The 64-bit extremes exactly.
  auto r = decode(R"({"inputs": [-9223372036854775808, 9223372036854775807, 1]})", sig_of({info("v", {3}, DType::kI64)}));
  EXPECT_EQ(r.inputs.at("v").to_vector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 1}));
}

TEST(JsonPredict, NumbersAreRangeChecked) {
  const auto one = [](DType dt) { return sig_of({info("v", {-1}, dt)}); };
  EXPECT_KILN_ERROR(decode(R"({"inputs": [1, 256]})", one(DType::kU8)), kInvalidArgument,
                    "inputs[1]: 256 does not fit in u8 (input 'v')");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [-1]})", one(DType::kU8)), kInvalidArgument, "-1 does not fit in u8");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [-129]})", one(DType::kI8)), kInvalidArgument, "-129 does not fit in i8");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [2147483648]})", one(DType::kI32)), kInvalidArgument,
                    "2147483648 does not fit in i32");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [9223372036854775808]})", one(DType::kI64)), kInvalidArgument,
                    "9223372036854775808 does not fit in i64");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [1.5]})", one(DType::kI32)), kInvalidArgument,
                    "inputs[0]: expected an integer, got 1.5");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [1.0]})", one(DType::kI64)), kInvalidArgument,
                    "expected an integer, got 1.0");  // as TF Serving: 1.0 is not an integer
  EXPECT_KILN_ERROR(decode(R"({"inputs": [true]})", one(DType::kI32)), kInvalidArgument,
                    "expected an integer, got true");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [1]})", one(DType::kBool)), kInvalidArgument,
                    "inputs[0]: expected true or false, got 1");
  EXPECT_KILN_ERROR(decode(R"({"inputs": ["true"]})", one(DType::kBool)), kInvalidArgument,
                    "expected true or false, got a string");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [1e39]})", one(DType::kF32)), kInvalidArgument, "does not fit in f32");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [70000]})", one(DType::kF16)), kInvalidArgument,
                    "70000 does not fit in f16");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [16777217]})", one(DType::kF32)), kInvalidArgument,
                    "16777217 cannot be converted to f32 without loss of precision");
  // Values that round to the largest float are fine (shortest form of FLT_MAX).
  auto r = decode(R"({"inputs": [3.4028235e+38, 16777216, 1e-50]})", one(DType::kF32));
  EXPECT_EQ(r.inputs.at("v").to_vector<float>(),
            (std::vector<float>{std::numeric_limits<float>::max(), 16777216.0f, 0.0f}));
}

TEST(JsonPredict, NonFiniteLiterals) {
  auto sig = sig_of({info("v", {-1})});
  auto r = decode(R"({"signature_name": "NaN Infinity", "inputs": [NaN, Infinity, -Infinity, -Inf, 1]})", sig);
  EXPECT_EQ(r.signature_name, "NaN Infinity");
  auto v = r.inputs.at("v").to_vector<float>();
  ASSERT_EQ(v.size(), 5u);
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[2], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[3], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[4], 1.0f);
  EXPECT_KILN_ERROR(decode(R"({"inputs": [NaN]})", sig_of({info("v", {-1}, DType::kI32)})), kInvalidArgument,
                    "inputs[0]: expected an integer, got NaN");
  // The marker strings are not reachable from a body: a string stays a string.
  EXPECT_KILN_ERROR(decode(R"({"inputs": [NaN, "\u0000NaN"]})", sig), kInvalidArgument, "JSON parse error");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [NaNa]})", sig), kInvalidArgument, "JSON parse error");
}

// ---- b64 ----

TEST(JsonPredict, Base64Bytes) {
  auto sig = sig_of({info("img", {-1, 2, 2}, DType::kU8)});
  auto r = decode(R"({"instances": [{"b64": "AQIDBA=="}, {"b64": "BQYHCA"}]})", sig);
  EXPECT_EQ(r.inputs.at("img").shape(), Shape({2, 2, 2}));
  EXPECT_EQ(values(r.inputs.at("img")), (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Per innermost row, and with whitespace (MIME line breaks).
  auto r2 = decode(R"({"instances": [[{"b64": "AQI="}, {"b64": "A\nwQ="}]]})", sig);
  EXPECT_EQ(values(r2.inputs.at("img")), (std::vector<double>{1, 2, 3, 4}));
  // i8 takes the bytes' bit patterns.
  auto r3 = decode(R"({"inputs": {"b64": "/wE="}})", sig_of({info("b", {2}, DType::kI8)}));
  EXPECT_EQ(values(r3.inputs.at("b")), (std::vector<double>{-1, 1}));
  // Unknown sizes come from the byte count.
  auto r4 = decode(R"({"instances": [{"b64": "AQIDBAUG"}]})", sig_of({info("b", {-1, 2, -1}, DType::kU8)}));
  EXPECT_EQ(r4.inputs.at("b").shape(), Shape({1, 2, 3}));
  auto r5 = decode(R"({"inputs": {"b64": ""}})", sig_of({info("b", {-1}, DType::kU8)}));
  EXPECT_EQ(r5.inputs.at("b").shape(), Shape({0}));

  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQID"}]})", sig), kInvalidArgument,
                    "instances[0]: expected 4 bytes in the b64 value, got 3 (input 'img' is u8[-1, 2, 2])");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQIDBA=="}, {"b64": "AQID"}]})", sig), kInvalidArgument,
                    "instances[1]: expected 4 bytes in the b64 value, got 3");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQ!D"}]})", sig), kInvalidArgument,
                    "instances[0]: bad b64 value: character '!' at offset 2 is not base64");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQ-_"}]})", sig), kInvalidArgument, "is not base64");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQ=DBA=="}]})", sig), kInvalidArgument, "after '=' padding");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQIDB"}]})", sig), kInvalidArgument, "truncated");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQIDBAUG"}]})", sig_of({info("b", {-1, 4, -1}, DType::kU8)})),
                    kInvalidArgument, "6 b64 bytes do not split into rows of 4");
  EXPECT_KILN_ERROR(decode(R"({"instances": [{"b64": "AQIDBA=="}]})", sig_of({info("x", {-1, 4})})),
                    kInvalidArgument,
                    "instances[0]: input 'x' is f32; b64 values need a u8 or i8 input (kiln has no string tensors)");
  EXPECT_KILN_ERROR(decode(R"({"inputs": [{"b64": "AQ=="}]})", sig_of({info("x", {-1})})), kInvalidArgument,
                    "inputs[0]: input 'x' is f32; b64 values need a u8 or i8 input");
  // An object that is not exactly {"b64": "<string>"} is no b64 value.
  EXPECT_KILN_ERROR(decode(R"({"inputs": [[{"b64": "AQ==", "x": 1}]]})", sig_of({info("b", {-1, 1}, DType::kU8)})),
                    kInvalidArgument, "inputs[0][0]: expected an integer, got an object");
}

// ---- malformed bodies ----

TEST(JsonPredict, MalformedBodies) {
  auto sig = sig_of({info("x", {-1, 3})});
  EXPECT_KILN_ERROR(decode("", sig), kInvalidArgument, "the request body is empty");
  EXPECT_KILN_ERROR(decode(" \n\t", sig), kInvalidArgument, "the request body is empty");
  EXPECT_KILN_ERROR(decode("{\"instances\": [[1, 2,", sig), kInvalidArgument, "JSON parse error");
  EXPECT_KILN_ERROR(decode("{\"instances\": [[1, 2, 3]]", sig), kInvalidArgument, "JSON parse error");
  EXPECT_KILN_ERROR(decode("{\"instances\": [[1, 2, 3]]} x", sig), kInvalidArgument, "JSON parse error");
  EXPECT_KILN_ERROR(decode("{'instances': [[1, 2, 3]]}", sig), kInvalidArgument, "JSON parse error");
  EXPECT_KILN_ERROR(decode(std::string("{\"instances\": [[1, 2, 3]]}\0", 27), sig), kInvalidArgument,
                    "JSON parse error");
  EXPECT_KILN_ERROR(decode("{\"signature_name\": \"\xff\", \"instances\": [[1, 2, 3]]}", sig), kInvalidArgument,
                    "JSON parse error");
  EXPECT_KILN_ERROR(decode("[[1, 2, 3]]", sig), kInvalidArgument, "must be a JSON object, got a list");
  EXPECT_KILN_ERROR(decode("3", sig), kInvalidArgument, "must be a JSON object");
  EXPECT_KILN_ERROR(decode(R"({"instances": [[1, 2, 3]], "inputs": [[1, 2, 3]]})", sig), kInvalidArgument,
                    "both 'instances'");
  EXPECT_KILN_ERROR(decode(R"({"signature_name": "a"})", sig), kInvalidArgument, "missing 'inputs' or 'instances'");
  EXPECT_KILN_ERROR(decode(R"({"instances": []})", sig), kInvalidArgument, "'instances' is an empty list");
  EXPECT_KILN_ERROR(decode(R"({"instances": {"x": [1, 2, 3]}})", sig), kInvalidArgument,
                    "'instances' must be a list");
  EXPECT_KILN_ERROR(decode(R"({"signature_name": 3, "instances": [[1, 2, 3]]})", sig), kInvalidArgument,
                    "'signature_name' must be a string, got 3");
  EXPECT_KILN_ERROR(decode(R"({"instances": [[1, 2, 3]], "instances": [[1, 2, 3]]})", sig), kInvalidArgument,
                    "two 'instances' keys");
  // Truncations of a good body: every prefix is an error, never a crash.
  const std::string good = R"({"signature_name": "s", "instances": [{"x": [1, 2.5, 3], "y": {"b64": "AQIDBA=="}}]})";
  EXPECT_NO_THROW(decode(good, two_inputs()));
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_THROW(decode(good.substr(0, n), two_inputs()), InvalidArgumentError) << n;
  }
}

TEST(JsonPredict, DeepNestingIsBounded) {
  auto sig = sig_of({info("x", {-1, 3})});
  // Far deeper than simdjson's depth limit: a parse error, no recursion.
  std::string deep = "{\"inputs\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_KILN_ERROR(decode(deep, sig), kInvalidArgument, "JSON parse error");
  // Deeper than the input's rank but parseable: stops at the rank.
  std::string nested = "{\"instances\": [[1, 2, " + std::string(500, '[') + "3" + std::string(500, ']') + "]]}";
  EXPECT_KILN_ERROR(decode(nested, sig), kInvalidArgument, "instances[0][2]: expected a number, got a list");
  // The first elements promise more values than the body holds: found, not allocated.
  auto sig3 = sig_of({info("x", {-1, -1, -1})});
  std::string ones = "[";
  for (int i = 0; i < 1000; ++i) ones += i ? ",1" : "1";
  ones += "]";
  std::string level1 = "[" + ones;
  for (int i = 1; i < 1000; ++i) level1 += ",0";
  level1 += "]";
  std::string level0 = "[" + level1;
  for (int i = 1; i < 1000; ++i) level0 += ",0";
  level0 += "]";
  EXPECT_KILN_ERROR(decode("{\"inputs\": " + level0 + "}", sig3), kInvalidArgument,
                    "inputs[0][1]: expected a list of 1000 values, got 0");
}

TEST(JsonPredict, SignatureLookup) {
  Signature a = sig_of({info("x", {-1})});
  Signature b = sig_of({info("y", {-1})});
  const auto lookup = [&](const std::string& name) -> const Signature& {
    if (name.empty() || name == "a") return a;
    if (name == "b") return b;
    throw NotFoundError("no signature '" + name + "'");
  };
  EXPECT_EQ(decode_predict(R"({"instances": [1]})", lookup).inputs.count("x"), 1u);
  EXPECT_EQ(decode_predict(R"({"signature_name": "b", "instances": [1]})", lookup).inputs.count("y"), 1u);
  EXPECT_KILN_ERROR(decode_predict(R"({"signature_name": "zzz", "instances": [1]})", lookup), kNotFound, "zzz");
  // A lookup that decodes on the same thread (the thread's parser is in use).
  const auto nested = [&](const std::string& name) -> const Signature& {
    auto inner = decode_predict(R"({"inputs": [7, 8]})", lookup);
    EXPECT_EQ(inner.inputs.at("x").to_vector<float>(), (std::vector<float>{7, 8}));
    return lookup(name);
  };
  auto r = decode_predict(R"({"signature_name": "b", "instances": [1, 2, 3]})", nested);
  EXPECT_EQ(r.inputs.at("y").to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(JsonPredict, ConcurrentDecodes) {
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        std::string body = "{\"instances\": [{\"x\": [" + std::to_string(t) + ", " + std::to_string(i) +
                           ", 1], \"y\": {\"b64\": \"AQIDBA==\"}}]}";
        auto r = decode(body, two_inputs());
        if (r.inputs.at("x").to_vector<float>()[1] == static_cast<float>(i)) ++ok[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 200);
}

// ---- encoding predict responses ----

TEST(JsonEncode, RowAndColumnar) {
  Signature one = sig_of({}, {info("p", {-1, 2})});
  TensorMap out{{"p", Tensor::from_vector<float>({0.5f, 1.0f, -2.0f, 0.1f}, Shape{2, 2})}};
  EXPECT_EQ(encode_predict(one, out, true), R"({"predictions":[[0.5,1.0],[-2.0,0.1]]})");
  EXPECT_EQ(encode_predict(one, out, false), R"({"outputs":[[0.5,1.0],[-2.0,0.1]]})");

  Signature two = sig_of({}, {info("b", {-1}), info("a", {-1, 2}, DType::kI64)});
  TensorMap out2{{"a", Tensor::from_vector<int64_t>({1, 2, 3, -4}, Shape{2, 2})},
                 {"b", Tensor::from_vector<float>({1.5f, 2.5f}, Shape{2})},
                 {"unused", Tensor::scalar<float>(1)}};
  EXPECT_EQ(encode_predict(two, out2, true), R"({"predictions":[{"b":1.5,"a":[1,2]},{"b":2.5,"a":[3,-4]}]})");
  EXPECT_EQ(encode_predict(two, out2, false), R"({"outputs":{"b":[1.5,2.5],"a":[[1,2],[3,-4]]}})");
}

TEST(JsonEncode, EveryDtypeAndSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  Signature s = sig_of({}, {info("o", {-1})});
  const auto enc = [&](Tensor t) { return encode_predict(s, TensorMap{{"o", t}}, false); };
  EXPECT_EQ(enc(Tensor::from_vector<float>({std::nanf(""), inf, -inf, 0.0f, -0.0f}, Shape{5})),
            R"({"outputs":[NaN,Infinity,-Infinity,0.0,-0.0]})");
  EXPECT_EQ(enc(Tensor::from_vector<float>({0.1f, 1e20f, 3.4028235e38f, 1e-45f, 123456.0f}, Shape{5})),
            R"({"outputs":[0.1,1e+20,3.4028235e+38,1e-45,123456.0]})");
  EXPECT_EQ(enc(Tensor::from_vector<double>({0.1, 1e300, -2}, Shape{3})), R"({"outputs":[0.1,1e+300,-2.0]})");
  EXPECT_EQ(enc(Tensor::from_vector<bool>({true, false}, Shape{2})), R"({"outputs":[true,false]})");
  EXPECT_EQ(enc(Tensor::from_vector<uint8_t>({0, 255}, Shape{2})), R"({"outputs":[0,255]})");
  EXPECT_EQ(enc(Tensor::from_vector<int8_t>({-128, 127}, Shape{2})), R"({"outputs":[-128,127]})");
  EXPECT_EQ(enc(Tensor::from_vector<int32_t>({-2147483647 - 1}, Shape{1})), R"({"outputs":[-2147483648]})");
  EXPECT_EQ(enc(Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::min()}, Shape{1})),
            R"({"outputs":[-9223372036854775808]})");
  EXPECT_EQ(enc(Tensor::from_vector<half>({half(0.5f), half(65504.0f), half(-inf)}, Shape{3})),
            R"({"outputs":[0.5,65504.0,-Infinity]})");
  EXPECT_EQ(enc(Tensor::from_vector<bfloat16>({bfloat16(1.0f), bfloat16(0.1f)}, Shape{2})),
            R"({"outputs":[1.0,0.100097656]})");
  EXPECT_EQ(enc(Tensor::scalar<float>(2.5f)), R"({"outputs":2.5})");
  EXPECT_EQ(enc(Tensor::zeros(Shape{2, 0}, DType::kF32)), R"({"outputs":[[],[]]})");
}

TEST(JsonEncode, RowFormatNeedsBatchedOutputs) {
  Signature s = sig_of({}, {info("a", {-1}), info("b", {})});
  TensorMap scalar{{"a", Tensor::from_vector<float>({1, 2}, Shape{2})}, {"b", Tensor::scalar<float>(1)}};
  EXPECT_KILN_ERROR(encode_predict(s, scalar, true), kInvalidArgument, "output 'b' has no shape information");
  EXPECT_EQ(encode_predict(s, scalar, false), R"({"outputs":{"a":[1.0,2.0],"b":1.0}})");
  TensorMap ragged{{"a", Tensor::from_vector<float>({1, 2}, Shape{2})},
                   {"b", Tensor::from_vector<float>({1, 2, 3}, Shape{3})}};
  EXPECT_KILN_ERROR(encode_predict(s, ragged, true), kInvalidArgument,
                    "output 'b' has inconsistent batch size: 3 expecting: 2");
  TensorMap missing{{"a", Tensor::from_vector<float>({1, 2}, Shape{2})}};
  EXPECT_KILN_ERROR(encode_predict(s, missing, true), kInternal, "output 'b'");
  TensorMap empty_rows{{"a", Tensor::zeros(Shape{0}, DType::kF32)}, {"b", Tensor::zeros(Shape{0, 3}, DType::kF32)}};
  EXPECT_EQ(encode_predict(s, empty_rows, true), R"({"predictions":[]})");
}

// encode_predict's outputs read back by decode_predict give the same tensors, bit for bit.
TEST(JsonEncode, RoundTripEveryDtype) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::pair<TensorInfo, Tensor>> cases = {
      {info("f32", {-1, 3}), Tensor::from_vector<float>({0.1f, -1e-38f, 1.4e-45f, 3.4028235e38f, std::nanf(""), -inf},
                                                        Shape{2, 3})},
      {info("f64", {-1}, DType::kF64), Tensor::from_vector<double>({0.1, 5e-324, 1.7976931348623157e308}, Shape{3})},
      {info("f16", {-1}, DType::kF16), Tensor::from_vector<half>({half(0.1f), half(6e-8f), half(-65504.0f)}, Shape{3})},
      {info("bf16", {-1}, DType::kBF16),
       Tensor::from_vector<bfloat16>({bfloat16(0.1f), bfloat16(1e-38f), bfloat16(3e38f)}, Shape{3})},
      {info("i64", {-1}, DType::kI64), Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::min(), 7}, Shape{2})},
      {info("i32", {-1}, DType::kI32), Tensor::from_vector<int32_t>({-5, 2147483647}, Shape{2})},
      {info("u8", {-1}, DType::kU8), Tensor::from_vector<uint8_t>({0, 200}, Shape{2})},
      {info("i8", {-1}, DType::kI8), Tensor::from_vector<int8_t>({-100, 100}, Shape{2})},
      {info("bool", {-1}, DType::kBool), Tensor::from_vector<bool>({true, false}, Shape{2})},
  };
  // Random floats too.
  std::vector<float> rnd(1000);
  uint32_t st = 12345;
  for (auto& f : rnd) {
    st = st * 1664525u + 1013904223u;
    uint32_t bits = st;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) f = 1.0f;
  }
  cases.push_back({info("rnd", {-1}), Tensor::from_vector<float>(rnd, Shape{1000})});
  for (const auto& [ti, t] : cases) {
    SCOPED_TRACE(ti.name);
    Signature s = sig_of({ti}, {ti});
    std::string body = encode_predict(s, TensorMap{{ti.name, t}}, false);
    ASSERT_EQ(body.rfind("{\"outputs\":", 0), 0u);
    body = "{\"inputs\":" + body.substr(11);
    const Tensor back = decode(body, s).inputs.at(ti.name);
    ASSERT_EQ(back.shape(), t.shape());
    ASSERT_EQ(back.dtype(), t.dtype());
    EXPECT_EQ(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()), 0) << body;
  }
}

// ---- examples ----

TEST(JsonExamples, FeatureKinds) {
  auto r = decode_examples(R"({
    "signature_name": "classify",
    "context": {"lang": "en", "scale": [0.5]},
    "examples": [
      {"age": 31, "w": 1.5, "name": "bob", "img": {"b64": "AQID"}, "mixed": [1, 2.5], "ints": [1, -2, 3],
       "tags": ["a", {"b64": "Yg=="}], "flag": true, "empty": [], "nan": [NaN, -Infinity]},
      {"age": [40]}
    ],
    "ignored": 1
  })");
  EXPECT_EQ(r.signature_name, "classify");
  ASSERT_TRUE(r.has_context);
  EXPECT_EQ(r.context.at("lang"), Feature::of_bytes({"en"}));
  EXPECT_EQ(r.context.at("scale"), Feature::of_floats({0.5f}));
  ASSERT_EQ(r.examples.size(), 2u);
  const Features& f = r.examples[0];
  EXPECT_EQ(f.at("age"), Feature::of_ints({31}));
  EXPECT_EQ(f.at("w"), Feature::of_floats({1.5f}));
  EXPECT_EQ(f.at("name"), Feature::of_bytes({"bob"}));
  EXPECT_EQ(f.at("img"), Feature::of_bytes({std::string("\x01\x02\x03", 3)}));
  EXPECT_EQ(f.at("mixed"), Feature::of_floats({1.0f, 2.5f}));  // an int among floats: a float_list
  EXPECT_EQ(f.at("ints").kind, Feature::kInt64);
  ASSERT_EQ(f.at("ints").ints.size(), 3u);
  EXPECT_EQ(f.at("ints").ints[1], -2);
  EXPECT_EQ(f.at("tags").kind, Feature::kBytes);
  EXPECT_EQ(f.at("tags").bytes.at(1), "b");
  EXPECT_EQ(f.at("flag"), Feature::of_ints({1}));
  EXPECT_EQ(f.at("empty").kind, Feature::kNone);
  ASSERT_EQ(f.at("nan").kind, Feature::kFloat);
  EXPECT_TRUE(std::isnan(f.at("nan").floats.at(0)));
  EXPECT_EQ(f.at("nan").floats.at(1), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(r.examples[1].at("age"), Feature::of_ints({40}));

  auto no_ctx = decode_examples(R"({"examples": [{}]})");
  EXPECT_FALSE(no_ctx.has_context);
  EXPECT_EQ(no_ctx.examples.size(), 1u);
}

TEST(JsonExamples, Errors) {
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": [1, "a"]}]})"), kInvalidArgument,
                    "examples[0]['f']: mixes strings and numbers");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": 1}, {"f": [1, null]}]})"), kInvalidArgument,
                    "examples[1]['f'][1]: expected a number, a string or {\"b64\": \"...\"}, got null");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": [[1]]}]})"), kInvalidArgument,
                    "examples[0]['f'][0]: expected a number, a string or {\"b64\": \"...\"}, got a list");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": {"a": 1}}]})"), kInvalidArgument,
                    "examples[0]['f']: expected a number, a string or {\"b64\": \"...\"}, got an object");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": {"b64": "A"}}]})"), kInvalidArgument,
                    "examples[0]['f']: bad b64 value");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": 9223372036854775808}]})"), kInvalidArgument,
                    "does not fit in an int64_list");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": 1e39}]})"), kInvalidArgument,
                    "does not fit in a float_list");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": [0.5, 16777217]}]})"), kInvalidArgument,
                    "examples[0]['f'][1]: 16777217 cannot be converted to float without loss of precision");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [{"f": 1, "f": 2}]})"), kInvalidArgument,
                    "examples[0]['f']: the feature appears twice");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": [[1]]})"), kInvalidArgument,
                    "examples[0]: expected an object of features, got a list");
  EXPECT_KILN_ERROR(decode_examples(R"({"context": 1, "examples": [{}]})"), kInvalidArgument,
                    "context: expected an object of features, got 1");
  EXPECT_KILN_ERROR(decode_examples(R"({"context": {"c": [1, "x"]}, "examples": [{}]})"), kInvalidArgument,
                    "context['c']: mixes strings and numbers");
  EXPECT_KILN_ERROR(decode_examples(R"({"instances": [1]})"), kInvalidArgument, "missing 'examples' key");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": []})"), kInvalidArgument, "'examples' is an empty list");
  EXPECT_KILN_ERROR(decode_examples(R"({"examples": {}})"), kInvalidArgument, "'examples' must be a list");
  EXPECT_KILN_ERROR(decode_examples(""), kInvalidArgument, "empty");
  EXPECT_KILN_ERROR(decode_examples("{\"examples\": [{\"f\": 1}"), kInvalidArgument, "JSON parse error");
}

// ---- other bodies ----

std::string str(simdjson::simdjson_result<simdjson::dom::element> r) {
  return std::string(r.get_string().value());
}
simdjson::dom::array arr(simdjson::simdjson_result<simdjson::dom::element> r) { return r.get_array().value(); }

simdjson::dom::element parse(simdjson::dom::parser& p, const std::string& s) {
  simdjson::dom::element e;
  auto err = p.parse(s).get(e);
  EXPECT_EQ(err, simdjson::SUCCESS) << s;
  return e;
}

TEST(JsonEncode, ClassifyAndRegress) {
  EXPECT_EQ(encode_classify({{{"0", 0.25f}, {"1", 0.75f}}, {{"a\"b", 1.0f}}}),
            R"({"results":[[["0",0.25],["1",0.75]],[["a\"b",1.0]]]})");
  EXPECT_EQ(encode_classify({}), R"({"results":[]})");
  EXPECT_EQ(encode_regress({1.5f, -2.0f, std::nanf("")}), R"({"results":[1.5,-2.0,NaN]})");
}

TEST(JsonEncode, StatusParsesBack) {
  std::vector<VersionStatus> vs(2);
  vs[0].version = 3;
  vs[0].state = VersionState::kAvailable;
  vs[1].version = 12345678901234;
  vs[1].state = VersionState::kEnd;
  vs[1].status = Status{Code::kNotFound, "no \"model.pb\" in /m/12\n"};
  simdjson::dom::parser p;
  auto doc = parse(p, encode_status(vs));
  auto list = arr(doc["model_version_status"]);
  ASSERT_EQ(list.size(), 2u);
  auto v0 = list.at(0);
  EXPECT_EQ(str(v0["version"]), "3");
  EXPECT_EQ(str(v0["state"]), "AVAILABLE");
  EXPECT_EQ(str(v0["status"]["error_code"]), "OK");
  EXPECT_EQ(str(v0["status"]["error_message"]), "");
  auto v1 = list.at(1);
  EXPECT_EQ(str(v1["version"]), "12345678901234");
  EXPECT_EQ(str(v1["state"]), "END");
  EXPECT_EQ(str(v1["status"]["error_code"]), "NOT_FOUND");
  EXPECT_EQ(str(v1["status"]["error_message"]), "no \"model.pb\" in /m/12\n");
  EXPECT_EQ(encode_status({}), R"({"model_version_status":[]})");
}

TEST(JsonEncode, MetadataParsesBack) {
  Signature s1 = sig_of({info("x", {-1, 784}), info("mask", {-1}, DType::kBool)}, {info("probs", {-1, 10})});
  Signature s2 = sig_of({info("x", {-1, 784})}, {info("classes", {-1}, DType::kI64), info("scores", {-1, 10})});
  s2.name = "classify";
  s2.method = package::kClassifyMethod;
  simdjson::dom::parser p;
  auto doc = parse(p, encode_metadata("mnist", 7, {s1, s2}));
  EXPECT_EQ(str(doc["model_spec"]["name"]), "mnist");
  EXPECT_EQ(str(doc["model_spec"]["signature_name"]), "");
  EXPECT_EQ(str(doc["model_spec"]["version"]), "7");
  auto defs = doc["metadata"]["signature_def"]["signature_def"];
  auto sd = defs["serving_default"];
  EXPECT_EQ(str(sd["method_name"]), "tensorflow/serving/predict");
  auto x = sd["inputs"]["x"];
  EXPECT_EQ(str(x["dtype"]), "DT_FLOAT");
  EXPECT_EQ(str(x["name"]), "x");
  EXPECT_FALSE(x["tensor_shape"]["unknown_rank"].get_bool().value());
  auto dims = arr(x["tensor_shape"]["dim"]);
  ASSERT_EQ(dims.size(), 2u);
  EXPECT_EQ(str(dims.at(0)["size"]), "-1");
  EXPECT_EQ(str(dims.at(1)["size"]), "784");
  EXPECT_EQ(str(dims.at(1)["name"]), "");
  EXPECT_EQ(str(sd["inputs"]["mask"]["dtype"]), "DT_BOOL");
  EXPECT_EQ(str(sd["outputs"]["probs"]["dtype"]), "DT_FLOAT");
  auto cl = defs["classify"];
  EXPECT_EQ(str(cl["method_name"]), "tensorflow/serving/classify");
  EXPECT_EQ(str(cl["outputs"]["classes"]["dtype"]), "DT_INT64");
  EXPECT_EQ(arr(cl["outputs"]["classes"]["tensor_shape"]["dim"]).size(), 1u);
}

TEST(JsonEncode, ErrorEscaping) {
  simdjson::dom::parser p;
  const std::string msg = std::string("bad \"x\" \\ path\n\ttab \x01\x1f end ") + "caf\xc3\xa9 \xff\xfe" +
                          " \xe2\x82" + " \xed\xa0\x80 \xf0\x9f\x98\x80 " + std::string(1, '\0') + "z";
  const std::string body = encode_error(msg);
  EXPECT_EQ(body.find('\n'), std::string::npos);
  auto doc = parse(p, body);  // simdjson validates UTF-8
  const std::string want = std::string("bad \"x\" \\ path\n\ttab \x01\x1f end ") + "caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd" +
                           " \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xf0\x9f\x98\x80 " +
                           std::string(1, '\0') + "z";
  EXPECT_EQ(str(doc["error"]), want);
  EXPECT_EQ(encode_error("plain"), R"({"error":"plain"})");
  EXPECT_EQ(encode_error("\x7f/<>"), "{\"error\":\"\x7f/<>\"}");
}

// Decoding the codec's own error bodies: an error message naming a bad key is still
// valid JSON (keys come from the request and may hold anything).
TEST(JsonEncode, ErrorOfHostileKey) {
  try {
    decode(R"({"instances": [{"x\"\u0001\\": 1}]})", sig_of({info("x", {-1})}));
    FAIL();
  } catch (const InvalidArgumentError& e) {
    simdjson::dom::parser p;
    auto doc = parse(p, encode_error(e.message()));
    EXPECT_NE(str(doc["error"]).find("unknown input 'x\"\x01\\'"), std::string::npos);
  }
}

}  // namespace
}  // namespace kiln::serving::json
