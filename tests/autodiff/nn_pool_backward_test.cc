// max_pool2d_backward / avg_pool2d_backward kernels against a naive f64 reference
// written here from the documented rules (TensorFlow "same" padding, padded cells
// excluded, ties to the first maximum in row-major window order).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/nn_grad.h"
#include "kiln/ops/reduce.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using ops::Padding;

struct PoolCase {
  std::string name;
  Shape x;  // in data_format
  std::vector<int64_t> ksize, strides;
  Padding padding;
  std::string fmt;
};

struct Dims {
  int64_t n, c, h, w, oh, ow, pt, pl;
};

// Output size and leading padding per dimension, computed independently of nn_geometry.h.
void dim_rule(const Padding& p, int64_t in, int64_t k, int64_t s, int64_t lo_pad, int64_t hi_pad, int64_t& out,
              int64_t& lo) {
  if (p.mode == "same") {
    out = (in + s - 1) / s;
    const int64_t total = std::max<int64_t>((out - 1) * s + k - in, 0);
    lo = total / 2;  // the odd pixel goes to the bottom/right
  } else {
    lo = lo_pad;
    out = (in + lo_pad + hi_pad - k) / s + 1;
  }
}

Dims dims_of(const PoolCase& pc) {
  const bool nchw = pc.fmt == "NCHW";
  Dims d{pc.x[0], nchw ? pc.x[1] : pc.x[3], nchw ? pc.x[2] : pc.x[1], nchw ? pc.x[3] : pc.x[2], 0, 0, 0, 0};
  const bool ex = pc.padding.mode == "explicit";
  dim_rule(pc.padding, d.h, pc.ksize[0], pc.strides[0], ex ? pc.padding.pads[0] : 0, ex ? pc.padding.pads[1] : 0,
           d.oh, d.pt);
  dim_rule(pc.padding, d.w, pc.ksize[1], pc.strides[1], ex ? pc.padding.pads[2] : 0, ex ? pc.padding.pads[3] : 0,
           d.ow, d.pl);
  return d;
}

// Reference dx in f64 (layout of the case).
std::vector<double> reference(const PoolCase& pc, bool max, const std::vector<double>& x,
                              const std::vector<double>& dy) {
  const Dims d = dims_of(pc);
  const bool nchw = pc.fmt == "NCHW";
  auto xi = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return nchw ? ((n * d.c + c) * d.h + h) * d.w + w : ((n * d.h + h) * d.w + w) * d.c + c;
  };
  auto yi = [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return nchw ? ((n * d.c + c) * d.oh + h) * d.ow + w : ((n * d.oh + h) * d.ow + w) * d.c + c;
  };
  std::vector<double> dx(static_cast<size_t>(d.n * d.c * d.h * d.w), 0.0);
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t c = 0; c < d.c; ++c)
      for (int64_t oh = 0; oh < d.oh; ++oh)
        for (int64_t ow = 0; ow < d.ow; ++ow) {
          std::vector<int64_t> cells;  // real cells of the window, row-major
          for (int64_t i = 0; i < pc.ksize[0]; ++i)
            for (int64_t j = 0; j < pc.ksize[1]; ++j) {
              const int64_t h = oh * pc.strides[0] - d.pt + i, w = ow * pc.strides[1] - d.pl + j;
              if (h >= 0 && h < d.h && w >= 0 && w < d.w) cells.push_back(xi(n, c, h, w));
            }
          const double g = dy[yi(n, c, oh, ow)];
          if (max) {
            int64_t best = cells[0];
            for (int64_t e : cells)
              if (x[e] > x[best]) best = e;
            dx[best] += g;
          } else {
            for (int64_t e : cells) dx[e] += g / static_cast<double>(cells.size());
          }
        }
  return dx;
}

Shape out_shape(const PoolCase& pc) {
  const Dims d = dims_of(pc);
  return pc.fmt == "NCHW" ? Shape{d.n, d.c, d.oh, d.ow} : Shape{d.n, d.oh, d.ow, d.c};
}

const std::vector<PoolCase> kCases = {
    {"nhwc_valid_2x2_s2", {2, 6, 6, 3}, {2, 2}, {2, 2}, "valid", "NHWC"},
    {"nhwc_same_3x3_s2", {2, 7, 6, 4}, {3, 3}, {2, 2}, "same", "NHWC"},
    {"nhwc_same_2x2_s1", {1, 5, 5, 8}, {2, 2}, {1, 1}, "same", "NHWC"},
    {"nhwc_valid_3x2_s1x2", {1, 6, 7, 5}, {3, 2}, {1, 2}, "valid", "NHWC"},
    {"nhwc_same_s3_gt_k2", {2, 8, 8, 3}, {2, 2}, {3, 3}, "same", "NHWC"},
    {"nhwc_explicit", {1, 5, 6, 2}, {3, 3}, {2, 1}, Padding{1, 2, 0, 1}, "NHWC"},
    {"nchw_valid_2x2_s2", {2, 3, 6, 6}, {2, 2}, {2, 2}, "valid", "NCHW"},
    {"nchw_same_3x3_s2", {1, 4, 7, 5}, {3, 3}, {2, 2}, "same", "NCHW"},
    {"nchw_explicit_s1", {1, 2, 5, 5}, {2, 3}, {1, 1}, Padding{1, 1, 2, 0}, "NCHW"},
    {"nchw_same_s2x3", {1, 2, 7, 8}, {3, 2}, {2, 3}, "same", "NCHW"},
    {"nchw_valid_leftover_cols", {2, 3, 5, 7}, {2, 2}, {2, 2}, "valid", "NCHW"},
    {"nchw_explicit_wide_window_s3", {1, 2, 6, 11}, {2, 4}, {1, 3}, Padding{0, 1, 2, 3}, "NCHW"},
    {"nhwc_cnn_sized", {4, 14, 14, 32}, {2, 2}, {2, 2}, "valid", "NHWC"},
    {"nhwc_channel_blocks_overlap", {1, 6, 6, 80}, {3, 3}, {2, 2}, "same", "NHWC"},
    {"nhwc_channel_blocks_tiled", {1, 4, 4, 130}, {2, 2}, {2, 2}, "valid", "NHWC"},
    {"nhwc_odd_same_tiled", {3, 5, 7, 9}, {2, 2}, {2, 2}, "same", "NHWC"},
    {"nhwc_valid_leftover_rows", {2, 5, 5, 4}, {2, 2}, {2, 2}, "valid", "NHWC"},
    {"nhwc_cnn_sized_same_3x3", {2, 15, 15, 16}, {3, 3}, {2, 2}, "same", "NHWC"},
};

class PoolBackward : public ::testing::TestWithParam<size_t> {};

Tensor run(const PoolCase& pc, bool max, const Tensor& x, const Tensor& dy) {
  return max ? ops::max_pool2d_backward(x, dy, pc.ksize, pc.strides, pc.padding, pc.fmt)
             : ops::avg_pool2d_backward(dy, pc.x, pc.ksize, pc.strides, pc.padding, pc.fmt);
}

TEST_P(PoolBackward, MatchesReferenceAllDtypes) {
  const PoolCase& pc = kCases[GetParam()];
  SCOPED_TRACE(pc.name);
  // Values on a grid of 1/64: distinct enough that f16 keeps the order of neighbours
  // (mostly), exactly representable in every float dtype.
  Tensor x64 = ops::div(ops::round(ops::mul(rand_tensor(pc.x, DType::kF64, -1, 1, 11), ops::scalar(64.0, DType::kF64))),
                        ops::scalar(64.0, DType::kF64));
  Tensor dy64 = rand_tensor(out_shape(pc), DType::kF64, -1, 1, 12);
  for (bool max : {true, false}) {
    SCOPED_TRACE(max ? "max" : "avg");
    Tensor ref = Tensor::from_vector<double>(reference(pc, max, x64.to_vector<double>(), dy64.to_vector<double>()),
                                             pc.x);
    for (DType t : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(dtype_name(t)));
      Tensor xt = x64.to(t), dyt = dy64.to(t);
      // 16-bit dy is rounded first: compare with the reference of the rounded values.
      Tensor want = t == DType::kF16 || t == DType::kBF16
                        ? Tensor::from_vector<double>(
                              reference(pc, max, xt.to(DType::kF64).to_vector<double>(),
                                        dyt.to(DType::kF64).to_vector<double>()),
                              pc.x)
                        : ref;
      Tensor dx = run(pc, max, xt, dyt);
      ASSERT_EQ(dx.dtype(), t);
      ASSERT_EQ(dx.shape(), pc.x);
      const double tol = t == DType::kF64 ? 1e-12 : t == DType::kF32 ? 1e-5 : t == DType::kF16 ? 1e-2 : 4e-2;
      EXPECT_CLOSE(dx.to(DType::kF64), want, tol, tol);
    }
  }
}

// <avg_pool2d(x), dy> == <x, avg_pool2d_backward(dy)> (the adjoint identity).
TEST_P(PoolBackward, AvgIsTheAdjointOfAvgPool) {
  const PoolCase& pc = kCases[GetParam()];
  for (DType t : {DType::kF64, DType::kF32}) {
    Tensor x = rand_tensor(pc.x, t, -1, 1, 21), dy = rand_tensor(out_shape(pc), t, -1, 1, 22);
    double lhs = ops::sum(ops::mul(ops::avg_pool2d(x, pc.ksize, pc.strides, pc.padding, pc.fmt), dy))
                     .to(DType::kF64)
                     .to_vector<double>()[0];
    double rhs = ops::sum(ops::mul(x, run(pc, false, x, dy))).to(DType::kF64).to_vector<double>()[0];
    EXPECT_NEAR(lhs, rhs, t == DType::kF64 ? 1e-10 : 1e-3 * (1 + std::fabs(lhs)));
  }
}

std::string pool_case_name(const ::testing::TestParamInfo<size_t>& info) { return kCases[info.param].name; }
INSTANTIATE_TEST_SUITE_P(Cases, PoolBackward, ::testing::Range<size_t>(0, kCases.size()), pool_case_name);

// Ties: every cell equal. Each window's gradient goes to its first real cell
// (top-left after clipping padding), checked by hand.
TEST(MaxPoolBackward, TiesGoToTheFirstCellOfTheWindow) {
  for (DType t : {DType::kF64, DType::kF32, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    // 4x4, 2x2 stride 2 valid: windows start at (0,0), (0,2), (2,0), (2,2).
    Tensor x = ops::ones({1, 4, 4, 1}, t);
    Tensor dy = make<double>({1, 2, 3, 4}, {1, 2, 2, 1}).to(t);
    Tensor dx = ops::max_pool2d_backward(x, dy, {2, 2}, {2, 2});
    std::vector<double> want(16, 0.0);
    want[0] = 1;
    want[2] = 2;
    want[8] = 3;
    want[10] = 4;
    EXPECT_CLOSE(dx.to(DType::kF64), make<double>(want, {1, 4, 4, 1}), 0, 0);

    // 3x3, 2x2 stride 1 "same" (pad bottom/right by 1): window (i, j) covers rows
    // i..i+1 and cols j..j+1 clipped; its first cell is (i, j) itself. So every
    // cell gets exactly its own window's dy.
    Tensor x3 = ops::full({1, 1, 3, 3}, 0.5, t);
    Tensor dy3 = make<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}).to(t);
    EXPECT_CLOSE(ops::max_pool2d_backward(x3, dy3, {2, 2}, {1, 1}, "same", "NCHW").to(DType::kF64),
                 dy3.to(DType::kF64), 0, 0);

    // Two maxima in one window: x = [[1, 5], [5, 0]] -> the gradient goes to (0, 1).
    Tensor x2 = make<double>({1, 5, 5, 0}, {1, 2, 2, 1}).to(t);
    Tensor dx2 = ops::max_pool2d_backward(x2, make<double>({7}, {1, 1, 1, 1}).to(t), {2, 2}, {2, 2});
    EXPECT_CLOSE(dx2.to(DType::kF64), make<double>({0, 7, 0, 0}, {1, 2, 2, 1}), 0, 0);
  }
}

// Ties in CNN-sized f32 inputs (the vectorised kernels): inputs on a coarse grid
// so most windows have ties; must match the first-maximum reference exactly.
TEST(MaxPoolBackward, TiesOnLargeF32InputsMatchTheReference) {
  for (const PoolCase& pc : {PoolCase{"a", {4, 12, 12, 32}, {2, 2}, {2, 2}, "valid", "NHWC"},
                             PoolCase{"b", {2, 11, 11, 16}, {3, 3}, {2, 2}, "same", "NHWC"},
                             PoolCase{"c", {2, 16, 9, 9}, {3, 3}, {1, 1}, "same", "NCHW"}}) {
    SCOPED_TRACE(pc.name);
    Tensor x = ops::round(ops::mul(rand_tensor(pc.x, DType::kF64, 0, 1, 31), ops::scalar(2.0, DType::kF64)));
    Tensor dy = rand_tensor(out_shape(pc), DType::kF64, -1, 1, 32);
    Tensor want = Tensor::from_vector<double>(reference(pc, true, x.to_vector<double>(), dy.to_vector<double>()), pc.x);
    Tensor got = ops::max_pool2d_backward(x.to(DType::kF32), dy.to(DType::kF32), pc.ksize, pc.strides, pc.padding,
                                          pc.fmt);
    EXPECT_CLOSE(got.to(DType::kF64), want, 1e-6, 1e-6);
  }
}

// A window holding NaN passes its gradient to the first NaN (f64 loop; documented).
TEST(MaxPoolBackward, NanWindowGoesToFirstNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = make<double>({1, nan, 3, nan}, {1, 2, 2, 1});
  Tensor dx = ops::max_pool2d_backward(x, make<double>({2}, {1, 1, 1, 1}), {2, 2}, {2, 2});
  EXPECT_EQ(dx.to_vector<double>(), (std::vector<double>{0, 2, 0, 0}));
}

// The same for f32 NHWC with 8 channels (the vectorised 2x2 stride-2 kernel): every
// channel's window gets NaNs at other positions; equal to the f64 loop's routing.
TEST(MaxPoolBackward, NanWindowsInTheVectorisedKernelMatchTheLoop) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = rand_tensor({2, 4, 6, 8}, DType::kF64, -1, 1, 41);
  std::vector<double> v = x.to_vector<double>();
  for (size_t i = 0; i < v.size(); i += 7) v[i] = nan;  // 1-2 NaNs in some windows, none in others
  x = Tensor::from_vector<double>(v, x.shape());
  Tensor dy = rand_tensor({2, 2, 3, 8}, DType::kF64, -1, 1, 42);
  Tensor want = ops::max_pool2d_backward(x, dy, {2, 2}, {2, 2});
  Tensor got = ops::max_pool2d_backward(x.to(DType::kF32), dy.to(DType::kF32), {2, 2}, {2, 2});
  EXPECT_CLOSE(got.to(DType::kF64), want, 1e-6, 1e-6);
}

TEST(PoolBackwardErrors, ShapesAndDtypes) {
  Tensor x = ops::zeros({1, 4, 4, 2}, DType::kF32);
  EXPECT_KILN_ERROR(ops::max_pool2d_backward(x, ops::zeros({1, 3, 3, 2}, DType::kF32), {2, 2}, {2, 2}),
                    kInvalidArgument, "pooling output shape [1, 2, 2, 2]");
  EXPECT_KILN_ERROR(ops::avg_pool2d_backward(ops::zeros({1, 2, 2, 2}, DType::kF32), Shape{1, 4, 4}, {2, 2}, {2, 2}),
                    kInvalidArgument, "input_shape must be 4 dims");
  EXPECT_KILN_ERROR(ops::avg_pool2d_backward(ops::zeros({1, 2, 2, 2}, DType::kF32), Shape{1, 4, 4, 2}, {2, 2},
                                             {2, 2}, "bogus"),
                    kInvalidArgument, "padding must be");
  // Direct op call with mismatched dtypes (the public function converts dy).
  Attrs a{{"ksize", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}};
  std::vector<Tensor> in{x, ops::zeros({1, 2, 2, 2}, DType::kF64)};
  EXPECT_KILN_ERROR(call_op1(OpRegistry::global().get("max_pool2d_backward"), in, a), kInvalidArgument,
                    "dy must have the input's dtype");
}

TEST(PoolBackwardErrors, EmptyBatchIsFine) {
  Tensor x = ops::zeros({0, 4, 4, 2}, DType::kF32);
  Tensor dx = ops::max_pool2d_backward(x, ops::zeros({0, 2, 2, 2}, DType::kF32), {2, 2}, {2, 2});
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(ops::avg_pool2d_backward(ops::zeros({0, 2, 2, 2}, DType::kF32), x.shape(), {2, 2}, {2, 2}).shape(),
            x.shape());
}

}  // namespace
}  // namespace kiln::testing
