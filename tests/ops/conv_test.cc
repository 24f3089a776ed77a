// conv2d (forward, backward data, backward filter) and 2-d pooling against NumPy
// references (scripts/fixtures/gen_nn.py), adjoint identities, f32 (oneDNN) vs
// f64 (direct loop) agreement, and typed errors.
#include <cmath>

#include "kiln/ops/nn.h"
#include "op_table.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;

Conv2dOptions opt(std::vector<int64_t> strides = {1, 1}, Padding padding = "valid",
                  std::vector<int64_t> dilations = {1, 1}, int64_t groups = 1, std::string fmt = "NHWC") {
  Conv2dOptions o;
  o.strides = std::move(strides);
  o.padding = std::move(padding);
  o.dilations = std::move(dilations);
  o.groups = groups;
  o.data_format = std::move(fmt);
  return o;
}

OpFn conv(Conv2dOptions o) {
  return [o](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{conv2d(in[0], in[1], o, in.size() > 2 ? in[2] : Tensor())};
  };
}
OpFn bwd_data(Conv2dOptions o, Shape input_shape) {
  return [o, input_shape](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{conv2d_backward_data(in[0], in[1], input_shape, o)};
  };
}
OpFn bwd_filter(Conv2dOptions o, Shape filter_shape) {
  return [o, filter_shape](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{conv2d_backward_filter(in[0], in[1], filter_shape, o)};
  };
}

constexpr double kConvTol = 10;  // sums of up to ~100 products per output

std::vector<OpCase> conv_cases() {
  return {
      {"conv_nhwc_valid", conv(opt()), kFloatDtypes, kConvTol},
      {"conv_nhwc_same_s2", conv(opt({2, 2}, "same")), kFloatDtypes, kConvTol},
      {"conv_nhwc_same_s2_even_k", conv(opt({2, 3}, "SAME")), kFloatDtypes, kConvTol},
      {"conv_nhwc_explicit", conv(opt({1, 1}, {1, 0, 2, 1})), kFloatDtypes, kConvTol},
      {"conv_nhwc_dil2", conv(opt({1, 1}, "same", {2, 2})), kFloatDtypes, kConvTol},
      {"conv_nhwc_groups2", conv(opt({1, 1}, "same", {1, 1}, 2)), kFloatDtypes, kConvTol},
      {"conv_nhwc_depthwise", conv(opt({2, 2}, "same", {1, 1}, 3)), kFloatDtypes, kConvTol},
      {"conv_nhwc_bias", conv(opt()), kFloatDtypes, kConvTol},
      {"conv_nhwc_bias_s2_dil", conv(opt({2, 1}, {2, 1, 0, 3}, {1, 2})), kFloatDtypes, kConvTol},
      {"conv_nchw_valid", conv(opt({1, 1}, "valid", {1, 1}, 1, "NCHW")), kFloatDtypes, kConvTol},
      {"conv_nchw_same_s2_bias", conv(opt({2, 2}, "same", {1, 1}, 1, "NCHW")), kFloatDtypes, kConvTol},
      {"conv_nchw_groups2_dil2", conv(opt({1, 1}, "same", {2, 2}, 2, "NCHW")), kFloatDtypes, kConvTol},
      {"conv_nchw_depthwise", conv(opt({1, 1}, {1, 1, 1, 1}, {1, 1}, 4, "NCHW")), kFloatDtypes, kConvTol},
  };
}

// Backward cases: (name suffix, options, input shape, filter shape), as in gen_nn.py.
struct BwdSpec {
  std::string name;
  Conv2dOptions o;
  Shape x, w;
};
std::vector<BwdSpec> bwd_specs() {
  return {
      {"nhwc_valid", opt(), {2, 6, 7, 3}, {3, 3, 3, 4}},
      {"nhwc_same_s2", opt({2, 2}, "same"), {2, 9, 8, 3}, {3, 3, 3, 5}},
      {"nhwc_explicit_dil2", opt({1, 1}, {1, 2, 0, 1}, {2, 2}), {1, 9, 8, 2}, {3, 2, 2, 3}},
      {"nhwc_depthwise_s2", opt({2, 2}, "same", {1, 1}, 3), {2, 7, 6, 3}, {3, 3, 1, 6}},
      {"nchw_groups2_s2", opt({2, 2}, "same", {1, 1}, 2, "NCHW"), {2, 4, 9, 8}, {6, 2, 3, 3}},
      {"nchw_valid", opt({1, 1}, "valid", {1, 1}, 1, "NCHW"), {1, 3, 6, 6}, {2, 3, 2, 2}},
  };
}
std::vector<OpCase> bwd_cases() {
  std::vector<OpCase> v;
  for (const auto& s : bwd_specs()) {
    v.push_back({"conv_bwd_data_" + s.name, bwd_data(s.o, s.x), kFloatDtypes, kConvTol});
    v.push_back({"conv_bwd_filter_" + s.name, bwd_filter(s.o, s.w), kFloatDtypes, kConvTol});
  }
  return v;
}

OpFn maxp(std::vector<int64_t> k, std::vector<int64_t> s, Padding p, std::string fmt = "NHWC") {
  return [=](const std::vector<Tensor>& in) { return std::vector<Tensor>{max_pool2d(in[0], k, s, p, fmt)}; };
}
OpFn avgp(std::vector<int64_t> k, std::vector<int64_t> s, Padding p, std::string fmt = "NHWC") {
  return [=](const std::vector<Tensor>& in) { return std::vector<Tensor>{avg_pool2d(in[0], k, s, p, fmt)}; };
}
OpFn global(bool is_max, std::string fmt, bool keepdims = false) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{is_max ? global_max_pool2d(in[0], fmt, keepdims)
                                      : global_avg_pool2d(in[0], fmt, keepdims)};
  };
}

std::vector<OpCase> pool_cases() {
  return {
      {"maxpool_nhwc_valid", maxp({3, 3}, {2, 2}, "valid"), kFloatDtypes},
      {"maxpool_nhwc_same", maxp({3, 3}, {2, 2}, "same"), kFloatDtypes},
      {"maxpool_nchw_same_k2", maxp({2, 2}, {2, 2}, "same", "NCHW"), kFloatDtypes},
      {"avgpool_nhwc_same", avgp({3, 3}, {2, 2}, "same"), kFloatDtypes, 5},
      {"avgpool_nhwc_valid_k2s1", avgp({2, 3}, {1, 1}, "valid"), kFloatDtypes, 5},
      {"avgpool_nchw_same", avgp({3, 3}, {1, 2}, "same", "NCHW"), kFloatDtypes, 5},
      {"avgpool_nhwc_explicit", avgp({3, 3}, {2, 2}, {1, 1, 2, 0}), kFloatDtypes, 5},
      {"global_avg_nhwc", global(false, "NHWC"), kFloatDtypes, 5},
      {"global_max_nhwc", global(true, "NHWC"), kFloatDtypes},
      {"global_avg_nchw_keepdims", global(false, "NCHW", true), kFloatDtypes, 5},
      {"global_max_nchw", global(true, "NCHW"), kFloatDtypes},
  };
}

auto case_name = [](const auto& i) { return i.param.name; };

class ConvOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(ConvOps, MatchesNumpy) { run_op_case("nn", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, ConvOps, ::testing::ValuesIn(conv_cases()), case_name);
KILN_CUDA_OP_TABLE(ConvOps, "nn", conv_cases());

class ConvBackwardOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(ConvBackwardOps, MatchesNumpy) { run_op_case("nn", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, ConvBackwardOps, ::testing::ValuesIn(bwd_cases()), case_name);
KILN_CUDA_OP_TABLE(ConvBackwardOps, "nn", bwd_cases());

class PoolOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(PoolOps, MatchesNumpy) { run_op_case("nn", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, PoolOps, ::testing::ValuesIn(pool_cases()), case_name);
KILN_CUDA_OP_TABLE(PoolOps, "nn", pool_cases());

// ---- adjoint identities and f32/f64 agreement on larger shapes --------------------------

double conv_dot(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

struct ConvConfig {
  const char* name;
  Conv2dOptions o;
  Shape x, w;
};
std::vector<ConvConfig> big_configs() {
  return {
      {"nhwc_3x3_same", opt({1, 1}, "same"), {2, 12, 11, 16}, {3, 3, 16, 32}},
      {"nhwc_s2_same", opt({2, 2}, "same"), {2, 13, 12, 8}, {3, 3, 8, 16}},
      {"nhwc_dil2_explicit", opt({1, 1}, {2, 1, 0, 2}, {2, 2}), {1, 12, 10, 8}, {3, 3, 8, 8}},
      {"nhwc_groups4", opt({1, 1}, "same", {1, 1}, 4), {2, 9, 9, 16}, {3, 3, 4, 32}},
      {"nhwc_depthwise_m2", opt({2, 2}, "same", {1, 1}, 16), {2, 11, 10, 16}, {3, 3, 1, 32}},
      {"nhwc_1x1", opt(), {2, 7, 7, 24}, {1, 1, 24, 40}},
      {"nchw_3x3_valid", opt({1, 1}, "valid", {1, 1}, 1, "NCHW"), {2, 16, 10, 9}, {24, 16, 3, 3}},
      {"nchw_depthwise_s2", opt({2, 2}, "same", {1, 1}, 8, "NCHW"), {2, 8, 11, 12}, {8, 1, 3, 3}},
      {"nchw_groups2_dil", opt({2, 1}, {1, 1, 2, 2}, {1, 2}, 2, "NCHW"), {1, 8, 12, 13}, {12, 4, 3, 3}},
  };
}

TEST(ConvAdjoint, BackwardOpsAreTheVjpOfConv2d) {
  for (const auto& c : big_configs()) {
    for (DType dt : {DType::kF32, DType::kF64}) {
      SCOPED_TRACE(std::string(c.name) + " " + std::string(dtype_name(dt)));
      Tensor x = rand_tensor(c.x, dt, -1, 1, 11), w = rand_tensor(c.w, dt, -1, 1, 12);
      Tensor y = conv2d(x, w, c.o);
      Tensor dy = rand_tensor(y.shape(), dt, -1, 1, 13);
      Tensor dx = conv2d_backward_data(dy, w, c.x, c.o);
      Tensor dw = conv2d_backward_filter(x, dy, c.w, c.o);
      ASSERT_EQ(dx.shape(), c.x);
      ASSERT_EQ(dw.shape(), c.w);
      double lhs = conv_dot(y, dy);
      double tol = (dt == DType::kF32 ? 1e-4 : 1e-10) * (1 + std::abs(lhs));
      // <conv(x, w), dy> = <x, d/dx> = <w, d/dw>: conv is bilinear in (x, w).
      EXPECT_NEAR(conv_dot(x, dx), lhs, tol);
      EXPECT_NEAR(conv_dot(w, dw), lhs, tol);
    }
  }
}

TEST(ConvOneDnn, F32MatchesF64DirectLoops) {
  for (const auto& c : big_configs()) {
    SCOPED_TRACE(c.name);
    Tensor x = rand_tensor(c.x, DType::kF64, -1, 1, 21), w = rand_tensor(c.w, DType::kF64, -1, 1, 22);
    int64_t o = c.o.data_format == "NCHW" ? c.w[0] : c.w[3];
    Tensor b = rand_tensor({o}, DType::kF64, -1, 1, 23);
    Tensor y64 = conv2d(x, w, c.o, b);
    Tensor y32 = conv2d(x.to(DType::kF32), w.to(DType::kF32), c.o, b.to(DType::kF32));
    EXPECT_CLOSE(y32, y64, 1e-4, 1e-4);
    Tensor dy = rand_tensor(y64.shape(), DType::kF64, -1, 1, 24);
    EXPECT_CLOSE(conv2d_backward_data(dy.to(DType::kF32), w.to(DType::kF32), c.x, c.o),
                 conv2d_backward_data(dy, w, c.x, c.o), 1e-4, 1e-4);
    EXPECT_CLOSE(conv2d_backward_filter(x.to(DType::kF32), dy.to(DType::kF32), c.w, c.o),
                 conv2d_backward_filter(x, dy, c.w, c.o), 1e-4, 2e-4);
  }
}

TEST(ConvOneDnn, RepeatedCallsHitTheCacheAndStayCorrect) {
  // Same shapes, different data: cached primitives must not capture buffers.
  Conv2dOptions o = opt({1, 1}, "same", {1, 1}, 16);
  Tensor w1 = rand_tensor({3, 3, 1, 16}, DType::kF32, -1, 1, 31);
  Tensor w2 = rand_tensor({3, 3, 1, 16}, DType::kF32, -1, 1, 32);
  Tensor x = rand_tensor({1, 8, 8, 16}, DType::kF32, -1, 1, 33);
  Tensor a = conv2d(x, w1, o), b = conv2d(x, w2, o);
  EXPECT_CLOSE(a, conv2d(x.to(DType::kF64), w1.to(DType::kF64), o), 1e-4, 1e-5);
  EXPECT_CLOSE(b, conv2d(x.to(DType::kF64), w2.to(DType::kF64), o), 1e-4, 1e-5);
}

TEST(Conv2d, IntegerInputsComputeInF32AndDtypesPromote) {
  Tensor x = make<int32_t>({1, 2, 3, 4}, {1, 2, 2, 1});
  Tensor w = make<int32_t>({1, 1, 1, 1}, {2, 2, 1, 1});
  Tensor y = conv2d(x, w);
  EXPECT_EQ(y.dtype(), DType::kF32);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>{10});
  Tensor y64 = conv2d(x.to(DType::kF32), w.to(DType::kF64));
  EXPECT_EQ(y64.dtype(), DType::kF64);
  EXPECT_EQ(y64.to_vector<double>(), std::vector<double>{10});
}

TEST(Conv2d, EmptyBatchGivesEmptyOutput) {
  Tensor y = conv2d(Tensor::zeros({0, 5, 5, 3}), Tensor::zeros({3, 3, 3, 4}), opt({1, 1}, "same"));
  EXPECT_EQ(y.shape(), (Shape{0, 5, 5, 4}));
  Tensor dw = conv2d_backward_filter(Tensor::zeros({0, 5, 5, 3}), Tensor::zeros({0, 5, 5, 4}), {3, 3, 3, 4},
                                     opt({1, 1}, "same"));
  EXPECT_EQ(dw.to_vector<float>(), std::vector<float>(3 * 3 * 3 * 4, 0.f));
}

// ---- errors ----------------------------------------------------------------------------

TEST(Conv2dErrors, TypedErrorsSayWhatWasExpected) {
  Tensor x = Tensor::zeros({1, 5, 5, 4}), w = Tensor::zeros({3, 3, 4, 8});
  EXPECT_KILN_ERROR(conv2d(Tensor::zeros({5, 5, 4}), w), kInvalidArgument, "input must have rank 4 (NHWC)");
  EXPECT_KILN_ERROR(conv2d(x, Tensor::zeros({3, 4, 8})), kInvalidArgument, "filter must have rank 4 (HWIO");
  EXPECT_KILN_ERROR(conv2d(x, Tensor::zeros({3, 3, 3, 8})), kInvalidArgument, "channel mismatch");
  EXPECT_KILN_ERROR(conv2d(x, Tensor::zeros({8, 4, 3, 3}), opt({1, 1}, "valid", {1, 1}, 1, "NCHW")),
                    kInvalidArgument, "channel mismatch");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1}, "valid", {1, 1}, 3)), kInvalidArgument,
                    "input channels (4) must be divisible by groups (3)");
  EXPECT_KILN_ERROR(conv2d(x, Tensor::zeros({3, 3, 2, 5}), opt({1, 1}, "valid", {1, 1}, 2)), kInvalidArgument,
                    "output channels (5) must be divisible by groups (2)");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1}, "valid", {1, 1}, 0)), kInvalidArgument, "groups must be >= 1");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1}, "full")), kInvalidArgument, "padding must be \"valid\", \"same\"");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1}, {1, 1})), kInvalidArgument, "explicit padding must be four integers");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1}, {1, 1, -1, 0})), kInvalidArgument, "explicit padding");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({0, 1})), kInvalidArgument, "strides must be two integers >= 1");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1, 1})), kInvalidArgument, "strides must be two integers");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1}, "valid", {0, 1})), kInvalidArgument, "dilations must be two");
  Conv2dOptions bad_fmt;
  bad_fmt.data_format = "NWHC";
  EXPECT_KILN_ERROR(conv2d(x, w, bad_fmt), kInvalidArgument, "data_format must be \"NHWC\" or \"NCHW\"");
  EXPECT_KILN_ERROR(conv2d(x, Tensor::zeros({7, 7, 4, 8})), kInvalidArgument, "smaller than the effective window");
  EXPECT_KILN_ERROR(conv2d(x, w, opt({1, 1}, "valid", {3, 3})), kInvalidArgument, "effective window (7)");
  EXPECT_KILN_ERROR(conv2d(x, w, opt(), Tensor::zeros({4})), kInvalidArgument, "bias must have shape [8]");
  EXPECT_KILN_ERROR(conv2d(x, Tensor()), kInvalidArgument, "filter is undefined");
}

TEST(Conv2dErrors, BackwardOpsCheckDyAndShapes) {
  Tensor w = Tensor::zeros({3, 3, 4, 8});
  EXPECT_KILN_ERROR(conv2d_backward_data(Tensor::zeros({1, 4, 4, 8}), w, {1, 5, 5, 4}), kInvalidArgument,
                    "dy must have conv2d's output shape [1, 3, 3, 8]");
  EXPECT_KILN_ERROR(conv2d_backward_filter(Tensor::zeros({1, 5, 5, 4}), Tensor::zeros({1, 3, 3, 7}), {3, 3, 4, 8}),
                    kInvalidArgument, "dy must have conv2d's output shape");
  EXPECT_KILN_ERROR(conv2d_backward_data(Tensor::zeros({1, 3, 3, 8}), w, {5, 5, 4}), kInvalidArgument,
                    "input_shape must be 4 dims");
  EXPECT_KILN_ERROR(conv2d_backward_filter(Tensor::zeros({1, 5, 5, 4}), Tensor::zeros({1, 3, 3, 8}), {3, 3, 3, 8}),
                    kInvalidArgument, "channel mismatch");
}

TEST(PoolErrors, TypedErrors) {
  Tensor x = Tensor::zeros({1, 6, 6, 2});
  EXPECT_KILN_ERROR(max_pool2d(Tensor::zeros({6, 6, 2}), {2, 2}, {2, 2}), kInvalidArgument,
                    "input must have rank 4 (NHWC)");
  EXPECT_KILN_ERROR(max_pool2d(x, {2, 2, 1}, {2, 2}), kInvalidArgument, "ksize must be two integers >= 1");
  EXPECT_KILN_ERROR(avg_pool2d(x, {2, 2}, {0, 2}), kInvalidArgument, "strides must be two integers >= 1");
  EXPECT_KILN_ERROR(avg_pool2d(x, {2, 2}, {2, 2}, "Same-ish"), kInvalidArgument, "padding must be");
  EXPECT_KILN_ERROR(avg_pool2d(x, {2, 2}, {2, 2}, {2, 0, 0, 0}), kInvalidArgument,
                    "padding must be smaller than the window");
  EXPECT_KILN_ERROR(max_pool2d(x, {7, 2}, {1, 1}), kInvalidArgument, "smaller than the effective window");
  EXPECT_KILN_ERROR(global_avg_pool2d(Tensor::zeros({2, 3})), kInvalidArgument, "rank 4");
  EXPECT_KILN_ERROR(global_max_pool2d(x, "HWCN"), kInvalidArgument, "data_format");
}

// The NHWC 2x2/2 fast path (src/backends/cpu/pool_kernels.cc max_pool_nhwc_2x2) against
// windows computed here: odd sizes (the last row/column dropped), channel counts that are
// not a vector multiple, -inf, and NaN windows (NaN wins, as in the generic loop).
TEST(Pool, MaxPool2x2StridedMatchesWindowsComputedByHand) {
  for (const auto& dims : std::vector<std::vector<int64_t>>{{2, 28, 28, 32}, {3, 9, 7, 5}, {1, 4, 6, 1}}) {
    const int64_t N = dims[0], H = dims[1], W = dims[2], C = dims[3];
    Tensor x = rand_tensor(Shape(dims), DType::kF32, -3, 3, 41);
    float* xp = x.data<float>();
    xp[0] = NAN;                                         // window (0, 0, 0), channel 0
    xp[C + std::min<int64_t>(1, C - 1)] = -INFINITY;    // inside window (0, 0, 0)
    if (H >= 4) xp[(2 * W + 3) * C] = NAN;               // window (0, 1, 1), second entry
    Tensor y = max_pool2d(x, {2, 2}, {2, 2});
    ASSERT_EQ(y.shape(), Shape({N, H / 2, W / 2, C}));
    const float* yp = y.data<float>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t oh = 0; oh < H / 2; ++oh)
        for (int64_t ow = 0; ow < W / 2; ++ow)
          for (int64_t c = 0; c < C; ++c) {
            float want = -INFINITY;
            bool nan = false;
            for (int64_t dh = 0; dh < 2; ++dh)
              for (int64_t dw = 0; dw < 2; ++dw) {
                const float e = xp[((n * H + 2 * oh + dh) * W + 2 * ow + dw) * C + c];
                nan = nan || std::isnan(e);
                want = std::max(want, e);
              }
            const float got = yp[((n * (H / 2) + oh) * (W / 2) + ow) * C + c];
            if (nan) {
              ASSERT_TRUE(std::isnan(got)) << n << " " << oh << " " << ow << " " << c;
            } else {
              ASSERT_EQ(got, want) << n << " " << oh << " " << ow << " " << c;
            }
          }
  }
}

TEST(Pool, MaxPoolIgnoresPaddingForNegativeInputs) {
  // With "same" padding a window overlapping the border must not see a 0 pad value.
  Tensor x = make<float>({-5, -4, -3, -2}, {1, 2, 2, 1});
  Tensor y = max_pool2d(x, {3, 3}, {1, 1}, "same");
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-2, -2, -2, -2}));
  Tensor a = avg_pool2d(x, {3, 3}, {1, 1}, "same");
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{-3.5f, -3.5f, -3.5f, -3.5f}));
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// bf16 convolutions run on oneDNN's native bf16 kernels where it has them (f32
// accumulation, bf16 in and out): within bf16 rounding of the f32 kernels on the widened
// tensors, forward with bias, backward data and backward filter, for the cnn's layers
// (one input channel, 32 -> 64) and a strided, padded one. The op's registered kernel
// is used, whichever path it takes on this CPU.
TEST(Conv2dBf16, MatchesTheWidenedF32Kernels) {
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  const std::vector<Case> cases = {{{4, 28, 28, 1}, {3, 3, 1, 32}, opt({1, 1}, "same")},
                                   {{4, 14, 14, 32}, {3, 3, 32, 64}, opt({1, 1}, "same")},
                                   {{2, 9, 11, 16}, {3, 3, 16, 32}, opt({2, 2}, "same")}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.x.str() + " * " + c.w.str());
    const Tensor x = rand_tensor(c.x, DType::kF32, -1, 1, 1).to(DType::kBF16);
    const Tensor w = rand_tensor(c.w, DType::kF32, -1, 1, 2).to(DType::kBF16);
    const Tensor b = rand_tensor({c.w[3]}, DType::kF32, -1, 1, 3).to(DType::kBF16);
    const Tensor y = conv2d(x, w, c.o, b);
    ASSERT_EQ(y.dtype(), DType::kBF16);
    const Tensor y32 = conv2d(x.to(DType::kF32), w.to(DType::kF32), c.o, b.to(DType::kF32));
    EXPECT_CLOSE(y.to(DType::kF32), y32, 1e-2, 1e-2);
    const Tensor dy = rand_tensor(y.shape(), DType::kF32, -1, 1, 4).to(DType::kBF16);
    const Tensor dx = conv2d_backward_data(dy, w, c.x, c.o);
    ASSERT_EQ(dx.dtype(), DType::kBF16);
    EXPECT_CLOSE(dx.to(DType::kF32), conv2d_backward_data(dy.to(DType::kF32), w.to(DType::kF32), c.x, c.o), 1e-2,
                 1e-2);
    const Tensor dw = conv2d_backward_filter(x, dy, c.w, c.o);
    ASSERT_EQ(dw.dtype(), DType::kBF16);
    // Sums of up to 4 * 28 * 28 products: bf16's 8 bits of mantissa on the result.
    EXPECT_CLOSE(dw.to(DType::kF32), conv2d_backward_filter(x.to(DType::kF32), dy.to(DType::kF32), c.w, c.o), 1e-2,
                 1e-2);
  }
}

}  // namespace
}  // namespace kiln::testing
