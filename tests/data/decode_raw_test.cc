#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/data/decode_raw.h"

#include <cstring>

#include "test_util.h"

namespace kiln::data {
namespace {

std::string bytes_of(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

TEST(DecodeRaw, BytesAndFloatsLikeTfIoDecodeRaw) {
  StringTensor s(Shape{2}, {std::string("\x01\x02\x03", 3), std::string("\xff\x00\x07", 3)});
  Tensor u8 = decode_raw(s, DType::kU8);
  EXPECT_EQ(u8.shape(), Shape({2, 3}));
  EXPECT_EQ(u8.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 2, 3, 255, 0, 7}));
  Tensor img = decode_raw(StringTensor(Shape{1}, {std::string(6, 'a')}), DType::kU8, {2, 3});
  EXPECT_EQ(img.shape(), Shape({1, 2, 3}));
  // Little-endian floats (tf.io.decode_raw's default).
  StringTensor f(Shape{2}, {bytes_of({1.5f, -2}), bytes_of({0.25f, 8})});
  EXPECT_EQ(decode_raw(f, DType::kF32).to_vector<float>(), (std::vector<float>{1.5f, -2, 0.25f, 8}));
  // A scalar string gives a vector.
  EXPECT_EQ(decode_raw(StringTensor::scalar("ab"), DType::kU8).shape(), Shape({2}));
}

TEST(DecodeRaw, SizeMismatchesAreClearErrors) {
  StringTensor s(Shape{2}, {std::string(4, 'x'), std::string(3, 'y')});
  EXPECT_KILN_ERROR(decode_raw(s, DType::kU8), kInvalidArgument, "value 1 has 3 bytes, expected 4");
  EXPECT_KILN_ERROR(decode_raw(StringTensor::scalar("abc"), DType::kF32), kInvalidArgument, "not a multiple of 4");
  EXPECT_KILN_ERROR(decode_raw(s, DType::kU8, {2, 3}), kInvalidArgument, "value 0 has 4 bytes, expected 6");
  EXPECT_KILN_ERROR(decode_raw(s, DType::kBool), kInvalidArgument, "bool");
}

}  // namespace
}  // namespace kiln::data
