// fused_conv2d with max_pool = 2 (made by conv_pool_fusion): the convolution pooled
// where it is computed (src/backends/cpu/conv_kernels.cc: per image, or per band of
// rows when there are few images) against max_pool2d(relu?(conv2d(x, w, bias?))):
// grey/RGB first layers (the small-channel tile), 8-32 channels (the direct tiles;
// Winograd from 1024 output pixels eagerly and for constant filters in graphs), odd
// output sizes (the last row/column is not pooled), 1-5 images on 1-3 threads (the
// band split), bias and ReLU on and off, oneDNN's convolution (KILN_DIRECT_CONV=0),
// with attr conv_output the convolution's rows as a second output; and the shapes and
// attrs it refuses.
#include <string>
#include <vector>

#include "kiln/core/parallel.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "scoped_env.h"
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

TEST(ConvMaxPool, MatchesConvThenPool) {
  struct Case {
    int64_t n, h, w, c, o, k;
    const char* padding;
  };
  const std::vector<Case> cases = {{1, 28, 28, 1, 32, 3, "same"},  {2, 28, 28, 1, 32, 3, "same"},
                                   {3, 13, 11, 3, 16, 3, "same"},  {1, 14, 14, 32, 64, 3, "same"},
                                   {5, 14, 14, 32, 64, 3, "same"}, {2, 9, 7, 8, 16, 3, "valid"},
                                   {2, 10, 10, 8, 32, 5, "same"},  {3, 6, 8, 16, 16, 1, "same"},
                                   {8, 14, 14, 8, 16, 3, "same"},  {1, 2, 2, 8, 16, 1, "valid"}};
  const int saved = num_threads();
  uint64_t seed = 10;
  for (const char* direct : {"1", "0"}) {
    ScopedEnv env("KILN_DIRECT_CONV", direct);
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const Case& c : cases) {
        for (const bool relu : {false, true}) {
          for (const bool with_bias : {false, true}) {
            SCOPED_TRACE("KILN_DIRECT_CONV=" + std::string(direct) + " threads " + std::to_string(threads) + " x [" +
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
            }
          }
        }
      }
    }
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
}

}  // namespace
}  // namespace kiln::testing
