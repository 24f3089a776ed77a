// kiln tensors <-> TensorFlow TensorProtos (src/package/tf_tensor_proto.h): what the gRPC
// API, the warm-up replay and the SavedModel importer decode.
#include "package/tf_tensor_proto.h"

#include <gtest/gtest.h>

#include <cmath>

#include "package/tf_types.h"
#include "test_util.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln::tf {
namespace {

// A tensor of each dtype with distinct, exactly representable values.
Tensor sample(DType dt) {
  const std::vector<double> v = {0, 1, -2, 3, 4, -5};
  Tensor f = Tensor::from_vector<double>(v, Shape{2, 3});
  if (dt == DType::kU8 || dt == DType::kBool) f = Tensor::from_vector<double>({0, 1, 2, 3, 4, 255}, Shape{2, 3});
  return f.to(dt);
}

const DType kAll[] = {DType::kBool, DType::kU8,  DType::kI8,  DType::kI32, DType::kI64,
                      DType::kF16,  DType::kBF16, DType::kF32, DType::kF64};

TEST(TensorProto, DtypeNumbersAreTensorFlows) {
  EXPECT_EQ(tf_dtype_enum(DType::kF32), tensorflow::DT_FLOAT);
  EXPECT_EQ(tf_dtype_enum(DType::kF64), tensorflow::DT_DOUBLE);
  EXPECT_EQ(tf_dtype_enum(DType::kI32), tensorflow::DT_INT32);
  EXPECT_EQ(tf_dtype_enum(DType::kU8), tensorflow::DT_UINT8);
  EXPECT_EQ(tf_dtype_enum(DType::kI8), tensorflow::DT_INT8);
  EXPECT_EQ(tf_dtype_enum(DType::kI64), tensorflow::DT_INT64);
  EXPECT_EQ(tf_dtype_enum(DType::kBool), tensorflow::DT_BOOL);
  EXPECT_EQ(tf_dtype_enum(DType::kBF16), tensorflow::DT_BFLOAT16);
  EXPECT_EQ(tf_dtype_enum(DType::kF16), tensorflow::DT_HALF);
  for (DType dt : kAll) {
    EXPECT_EQ(from_tf_dtype(tf_dtype_enum(dt)), dt);
    EXPECT_EQ(tf_dtype_name(dt), tensorflow::DataType_Name(static_cast<tensorflow::DataType>(tf_dtype_enum(dt))));
  }
  EXPECT_FALSE(from_tf_dtype(tensorflow::DT_STRING));
  EXPECT_FALSE(from_tf_dtype(tensorflow::DT_INT16));
}

TEST(TensorProto, ContentRoundTripEveryDtype) {
  for (DType dt : kAll) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor t = sample(dt);
    tensorflow::TensorProto p;
    tensor_to_proto(t, &p);
    EXPECT_EQ(p.dtype(), tf_dtype_enum(dt));
    ASSERT_EQ(p.tensor_shape().dim_size(), 2);
    EXPECT_EQ(p.tensor_shape().dim(0).size(), 2);
    EXPECT_EQ(p.tensor_shape().dim(1).size(), 3);
    EXPECT_EQ(p.tensor_content().size(), t.nbytes());
    // Through the wire format too.
    tensorflow::TensorProto q;
    ASSERT_TRUE(q.ParseFromString(p.SerializeAsString()));
    const Tensor back = tensor_from_proto(q);
    EXPECT_EQ(back.dtype(), dt);
    EXPECT_TRUE(array_equal(back, t)) << back.str() << " vs " << t.str();
  }
}

TEST(TensorProto, TypedValuesRoundTripEveryDtype) {
  for (DType dt : kAll) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor t = sample(dt);
    tensorflow::TensorProto p;
    tensor_to_proto(t, &p, /*typed_values=*/true);
    EXPECT_TRUE(p.tensor_content().empty());
    const Tensor back = tensor_from_proto(p);
    EXPECT_TRUE(array_equal(back, t)) << back.str() << " vs " << t.str();
  }
}

TEST(TensorProto, TypedFieldsAreTensorFlows) {
  tensorflow::TensorProto p;
  tensor_to_proto(Tensor::from_vector<int8_t>({-1, 2}, Shape{2}), &p, true);
  ASSERT_EQ(p.int_val_size(), 2);
  EXPECT_EQ(p.int_val(0), -1);
  tensor_to_proto(Tensor::from_vector<uint8_t>({255}, Shape{1}), &p, true);
  EXPECT_EQ(p.int_val(0), 255);
  tensor_to_proto(Tensor::from_vector<float>({1.5f}, Shape{1}).to(DType::kF16), &p, true);
  ASSERT_EQ(p.half_val_size(), 1);
  EXPECT_EQ(p.half_val(0), 0x3e00);  // 1.5 in binary16
  tensor_to_proto(Tensor::from_vector<float>({1.5f}, Shape{1}).to(DType::kBF16), &p, true);
  EXPECT_EQ(p.half_val(0), 0x3fc0);
  tensor_to_proto(Tensor::from_vector<int64_t>({int64_t{1} << 40}, Shape{1}), &p, true);
  EXPECT_EQ(p.int64_val(0), int64_t{1} << 40);
  tensor_to_proto(Tensor::from_vector<bool>({true, false}, Shape{2}), &p, true);
  ASSERT_EQ(p.bool_val_size(), 2);
  EXPECT_TRUE(p.bool_val(0));
}

TEST(TensorProto, ScalarAndEmpty) {
  tensorflow::TensorProto p;
  p.set_dtype(tensorflow::DT_FLOAT);
  p.add_float_val(2.5f);
  Tensor t = tensor_from_proto(p);  // no dims: a scalar
  EXPECT_EQ(t.rank(), 0);
  EXPECT_EQ(t.item<float>(), 2.5f);

  tensorflow::TensorProto e;
  e.set_dtype(tensorflow::DT_INT64);
  e.mutable_tensor_shape()->add_dim()->set_size(0);
  e.mutable_tensor_shape()->add_dim()->set_size(4);
  t = tensor_from_proto(e);
  EXPECT_EQ(t.shape(), (Shape{0, 4}));
  EXPECT_EQ(t.dtype(), DType::kI64);
}

TEST(TensorProto, OneValueFillsTheShape) {
  tensorflow::TensorProto p;
  p.set_dtype(tensorflow::DT_FLOAT);
  p.mutable_tensor_shape()->add_dim()->set_size(2);
  p.mutable_tensor_shape()->add_dim()->set_size(3);
  p.add_float_val(7.f);
  const Tensor t = tensor_from_proto(p);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  for (float v : t.to_vector<float>()) EXPECT_EQ(v, 7.f);

  tensorflow::TensorProto b;
  b.set_dtype(tensorflow::DT_BOOL);
  b.mutable_tensor_shape()->add_dim()->set_size(4);
  b.add_bool_val(true);
  for (bool v : tensor_from_proto(b).to_vector<bool>()) EXPECT_TRUE(v);
}

TEST(TensorProto, WrongValueCountsAreRefused) {
  tensorflow::TensorProto p;
  p.set_dtype(tensorflow::DT_FLOAT);
  p.mutable_tensor_shape()->add_dim()->set_size(2);
  p.mutable_tensor_shape()->add_dim()->set_size(3);
  for (int i = 0; i < 4; ++i) p.add_float_val(1.f);
  EXPECT_KILN_ERROR(tensor_from_proto(p, "input 'x'"), kInvalidArgument, "input 'x'");
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "needs 6 values in float_val");
  p.clear_float_val();
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "got 0");
  p.add_double_val(1.0);  // the wrong list for DT_FLOAT
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "float_val");
}

TEST(TensorProto, WrongContentSizeIsRefused) {
  tensorflow::TensorProto p;
  p.set_dtype(tensorflow::DT_FLOAT);
  p.mutable_tensor_shape()->add_dim()->set_size(2);
  p.mutable_tensor_shape()->add_dim()->set_size(3);
  p.set_tensor_content(std::string(20, '\0'));
  EXPECT_KILN_ERROR(tensor_from_proto(p, "input 'x'"), kInvalidArgument, "tensor_content has 20 bytes");
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "needs 24");
}

TEST(TensorProto, StringsAndOtherDtypesAreRefused) {
  tensorflow::TensorProto p;
  p.set_dtype(tensorflow::DT_STRING);
  p.mutable_tensor_shape()->add_dim()->set_size(1);
  p.add_string_val("hello");
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "kiln has no string tensors");
  p.Clear();
  p.set_dtype(tensorflow::DT_COMPLEX64);
  p.add_scomplex_val(1.f);
  p.add_scomplex_val(2.f);
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "DT_COMPLEX64");
}

TEST(TensorProto, BadShapesAreRefused) {
  tensorflow::TensorProto p;
  p.set_dtype(tensorflow::DT_FLOAT);
  p.mutable_tensor_shape()->add_dim()->set_size(-1);
  p.add_float_val(1.f);
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "size -1");
  p.mutable_tensor_shape()->Clear();
  p.mutable_tensor_shape()->set_unknown_rank(true);
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "unknown rank");
  p.mutable_tensor_shape()->Clear();
  for (int i = 0; i < 9; ++i) p.mutable_tensor_shape()->add_dim()->set_size(1);
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "rank 9");
  // One value may not fill an absurd shape; sizes whose product overflows are refused.
  p.mutable_tensor_shape()->Clear();
  p.mutable_tensor_shape()->add_dim()->set_size(int64_t{1} << 20);
  p.mutable_tensor_shape()->add_dim()->set_size(int64_t{1} << 20);
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "more than");
  p.mutable_tensor_shape()->add_dim()->set_size(int64_t{1} << 40);
  EXPECT_KILN_ERROR(tensor_from_proto(p), kInvalidArgument, "more than 2^63 - 1 elements");  // kiln::Shape refuses it
}

TEST(TensorProto, BoolContentNormalised) {
  tensorflow::TensorProto p;
  p.set_dtype(tensorflow::DT_BOOL);
  p.mutable_tensor_shape()->add_dim()->set_size(3);
  p.set_tensor_content(std::string("\x00\x01\x07", 3));
  const Tensor t = tensor_from_proto(p);
  const auto* b = static_cast<const uint8_t*>(t.raw_data());
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(b[1], 1);
  EXPECT_EQ(b[2], 1);
}

}  // namespace
}  // namespace kiln::tf
