// fused_conv2d with max_pool = 2 (made by conv_pool_fusion): the convolution pooled
// where it is computed (src/backends/cpu/conv_kernels.cc: per image, or per band of
// rows when there are few images) against max_pool2d(relu?(conv2d(x, w, bias?))):
// grey/RGB first layers (the small-channel tile), 8-32 channels (the direct tiles;
// Winograd from 1024 output pixels eagerly and for constant filters in graphs), odd
// output sizes (the last row/column is not pooled), 1-5 images on 1-3 threads (the
// band split), bias and ReLU on and off, oneDNN's convolution (KILN_DIRECT_CONV=0),
// with attr conv_output the convolution's rows as a second output, with attr pool_mask
// the pool's argmax mask (ties, NaNs, the ReLU's zeros) and the gradients that read it;
// and the shapes and attrs it refuses.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/parallel.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

Attrs conv_attrs(const std::string& padding, bool relu) {
  return {{"strides", std::vector<int64_t>{1, 1}},
          {"dilations", std::vector<int64_t>{1, 1}},
          {"groups", int64_t{1}},
          {"data_format", std::string("NHWC")},
          {"padding", padding},
          {"activation", std::string(relu ? "relu" : "")},
          {"max_pool", int64_t{2}}};
}

Tensor unpooled(const Tensor& x, const Tensor& w, const Tensor& bias, const std::string& padding, bool relu) {
  ops::Conv2dOptions o;
  o.padding = padding;
  Tensor y = ops::conv2d(x, w, o, bias);
  return relu ? ops::relu(y) : y;
}

Tensor reference(const Tensor& x, const Tensor& w, const Tensor& bias, const std::string& padding, bool relu) {
  return ops::max_pool2d(unpooled(x, w, bias, padding, relu), {2, 2}, {2, 2}, "valid");
}

// The pool mask of y [N, 2 PH, 2 PW, C] (kiln/ops/fused.h): the first maximal cell of
// each window (row-major; the first NaN), 4 with relu where the maximum is not > 0.
Tensor reference_mask(const Tensor& y, bool relu) {
  const int64_t n = y.dim(0), ph = y.dim(1) / 2, pw = y.dim(2) / 2, c = y.dim(3), w = y.dim(2);
  const std::vector<float> v = y.to_vector<float>();
  std::vector<uint8_t> m(static_cast<size_t>(n * ph * pw * c));
  for (int64_t i = 0; i < n * ph * pw * c; ++i) {
    const int64_t ch = i % c, col = i / c % pw, row = i / (c * pw);
    const int64_t at = ((2 * row) * w + 2 * col) * c + ch;
    const float cell[4] = {v[size_t(at)], v[size_t(at + c)], v[size_t(at + w * c)], v[size_t(at + w * c + c)]};
    float best = cell[0];
    uint8_t win = 0;
    for (int q = 1; q < 4; ++q)
      if (cell[q] > best || (std::isnan(cell[q]) && !std::isnan(best))) best = cell[q], win = uint8_t(q);
    m[size_t(i)] = relu && !(best > 0) ? 4 : win;
  }
  return Tensor::from_vector<uint8_t>(m, {n, ph, pw, c});
}

// Values on a grid of quarters: many ties and zeros in the windows.
Tensor quarters(const Shape& s, uint64_t seed) {
  return ops::div(ops::floor(ops::mul(rand_tensor(s, DType::kF32, -1, 1, seed), ops::full({}, 4))), ops::full({}, 4));
}

TEST(ConvMaxPool, MatchesConvThenPool) {
  struct Case {
    int64_t n, h, w, c, o, k;
    const char* padding;
  };
  const std::vector<Case> cases = {{1, 28, 28, 1, 32, 3, "same"},  {2, 28, 28, 1, 32, 3, "same"},
                                   {3, 13, 11, 3, 16, 3, "same"},  {1, 14, 14, 32, 64, 3, "same"},
                                   {5, 14, 14, 32, 64, 3, "same"}, {2, 9, 7, 8, 16, 3, "valid"},
                                   {2, 10, 10, 8, 32, 5, "same"},  {3, 6, 8, 16, 16, 1, "same"},
                                   {8, 14, 14, 8, 16, 3, "same"},  {1, 2, 2, 8, 16, 1, "valid"},
                                   {2, 8, 6, 3, 12, 3, "same"}};  // 12 channels: the kernels' scalar tails
  const int saved = num_threads();
  uint64_t seed = 10;
  for (const DirectConv direct : {DirectConv::kForceTile, DirectConv::kOff}) {
    ScopedKernelPreferences prefs([&](KernelPreferences& k) { k.direct_conv = direct; });
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const Case& c : cases) {
        for (const bool relu : {false, true}) {
          for (const bool with_bias : {false, true}) {
            SCOPED_TRACE(std::string("direct_conv ") + direct_conv_name(direct) + " threads " + std::to_string(threads) + " x [" +
                         std::to_string(c.n) + "," + std::to_string(c.h) + "," + std::to_string(c.w) + "," +
                         std::to_string(c.c) + "] o " + std::to_string(c.o) + " k " + std::to_string(c.k) + " " +
                         c.padding + (relu ? " relu" : "") + (with_bias ? " bias" : ""));
            const Tensor x = rand_tensor({c.n, c.h, c.w, c.c}, DType::kF32, -1, 1, ++seed);
            const Tensor w = rand_tensor({c.k, c.k, c.c, c.o}, DType::kF32, -1, 1, ++seed);
            const Tensor b = with_bias ? rand_tensor({c.o}, DType::kF32, -1, 1, ++seed) : Tensor();
            std::vector<Tensor> in{x, w};
            if (with_bias) in.push_back(b);
            const OpDef& op = OpRegistry::global().get("fused_conv2d");
            const Tensor got = call_op1(op, in, conv_attrs(c.padding, relu));
            EXPECT_CLOSE(got, reference(x, w, b, c.padding, relu), 1e-5, 1e-4);
            // conv_output: the same pool, and the convolution's rows as a second output (even sizes).
            const Tensor conv = unpooled(x, w, b, c.padding, relu);
            if (conv.dim(1) % 2 == 0 && conv.dim(2) % 2 == 0) {
              Attrs a = conv_attrs(c.padding, relu);
              a.set("conv_output", true);
              const std::vector<Tensor> both = call_op(op, in, a);
              ASSERT_EQ(both.size(), 2u);
              EXPECT_CLOSE(both[0], got, 0, 0);
              EXPECT_CLOSE(both[1], conv, 1e-5, 1e-4);
              // pool_mask: the same pool, and the mask of the convolution's output.
              Attrs m = conv_attrs(c.padding, relu);
              m.set("pool_mask", true);
              const std::vector<Tensor> masked = call_op(op, in, m);
              ASSERT_EQ(masked.size(), 2u);
              EXPECT_CLOSE(masked[0], got, 0, 0);
              EXPECT_TRUE(array_equal(masked[1], reference_mask(both[1], relu)));
            }
          }
        }
      }
    }
  }
  set_num_threads(saved);
}

// The mask on ties and zeros (integer-valued inputs and filters: exact sums, so many
// windows hold equal values) and NaNs, on both convolution paths and 1-3 threads.
TEST(ConvMaxPool, PoolMaskBreaksTiesAsTheGradient) {
  const OpDef& op = OpRegistry::global().get("fused_conv2d");
  const int saved = num_threads();
  for (const DirectConv direct : {DirectConv::kForceTile, DirectConv::kOff}) {
    ScopedKernelPreferences prefs([&](KernelPreferences& k) { k.direct_conv = direct; });
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(std::string("direct_conv ") + direct_conv_name(direct) + " threads " + std::to_string(threads) +
                     (relu ? " relu" : ""));
        Tensor x = ops::round(rand_tensor({3, 12, 10, 1}, DType::kF32, -1.4, 1.4, 7));
        if (relu) {  // a NaN in two windows
          float* d = x.data<float>();
          d[5] = std::nanf(""), d[130] = std::nanf("");
        }
        const Tensor w = ops::round(rand_tensor({3, 3, 1, 16}, DType::kF32, -1.4, 1.4, 8));
        const std::vector<Tensor> in{x, w};
        Attrs m = conv_attrs("same", relu);
        m.set("pool_mask", true);
        const std::vector<Tensor> got = call_op(op, in, m);
        const Tensor conv = unpooled(x, w, Tensor(), "same", relu);
        EXPECT_TRUE(array_equal(got[1], reference_mask(conv, relu)));
        // Ties happened (and the ReLU's zeros, marked 4).
        const std::vector<uint8_t> mv = got[1].to_vector<uint8_t>();
        EXPECT_GT(std::count(mv.begin(), mv.end(), uint8_t{0}), static_cast<std::ptrdiff_t>(mv.size() / 8));
        if (relu) {
          EXPECT_GT(std::count(mv.begin(), mv.end(), uint8_t{4}), 0);
        }
      }
    }
  }
  set_num_threads(saved);
}

// max_pool2d_backward_mask(mask, dy) == max_pool2d_backward(y, dy) (relu_grad folded into
// the mask), with the bias gradient, on ties.
TEST(ConvMaxPool, MaskBackwardEqualsThePoolBackward) {
  const OpDef& back = OpRegistry::global().get("max_pool2d_backward");
  const OpDef& masked = OpRegistry::global().get("max_pool2d_backward_mask");
  const int saved = num_threads();
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (const Shape& ys : {Shape{2, 8, 6, 16}, Shape{3, 28, 28, 32}, Shape{1, 2, 2, 8}, Shape{2, 4, 6, 12}})
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(ys.str() + (relu ? " relu" : "") + " threads " + std::to_string(threads));
        const Tensor y = quarters(ys, 21);
        const Tensor dy = rand_tensor({ys[0], ys[1] / 2, ys[2] / 2, ys[3]}, DType::kF32, -1, 1, 22);
        Attrs a{{"ksize", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}},
                {"padding", std::string("valid")}, {"data_format", std::string("NHWC")}, {"relu", relu},
                {"bias_grad", true}};
        const std::vector<Tensor> want = call_op(back, std::vector<Tensor>{y, dy}, a);
        const std::vector<Tensor> got =
            call_op(masked, std::vector<Tensor>{reference_mask(y, relu), dy}, Attrs{{"bias_grad", true}});
        ASSERT_EQ(got.size(), 2u);
        EXPECT_TRUE(array_equal(got[0], want[0]));
        EXPECT_CLOSE(got[1], want[1], 1e-5, 1e-5);
      }
  }
  set_num_threads(saved);
  const Tensor m = Tensor::from_vector<uint8_t>({0, 1}, {1, 1, 1, 2});
  EXPECT_KILN_ERROR(call_op1(masked, std::vector<Tensor>{m, rand_tensor({1, 1, 1, 3}, DType::kF32)}, {}),
                    kInvalidArgument, "dy must be f32 of the mask's shape");
  EXPECT_KILN_ERROR(call_op1(masked, std::vector<Tensor>{rand_tensor({1, 1, 1, 2}, DType::kF32),
                                                         rand_tensor({1, 1, 1, 2}, DType::kF32)},
                             {}),
                    kInvalidArgument, "the mask must be u8");
}

// bf16 max pooling reads and writes bf16 (2x2 NHWC windows, no widening copies): the
// same values as the f32 kernels on the widened tensors, bit for bit (a maximum and a
// routed gradient are bf16 values already), ties, NaN and channel tails included; the
// bias gradient summed in f32 and rounded once.
TEST(ConvMaxPool, Bf16PoolsEqualTheWidenedF32Ones) {
  const OpDef& fwd = OpRegistry::global().get("max_pool2d");
  const OpDef& back = OpRegistry::global().get("max_pool2d_backward");
  for (const Shape& xs : {Shape{2, 8, 6, 16}, Shape{3, 28, 28, 32}, Shape{1, 4, 6, 12}, Shape{1, 2, 2, 8}})
    for (const bool relu : {false, true}) {
      SCOPED_TRACE(xs.str() + (relu ? " relu" : ""));
      std::vector<float> xv = quarters(xs, 41).to_vector<float>();
      xv[5] = std::nanf("");  // a NaN in the first windows
      const Tensor x = Tensor::from_vector<float>(xv, xs).to(DType::kBF16);
      const Tensor dy = rand_tensor({xs[0], xs[1] / 2, xs[2] / 2, xs[3]}, DType::kF32, -1, 1, 42).to(DType::kBF16);
      const Attrs pool{{"ksize", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}},
                       {"padding", std::string("valid")}, {"data_format", std::string("NHWC")}};
      const Tensor y = call_op1(fwd, std::vector<Tensor>{x}, pool);
      ASSERT_EQ(y.dtype(), DType::kBF16);
      const Tensor y32 = call_op1(fwd, std::vector<Tensor>{x.to(DType::kF32)}, pool);
      EXPECT_TRUE(array_equal(y.to(DType::kF32), y32));
      Attrs a = pool;
      a.set("relu", relu);
      a.set("bias_grad", true);
      const std::vector<Tensor> got = call_op(back, std::vector<Tensor>{x, dy}, a);
      const std::vector<Tensor> want = call_op(back, std::vector<Tensor>{x.to(DType::kF32), dy.to(DType::kF32)}, a);
      ASSERT_EQ(got[0].dtype(), DType::kBF16);
      EXPECT_TRUE(array_equal(got[0].to(DType::kF32), want[0]));
      EXPECT_CLOSE(got[1].to(DType::kF32), want[1], 1e-2, 1e-2);  // one bf16 rounding of the sums
    }
}

// fused_conv2d_backward_filter with pool_mask == with y (relu in the mask): the fast
// path (first layers) and the unfused fallback (Winograd, 24 channels, stride 2).
TEST(ConvMaxPool, FilterGradientFromTheMaskEqualsFromY) {
  const OpDef& op = OpRegistry::global().get("fused_conv2d_backward_filter");
  struct Case {
    Shape x;
    int64_t k, o, stride;
  };
  const int saved = num_threads();
  for (const Case& c : {Case{{2, 8, 8, 1}, 3, 32, 1}, Case{{3, 12, 10, 3}, 3, 16, 1}, Case{{2, 8, 8, 8}, 3, 16, 1},
                        Case{{2, 8, 8, 2}, 3, 24, 1}, Case{{2, 12, 12, 1}, 3, 16, 2}})
    for (const bool relu : {false, true})
      for (const int threads : {1, 3}) {
        set_num_threads(threads);
        SCOPED_TRACE(c.x.str() + " o" + std::to_string(c.o) + " s" + std::to_string(c.stride) +
                     (relu ? " relu" : "") + " threads " + std::to_string(threads));
        Attrs a{{"strides", std::vector<int64_t>{c.stride, c.stride}}, {"dilations", std::vector<int64_t>{1, 1}},
                {"groups", int64_t{1}}, {"data_format", std::string("NHWC")}, {"padding", std::string("same")},
                {"filter_shape", std::vector<int64_t>{c.k, c.k, c.x[3], c.o}}, {"relu", relu}, {"bias_grad", true}};
        const int64_t oh = (c.x[1] + c.stride - 1) / c.stride, ow = (c.x[2] + c.stride - 1) / c.stride;
        const Tensor x = rand_tensor(c.x, DType::kF32, -1, 1, 31);
        const Tensor y = quarters({c.x[0], oh, ow, c.o}, 32);
        const Tensor dp = rand_tensor({c.x[0], oh / 2, ow / 2, c.o}, DType::kF32, -1, 1, 33);
        const std::vector<Tensor> want = call_op(op, std::vector<Tensor>{x, y, dp}, a);
        Attrs am = a;
        am.set("relu", false);
        am.set("pool_mask", true);
        const std::vector<Tensor> got = call_op(op, std::vector<Tensor>{x, reference_mask(y, relu), dp}, am);
        EXPECT_CLOSE(got[0], want[0], 1e-5, 1e-5);
        EXPECT_CLOSE(got[1], want[1], 1e-5, 1e-5);
        am.set("relu", true);  // the mask has it already
        EXPECT_KILN_ERROR(call_op(op, std::vector<Tensor>{x, reference_mask(y, relu), dp}, am), kInvalidArgument,
                          "relu folded in");
      }
  set_num_threads(saved);
}

// Graphs: the pass fuses max_pool2d(relu(conv2d + bias)) with a constant filter (its
// packing, Winograd's for 3x3 layers, kept per node); every batch of a pinned signature
// equals the eager ops.
TEST(ConvMaxPool, GraphsWithConstantFiltersMatchEagerOps) {
  const Tensor w1 = rand_tensor({3, 3, 1, 32}, DType::kF32, -1, 1, 1), b1 = rand_tensor({32}, DType::kF32, -1, 1, 2);
  const Tensor w2 = rand_tensor({3, 3, 32, 64}, DType::kF32, -0.2, 0.2, 3),
               b2 = rand_tensor({64}, DType::kF32, -1, 1, 4);
  auto model = [&](const std::vector<Tensor>& x) {
    ops::Conv2dOptions same;
    same.padding = "same";
    Tensor h = ops::max_pool2d(ops::relu(ops::conv2d(x[0], w1, same, b1)), {2, 2}, {2, 2}, "valid");
    return std::vector<Tensor>{ops::max_pool2d(ops::relu(ops::conv2d(h, w2, same, b2)), {2, 2}, {2, 2}, "valid")};
  };
  FunctionOptions o;
  o.input_signature = std::vector<TensorSpec>{{{-1, 28, 28, 1}, DType::kF32}};
  Function f = function(model, o);
  for (const int64_t batch : {1, 2, 3, 8, 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Tensor x = rand_tensor({batch, 28, 28, 1}, DType::kF32, -1, 1, static_cast<uint64_t>(batch));
    EXPECT_CLOSE(f({x})[0], model({x})[0], 1e-5, 1e-4);
  }
  const graph::Graph& g = f.concrete({rand_tensor({1, 28, 28, 1}, DType::kF32)}).graph();
  EXPECT_EQ(g.count_ops("fused_conv2d"), 2) << g.str();
  EXPECT_EQ(g.count_ops("max_pool2d"), 0) << g.str();
}

TEST(ConvMaxPool, RefusesOtherPoolsAndLayouts) {
  const OpDef& op = OpRegistry::global().get("fused_conv2d");
  const Tensor x = rand_tensor({1, 6, 6, 2}, DType::kF32), w = rand_tensor({3, 3, 2, 16}, DType::kF32);
  Attrs a = conv_attrs("same", true);
  a.set("max_pool", int64_t{3});
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{x, w}, a), kInvalidArgument, "max_pool must be 0 or 2, got 3");
  a.set("max_pool", int64_t{2});
  a.set("data_format", std::string("NCHW"));
  EXPECT_KILN_ERROR(
      call_op1(op, std::vector<Tensor>{rand_tensor({1, 2, 6, 6}, DType::kF32), rand_tensor({16, 2, 3, 3}, DType::kF32)},
               a),
      kInvalidArgument, "max_pool needs data_format NHWC");
  EXPECT_KILN_ERROR(
      call_op1(op, std::vector<Tensor>{rand_tensor({1, 1, 5, 2}, DType::kF32), w}, conv_attrs("same", true)),
      kInvalidArgument, "at least 2x2");
  Attrs keep = conv_attrs("same", true);
  keep.set("conv_output", true);
  EXPECT_KILN_ERROR(call_op(op, std::vector<Tensor>{rand_tensor({1, 7, 6, 2}, DType::kF32), w}, keep), kInvalidArgument,
                    "conv_output needs an even convolution output");
  Attrs mask = conv_attrs("same", true);
  mask.set("pool_mask", true);
  EXPECT_KILN_ERROR(call_op(op, std::vector<Tensor>{rand_tensor({1, 7, 6, 2}, DType::kF32), w}, mask), kInvalidArgument,
                    "pool_mask needs an even convolution output");
  mask.set("conv_output", true);
  EXPECT_KILN_ERROR(call_op(op, std::vector<Tensor>{rand_tensor({1, 6, 6, 2}, DType::kF32), w}, mask), kInvalidArgument,
                    "conv_output and pool_mask exclude each other");
}

}  // namespace
}  // namespace kiln::testing
