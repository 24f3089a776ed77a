#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"

#include "test_util.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;
const DType kAllDTypes[] = {DType::kBool, DType::kU8,   DType::kI8,  DType::kI32, DType::kI64,
                            DType::kF16,  DType::kBF16, DType::kF32, DType::kF64};

TEST(Creation, ZerosOnesFullEveryDtype) {
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Tensor z = zeros({2, 3}, t);
    EXPECT_EQ(z.shape(), (Shape{2, 3}));
    EXPECT_EQ(z.dtype(), t);
    EXPECT_EQ(z.to_vector<double>(), std::vector<double>(6, 0.0));
    Tensor o = ones({4}, t);
    EXPECT_EQ(o.dtype(), t);
    EXPECT_EQ(o.to_vector<double>(), std::vector<double>(4, 1.0));
    Tensor f = full({3, 1}, t == DType::kBool ? 1 : 7, t);
    EXPECT_EQ(f.to_vector<double>(), std::vector<double>(3, t == DType::kBool ? 1.0 : 7.0));
  }
  EXPECT_EQ(zeros({}).rank(), 0);
  EXPECT_EQ(zeros({}).numel(), 1);
  EXPECT_EQ(ones({0, 5}).numel(), 0);
  // A large fill runs in parallel chunks; every element must be written.
  Tensor big = full({1000, 1001}, -2.5, DType::kF64);
  std::vector<double> v = big.to_vector<double>();
  EXPECT_EQ(std::count(v.begin(), v.end(), -2.5), 1000 * 1001);
}

TEST(Creation, FullValuesConvertLikeCasts) {
  EXPECT_EQ(full({2}, -3, DType::kI8).to_vector<int8_t>(), (std::vector<int8_t>{-3, -3}));
  EXPECT_EQ(full({1}, 0.1, DType::kF32).item<float>(), 0.1f);
  EXPECT_EQ(full({1}, 1.0 / 3, DType::kBF16).to_vector<float>()[0], 0.333984375f);  // round to nearest even
  EXPECT_TRUE(full({1}, 0.5, DType::kBool).item<bool>());
  EXPECT_TRUE(std::isnan(full({2}, std::nan(""), DType::kF16).to_vector<float>()[1]));
  EXPECT_EQ(full({1}, 1e6, DType::kF16).item<float>(), std::numeric_limits<float>::infinity());
  Tensor negzero = full({3}, -0.0, DType::kF32);
  EXPECT_TRUE(std::signbit(negzero.to_vector<float>()[2]));
  EXPECT_EQ(full({1}, 9007199254740992.0, DType::kI64).item<int64_t>(), int64_t{1} << 53);
}

TEST(Creation, LikeFunctionsFollowTheInput) {
  Tensor x = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor z = zeros_like(x);
  EXPECT_EQ(z.shape(), x.shape());
  EXPECT_EQ(z.dtype(), DType::kI32);
  EXPECT_EQ(z.to_vector<int32_t>(), std::vector<int32_t>(6, 0));
  EXPECT_FALSE(z.is_same(x));
  Tensor o = ones_like(x, DType::kF16);
  EXPECT_EQ(o.dtype(), DType::kF16);
  EXPECT_EQ(o.to_vector<float>(), std::vector<float>(6, 1.0f));
  Tensor f = full_like(x, 9);
  EXPECT_EQ(f.dtype(), DType::kI32);
  EXPECT_EQ(f.to_vector<int32_t>(), std::vector<int32_t>(6, 9));
  EXPECT_EQ(x.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));  // input untouched
}

TEST(Creation, Eye) {
  Tensor i3 = eye(3);
  EXPECT_EQ(i3.shape(), (Shape{3, 3}));
  EXPECT_EQ(i3.dtype(), DType::kF32);
  EXPECT_EQ(i3.to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  Tensor r = eye(2, 4, DType::kI64);
  EXPECT_EQ(r.shape(), (Shape{2, 4}));
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 0, 0, 1, 0, 0}));
  Tensor t = eye(3, 2, DType::kBool);
  EXPECT_EQ(t.to_vector<bool>(), (std::vector<bool>{true, false, false, true, false, false}));
  EXPECT_EQ(eye(0).shape(), (Shape{0, 0}));
  EXPECT_EQ(eye(2, 0).shape(), (Shape{2, 0}));
  EXPECT_EQ(eye(2, -1, DType::kBF16).to_vector<float>(), (std::vector<float>{1, 0, 0, 1}));
}

TEST(Creation, ArangeFollowsNumpyLengthRule) {
  EXPECT_EQ(arange(5).to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(5, DType::kI64).dtype(), DType::kI64);
  EXPECT_EQ(arange(2, 11, 3, DType::kI32).to_vector<int32_t>(), (std::vector<int32_t>{2, 5, 8}));
  EXPECT_EQ(arange(10, 0, -4, DType::kI64).to_vector<int64_t>(), (std::vector<int64_t>{10, 6, 2}));
  EXPECT_EQ(arange(0, 1, 0.1, DType::kF64).numel(), 10);  // ceil(1 / 0.1) = 10, like numpy
  EXPECT_EQ(arange(1, 1.3, 0.1, DType::kF64).numel(), 4);  // (1.3 - 1) / 0.1 = 3.0000000000000004: 4, as numpy
  std::vector<double> f = arange(-1, 1, 0.5, DType::kF64).to_vector<double>();
  EXPECT_EQ(f, (std::vector<double>{-1, -0.5, 0, 0.5}));
  EXPECT_EQ(arange(3, 3).numel(), 0);
  EXPECT_EQ(arange(5, 2).numel(), 0);  // wrong direction: empty, as numpy
  EXPECT_EQ(arange(0, 5, -1).numel(), 0);
  EXPECT_EQ(arange(0.5, 3, 1, DType::kI32).to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(arange(0, 4, 1, DType::kF16).to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  // Large ranges are exact in int64 and split across threads.
  std::vector<int64_t> big = arange(0, 1 << 20, 1, DType::kI64).to_vector<int64_t>();
  ASSERT_EQ(big.size(), size_t{1} << 20);
  bool all_ok = true;
  for (size_t i = 0; i < big.size(); ++i) all_ok &= big[i] == static_cast<int64_t>(i);
  EXPECT_TRUE(all_ok);
}

TEST(Creation, BadArgumentsGiveTypedErrors) {
  EXPECT_KILN_ERROR(zeros({2, -1}), kInvalidArgument, "negative dimension");
  EXPECT_KILN_ERROR(full({2}, 300, DType::kU8), kInvalidArgument, "not representable in dtype u8");
  EXPECT_KILN_ERROR(full({2}, -1, DType::kU8), kInvalidArgument, "not representable");
  EXPECT_KILN_ERROR(full({2}, 1.5, DType::kI32), kInvalidArgument, "not representable");
  EXPECT_KILN_ERROR(full({2}, std::nan(""), DType::kI64), kInvalidArgument, "not representable");
  EXPECT_KILN_ERROR(full({2}, 9223372036854775808.0, DType::kI64), kInvalidArgument, "not representable");
  EXPECT_KILN_ERROR(full_like(Tensor(), 1), kInvalidArgument, "undefined");
  EXPECT_KILN_ERROR(eye(-1), kInvalidArgument, "n must be >= 0");
  EXPECT_KILN_ERROR(eye(2, -2), kInvalidArgument, "m must be >= 0");
  EXPECT_KILN_ERROR(arange(0, 5, 0), kInvalidArgument, "step must be nonzero");
  EXPECT_KILN_ERROR(arange(0, std::numeric_limits<double>::infinity()), kInvalidArgument, "finite");
  EXPECT_KILN_ERROR(arange(0, 300, 1, DType::kU8), kInvalidArgument, "not representable in dtype u8");
  EXPECT_KILN_ERROR(arange(0, 1e30, 1e-30), kInvalidArgument, "too large");
}

}  // namespace
}  // namespace kiln::testing
