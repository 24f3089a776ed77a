#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/npy.h"
#include "kiln/core/parallel.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

TEST(DType, NamesSizesAndPromotion) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_from_name("float32"), DType::kF32);
  EXPECT_EQ(dtype_from_name("bf16"), DType::kBF16);
  EXPECT_KILN_ERROR(dtype_from_name("complex64"), kInvalidArgument, "unknown dtype 'complex64'");
  EXPECT_EQ(promote_types(DType::kI32, DType::kF16), DType::kF16);
  EXPECT_EQ(promote_types(DType::kBool, DType::kU8), DType::kU8);
  EXPECT_EQ(promote_types(DType::kU8, DType::kI8), DType::kI32);
  EXPECT_EQ(promote_types(DType::kI64, DType::kI32), DType::kI64);
  EXPECT_EQ(promote_types(DType::kF16, DType::kBF16), DType::kF32);
  EXPECT_EQ(promote_types(DType::kF64, DType::kF32), DType::kF64);
}

TEST(Half, RoundTripsAndRoundsToNearestEven) {
  // Every finite half value survives half -> float -> half.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float f = half::to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half::to_float(half::from_float(f))));
      continue;
    }
    ASSERT_EQ(half::from_float(f), h) << "bits " << b;
  }
  EXPECT_EQ(half::from_float(65520.0f), 0x7c00);     // rounds to inf
  EXPECT_EQ(half::from_float(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_FLOAT_EQ(half::to_float(0x0001), 5.9604645e-08f);   // smallest subnormal
  // bf16: ties to even, NaN stays NaN
  EXPECT_EQ(bfloat16::from_float(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(bfloat16::from_float(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bfloat16::to_float(bfloat16::from_float(std::numeric_limits<float>::quiet_NaN()))));
  // Bulk conversions agree with the scalar ones.
  std::vector<float> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(static_cast<float>(i)) * 1000.0f;
  std::vector<half> h(src.size());
  std::vector<bfloat16> bf(src.size());
  convert_float_to_half(src.data(), h.data(), src.size());
  convert_float_to_bf16(src.data(), bf.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(h[i].bits, half::from_float(src[i]));
    ASSERT_EQ(bf[i].bits, bfloat16::from_float(src[i]));
  }
}

// A shape's element count fits int64 or the shape is refused; zero anywhere makes it
// empty however large the other dimensions (an IDX header can say [2^32-1, 2^32-1, 0]).
TEST(Shape, ElementCountsPastInt64AreRefusedAndZeroWins) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_KILN_ERROR(Shape({big, big}), kInvalidArgument, "more than 2^63 - 1 elements");
  EXPECT_EQ(Shape({big, big, 0}).numel(), 0);
  EXPECT_EQ(Shape({0, big, big}).numel(), 0);
  Shape s({big});
  EXPECT_KILN_ERROR(s.push_back(big), kInvalidArgument, "more than 2^63 - 1 elements");
  EXPECT_EQ(s, Shape({big}));  // unchanged
  EXPECT_EQ(Shape({big, 1 << 20}).numel(), big << 20);
}

TEST(Shape, BasicsAndBroadcast) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.dim(-1), 4);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(s.strides()[0], 12);
  EXPECT_EQ(broadcast_shapes({3, 1, 5}, {4, 1}), (Shape{3, 4, 5}));
  EXPECT_EQ(broadcast_shapes({}, {2, 0}), (Shape{2, 0}));
  EXPECT_KILN_ERROR(broadcast_shapes({3}, {4}), kInvalidArgument, "[3] and [4] are not broadcast-compatible");
  EXPECT_KILN_ERROR(s.dim(3), kOutOfRange, "out of range for rank 3");
  EXPECT_KILN_ERROR(Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), kInvalidArgument, "maximum rank");
  EXPECT_KILN_ERROR(Shape({2, -3}), kInvalidArgument, "negative dimension");
}

TEST(Tensor, CreationAccessAndConversion) {
  Tensor t = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.data<float>()[2], 3.25f);
  EXPECT_KILN_ERROR(t.data<double>(), kInvalidArgument, "accessed as f64");
  Tensor i = t.to(DType::kI32);
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 0, 5, 6}));
  EXPECT_EQ(t.to(DType::kBool).to_vector<bool>(), (std::vector<bool>{true, true, true, false, true, true}));
  Tensor r = t.reshape({3, 2});
  EXPECT_TRUE(r.storage() == t.storage());  // shares the buffer
  EXPECT_KILN_ERROR(t.reshape({4, 2}), kInvalidArgument, "cannot reshape");
  Tensor c = t.clone();
  c.data<float>()[0] = 9;
  EXPECT_EQ(t.data<float>()[0], 1.5f);
  EXPECT_EQ(Tensor::scalar<int64_t>(7).item<int64_t>(), 7);
  EXPECT_KILN_ERROR(t.item<float>(), kInvalidArgument, "one element");
  EXPECT_KILN_ERROR(Tensor::from_bytes("abc", 3, {2}, DType::kF32), kInvalidArgument, "needs 8");
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(Tensor::zeros({0, 5}).numel(), 0);
}

TEST(Tensor, PrintsLikeNumpy) {
  Tensor t = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.str(), "[[1, 2, 3], [4, 5, 6]] (i32[2, 3] on cpu:0)");
  Tensor big = Tensor::zeros({100}, DType::kF32);
  EXPECT_NE(big.str(4).find("..."), std::string::npos);
  EXPECT_EQ(Tensor::from_vector<bool>({true, false}, {2}).str(), "[true, false] (bool[2] on cpu:0)");
}

TEST(Tensor, AllcloseSemantics) {
  Tensor a = Tensor::from_vector<float>({1.0f, NAN, INFINITY}, {3});
  Tensor b = Tensor::from_vector<double>({1.0 + 1e-7, NAN, INFINITY}, {3});
  EXPECT_TRUE(allclose(a, b, 1e-6, 0));
  EXPECT_FALSE(allclose(a, Tensor::from_vector<float>({1.1f, NAN, INFINITY}, {3}), 1e-6, 0));
  EXPECT_FALSE(allclose(a, Tensor::from_vector<float>({1.0f, NAN, -INFINITY}, {3})));
  EXPECT_FALSE(allclose(a, Tensor::from_vector<float>({1.0f, NAN}, {2})));
  EXPECT_NE(describe_mismatch(a, Tensor::from_vector<float>({2.0f, NAN, INFINITY}, {3}), 0, 0).find("flat index 0"),
            std::string::npos);
}

TEST(Tensor, BuffersComeFromTheDeviceAllocator) {
  Allocator& alloc = backend_for(Device::cpu()).allocator(0);
  int64_t before = alloc.stats().bytes_in_use;
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::kF32);
    EXPECT_GE(alloc.stats().bytes_in_use, before + (4 << 20));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % Allocator::kAlignment, 0u);
  }
  EXPECT_EQ(alloc.stats().bytes_in_use, before);
}

TEST(Device, ParseAndLookup) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda:1").index, 1);
  EXPECT_KILN_ERROR(parse_device("tpu:0"), kInvalidArgument, "unknown device");
  EXPECT_KILN_ERROR(parse_device("cpu:x"), kInvalidArgument, "bad device index");
  EXPECT_KILN_ERROR(backend_for(Device{DeviceType::kCPU, 3}), kNotFound, "does not exist");
  EXPECT_GE(backend_for(Device::cpu()).properties(0).memory_bytes, 1 << 20);
}

std::string tmp_path(const char* name) { return ::testing::TempDir() + name; }

// Floating to integer conversion is defined for every value (C++ leaves out-of-range
// values undefined; UBSan in the asan preset checks it): truncation toward zero, NaN 0,
// saturation beyond int64, the low bits in narrower types.
TEST(TensorTest, FloatToIntegerConversionIsDefinedForEveryValue) {
  const std::vector<double> v = {-50.5, 300.7, std::nan(""), 1e30, -1e30, 2.9, -2.9, 1e19};
  const Tensor t = make<double>(v, {8});
  const Tensor u8 = t.to(DType::kU8), i32 = t.to(DType::kI32), i64 = t.to(DType::kI64);
  const std::vector<double> want_u8 = {206, 44, 0, 255, 0, 2, 254, 255}, want_i32 = {-50, 300, 0, -1, 0, 2, -2, -1};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(u8.get_double(i), want_u8[i]) << i;
    EXPECT_EQ(i32.get_double(i), want_i32[i]) << i;
  }
  const int64_t* p = i64.data<int64_t>();
  EXPECT_EQ(p[0], -50);
  EXPECT_EQ(p[2], 0);
  EXPECT_EQ(p[3], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(p[4], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(p[6], -2);
  EXPECT_EQ(make<float>({-3.7f, 1e20f}, {2}).to(DType::kI8).get_double(0), -3);
}

TEST(Npy, RoundTripsEveryNumpyDtype) {
  for (DType dt : {DType::kBool, DType::kU8, DType::kI8, DType::kI32, DType::kI64, DType::kF16, DType::kF32,
                   DType::kF64}) {
    Tensor t = rand_tensor({3, 4}, DType::kF64, -100, 100).to(dt);
    std::string p = tmp_path("rt.npy");
    write_npy(p, t);
    Tensor back = read_npy(p);
    EXPECT_TRUE(array_equal(back, t)) << dtype_name(dt);
  }
  Tensor s = Tensor::scalar<float>(2.5f);
  EXPECT_TRUE(array_equal(parse_npy(serialize_npy(s)), s));
  Tensor e = Tensor::zeros({0, 3}, DType::kI64);
  EXPECT_TRUE(array_equal(parse_npy(serialize_npy(e)), e));
  EXPECT_KILN_ERROR(serialize_npy(s.to(DType::kBF16)), kInvalidArgument, "bfloat16");
}

TEST(Npy, ReadsNumpyWrittenFiles) {
  // Written by numpy (scripts/fixtures/gen_elementwise.py): float32 [4, 5].
  Tensor t = load("elementwise/add_same.in0.npy");
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_EQ(t.shape(), (Shape{4, 5}));
  Tensor c = load("elementwise/where.in0.npy");
  EXPECT_EQ(c.dtype(), DType::kBool);
}

TEST(Npy, MalformedInputGivesTypedErrors) {
  std::string good = serialize_npy(Tensor::from_vector<float>({1, 2, 3}, {3}));
  EXPECT_KILN_ERROR(parse_npy("hello"), kDataLoss, "magic");
  EXPECT_KILN_ERROR(parse_npy(good.substr(0, good.size() - 1)), kDataLoss, "data bytes");
  EXPECT_KILN_ERROR(parse_npy(good.substr(0, 20)), kDataLoss, "header longer");
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_KILN_ERROR(parse_npy(fortran), kInvalidArgument, "Fortran");
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  EXPECT_KILN_ERROR(parse_npy(big_endian), kInvalidArgument, "big-endian");
  std::string cplx = good;
  cplx.replace(cplx.find("<f4"), 3, "<c8");
  EXPECT_KILN_ERROR(parse_npy(cplx), kInvalidArgument, "not supported");
  std::string huge = good;
  huge.replace(huge.find("(3,)"), 4, "(99999999999,99999)");
  EXPECT_THROW(parse_npy(huge), Error);
  EXPECT_KILN_ERROR(read_npy(tmp_path("does-not-exist.npy")), kNotFound, "file not found");
  // Truncating at every length never crashes and always gives a typed error.
  for (size_t n = 0; n < good.size(); ++n) EXPECT_THROW(parse_npy(good.substr(0, n)), Error) << n;
}

TEST(FileIo, AtomicWriteReplacesWholeFile) {
  std::string p = tmp_path("atomic.txt");
  write_file_atomic(p, "first version");
  write_file_atomic(p, "second");
  EXPECT_EQ(read_file(p), "second");
  EXPECT_KILN_ERROR(write_file_atomic("/nonexistent-dir/x", "y"), kFailedPrecondition, "cannot create");
}

TEST(Philox, MatchesKnownAnswerAndIsCounterBased) {
  // Known-answer test from the Random123 distribution (philox4x32_10, zero key/counter).
  auto z = Philox::block(0, 0, 0);
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
  EXPECT_NE(Philox::block(1, 0, 0), z);
  Generator g(5);
  EXPECT_EQ(g.reserve(10), 0u);
  EXPECT_EQ(g.reserve(4), 3u);  // 10 words took 3 blocks
}

TEST(Parallel, CoversRangeExactlyOnce) {
  std::vector<int> hits(100000, 0);
  parallel_for(static_cast<int64_t>(hits.size()), 1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
  int old = num_threads();
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(old);
}

}  // namespace
}  // namespace kiln::testing
