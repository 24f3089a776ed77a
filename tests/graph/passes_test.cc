// Graph passes, each alone and as the pipeline: the rewritten graph (node counts, ops
// gone) and equal outputs before and after, on hand-made and randomised graphs.
#include <functional>
#include <random>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/parallel.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/nn_grad.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "graph_test_util.h"
#include "test_util.h"

namespace kiln::graph {
namespace {
using testing::make;
using testing::rand_tensor;

using testing::run;

Graph traced(const TracedFn& fn, const std::vector<Tensor>& args) { return trace(fn, args); }

TEST(PassesTest, ConstantFoldingComputesConstantSubgraphs) {
  Tensor c = make<float>({1, 2, 3}, {3});
  Graph g = traced(
      [&](const std::vector<Tensor>& x) {
        Tensor k = ops::exp(ops::mul(c, ops::scalar(0.5)));  // constants only
        return std::vector<Tensor>{ops::add(x[0], k)};
      },
      {ops::ones({3})});
  ASSERT_EQ(g.count_ops(), 3);
  Tensor x = rand_tensor({3}, DType::kF32);
  Tensor want = run(g, {x})[0];
  fold_constants(g);
  EXPECT_EQ(g.count_ops(), 1);
  EXPECT_EQ(g.count_ops("add"), 1);
  EXPECT_CLOSE(run(g, {x})[0], want, 0, 0);
}

TEST(PassesTest, CseMergesDuplicatesAndDceDropsThem) {
  Graph g = traced(
      [](const std::vector<Tensor>& x) {
        Tensor a = ops::exp(x[0]), b = ops::exp(x[0]);
        Tensor unused = ops::tanh(x[0]);
        (void)unused;
        return std::vector<Tensor>{ops::add(ops::mul(a, ops::scalar(3.0)), ops::mul(b, ops::scalar(3.0)))};
      },
      {ops::ones({4})});
  EXPECT_EQ(g.count_ops("exp"), 2);
  EXPECT_EQ(g.count_ops("tanh"), 1);
  Tensor x = rand_tensor({4}, DType::kF32);
  Tensor want = run(g, {x})[0];
  eliminate_common_subexpressions(g);
  eliminate_dead_code(g);
  EXPECT_EQ(g.count_ops("exp"), 1);
  EXPECT_EQ(g.count_ops("mul"), 1);  // the two scalar constants merged, then the muls
  EXPECT_EQ(g.count_ops("tanh"), 0);
  EXPECT_EQ(g.count_ops(), 3);
  EXPECT_CLOSE(run(g, {x})[0], want, 0, 0);
}

TEST(PassesTest, AlgebraicSimplification) {
  Graph g = traced(
      [](const std::vector<Tensor>& x) {
        Tensor t = ops::mul(x[0], ops::scalar(1.0));                  // x * 1
        t = ops::add(ops::zeros({2, 3}), t);                          // 0 + x
        t = ops::transpose(ops::transpose(t, {1, 0}), {1, 0});        // double transpose
        t = ops::cast(ops::cast(t, DType::kF64), DType::kF32);        // exact round trip
        t = ops::reshape(ops::reshape(t, {3, 2}), {6});               // reshape chain
        Tensor lossy = ops::cast(ops::cast(x[0], DType::kBF16), DType::kF32);  // not exact: kept
        return std::vector<Tensor>{ops::exp(t), lossy};
      },
      {ops::ones({2, 3})});
  Tensor x = rand_tensor({2, 3}, DType::kF32);
  std::vector<Tensor> want = run(g, {x});
  optimize(g);
  EXPECT_EQ(g.count_ops("mul"), 0);
  EXPECT_EQ(g.count_ops("add"), 0);
  EXPECT_EQ(g.count_ops("transpose"), 0);
  EXPECT_EQ(g.count_ops("reshape"), 1);
  EXPECT_EQ(g.count_ops("cast"), 2);  // only the bf16 round trip
  EXPECT_EQ(g.count_ops("exp"), 1);
  std::vector<Tensor> got = run(g, {x});
  EXPECT_CLOSE(got[0], want[0], 0, 0);
  EXPECT_CLOSE(got[1], want[1], 0, 0);
}

TEST(PassesTest, BroadcastingNeutralConstantIsKept) {
  // x[3] * ones[2, 3] broadcasts: not an identity.
  Graph g = traced([](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::mul(x[0], ops::ones({2, 3}))}; },
                   {ops::ones({3})});
  simplify_algebra(g);
  eliminate_dead_code(g);
  EXPECT_EQ(g.count_ops("mul"), 1);
  EXPECT_EQ(run(g, {make<float>({1, 2, 3}, {3})})[0].shape(), Shape({2, 3}));
}

TEST(PassesTest, FusesMatmulBiasRelu) {
  Tensor w1 = rand_tensor({6, 5}, DType::kF32, -1, 1, 1), b1 = rand_tensor({5}, DType::kF32, -1, 1, 2);
  Tensor w2 = rand_tensor({5, 3}, DType::kF32, -1, 1, 3), b2 = rand_tensor({3}, DType::kF32, -1, 1, 4);
  Graph g = traced(
      [&](const std::vector<Tensor>& x) {
        Tensor h = ops::relu(ops::add(ops::matmul(x[0], w1), b1));
        Tensor shared = ops::matmul(h, ops::transpose(w2, {1, 0}), false, true);  // read twice: not fusable
        return std::vector<Tensor>{ops::add(b2, ops::matmul(h, w2)), ops::add(shared, shared)};
      },
      {ops::ones({4, 6})});
  Tensor x = rand_tensor({4, 6}, DType::kF32, -1, 1, 5);
  std::vector<Tensor> want = run(g, {x});
  optimize(g);
  EXPECT_EQ(g.count_ops("fused_matmul"), 2);  // matmul+add+relu, and bias + matmul
  EXPECT_EQ(g.count_ops("relu"), 0);
  EXPECT_EQ(g.count_ops("matmul"), 1);       // the shared one
  std::vector<Tensor> got = run(g, {x});
  EXPECT_CLOSE(got[0], want[0], 1e-6, 1e-6);
  EXPECT_CLOSE(got[1], want[1], 1e-6, 1e-6);
  int relu_fused = 0;
  for (const Node& n : g.nodes)
    if (n.kind == NodeKind::kOp && n.op->name == "fused_matmul") relu_fused += n.attrs.get_string("activation") == "relu";
  EXPECT_EQ(relu_fused, 1);
}

TEST(PassesTest, FusesConvRelu) {
  Tensor w = rand_tensor({3, 3, 2, 4}, DType::kF32, -1, 1, 21), b = rand_tensor({4}, DType::kF32, -1, 1, 22);
  Tensor w2 = rand_tensor({3, 3, 4, 3}, DType::kF32, -1, 1, 23);
  Graph g = traced(
      [&](const std::vector<Tensor>& x) {
        ops::Conv2dOptions same;
        same.padding = "same";
        Tensor h = ops::relu(ops::conv2d(x[0], w, same, b));          // fused, with its bias
        Tensor c = ops::conv2d(h, w2);                                 // read twice: kept
        return std::vector<Tensor>{ops::relu(c), ops::exp(c)};
      },
      {ops::ones({2, 6, 6, 2})});
  Tensor x = rand_tensor({2, 6, 6, 2}, DType::kF32, -1, 1, 24);
  std::vector<Tensor> want = run(g, {x});
  optimize(g);
  EXPECT_EQ(g.count_ops("fused_conv2d"), 1);
  EXPECT_EQ(g.count_ops("conv2d"), 1);
  EXPECT_EQ(g.count_ops("relu"), 1);
  std::vector<Tensor> got = run(g, {x});
  EXPECT_CLOSE(got[0], want[0], 1e-6, 1e-6);
  EXPECT_CLOSE(got[1], want[1], 1e-6, 1e-6);
  const OpDef& op = OpRegistry::global().get("fused_conv2d");
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{x, w}, {{"activation", std::string("tanh")}}), kInvalidArgument,
                    "unknown activation 'tanh'");
}

// max_pool2d (2x2, stride 2, unpadded, NHWC) of a convolution read only by it becomes
// fused_conv2d with max_pool = 2 (with or without the ReLU, odd sizes too); a
// convolution read twice, a 3x3 or stride-1 pool and NCHW keep their nodes.
TEST(PassesTest, FusesConvMaxPool) {
  const Tensor w = rand_tensor({3, 3, 3, 16}, DType::kF32, -1, 1, 41), b = rand_tensor({16}, DType::kF32, -1, 1, 42);
  const Tensor wn = rand_tensor({16, 3, 3, 3}, DType::kF32, -1, 1, 43);
  ops::Conv2dOptions same, nchw;
  same.padding = "same";
  nchw.padding = "same";
  nchw.data_format = "NCHW";
  struct Case {
    const char* name;
    std::function<std::vector<Tensor>(const Tensor&)> fn;
    int fused;
  };
  const std::vector<Case> cases = {
      {"relu conv",
       [&](const Tensor& x) {
         return std::vector<Tensor>{ops::max_pool2d(ops::relu(ops::conv2d(x, w, same, b)), {2, 2}, {2, 2}, "valid")};
       },
       1},
      {"plain conv",
       [&](const Tensor& x) {
         return std::vector<Tensor>{ops::max_pool2d(ops::conv2d(x, w, same), {2, 2}, {2, 2}, "valid")};
       },
       1},
      // Read again after the pool (a training graph's pool gradient): the conv output
      // becomes a second output (attr conv_output) when the pool covers it (even sizes).
      {"conv read after the pool",
       [&](const Tensor& x) {
         Tensor c = ops::conv2d(x, w, same, b);
         Tensor p = ops::max_pool2d(c, {2, 2}, {2, 2}, "valid");
         return std::vector<Tensor>{p, ops::exp(c), c};
       },
       1},
      {"conv read before the pool",
       [&](const Tensor& x) {
         Tensor c = ops::conv2d(x, w, same, b);
         Tensor e = ops::exp(c);
         return std::vector<Tensor>{ops::max_pool2d(c, {2, 2}, {2, 2}, "valid"), e};
       },
       0},
      {"3x3 pool",
       [&](const Tensor& x) {
         return std::vector<Tensor>{ops::max_pool2d(ops::relu(ops::conv2d(x, w, same, b)), {3, 3}, {2, 2}, "valid")};
       },
       0},
      {"stride 1",
       [&](const Tensor& x) {
         return std::vector<Tensor>{ops::max_pool2d(ops::relu(ops::conv2d(x, w, same, b)), {2, 2}, {1, 1}, "valid")};
       },
       0},
      {"NCHW",
       [&](const Tensor& x) {
         Tensor xn = ops::transpose(x, {0, 3, 1, 2});
         return std::vector<Tensor>{
             ops::max_pool2d(ops::relu(ops::conv2d(xn, wn, nchw)), {2, 2}, {2, 2}, "valid", "NCHW")};
       },
       0},
  };
  for (const Case& c : cases) {
    for (const Shape& shape : {Shape{2, 8, 8, 3}, Shape{3, 9, 7, 3}}) {
      SCOPED_TRACE(std::string(c.name) + " " + shape.str());
      Graph g = traced([&](const std::vector<Tensor>& x) { return c.fn(x[0]); }, {ops::ones(shape)});
      const Tensor x = rand_tensor(shape, DType::kF32, -1, 1, 44);
      const std::vector<Tensor> want = run(g, {x});
      const int pools = g.count_ops("max_pool2d");
      optimize(g);
      const bool read_again = std::string(c.name) == "conv read after the pool";
      const int want_fused = read_again && shape[1] % 2 != 0 ? 0 : c.fused;  // odd: rows the pool skips
      int fused = 0, with_conv = 0;
      for (const Node& n : g.nodes) {
        fused += n.kind == NodeKind::kOp && n.attrs.get_int("max_pool", 0) == 2;
        with_conv += n.kind == NodeKind::kOp && n.outputs.size() == 2 && n.attrs.get_bool("conv_output", false);
      }
      EXPECT_EQ(fused, want_fused) << g.str();
      EXPECT_EQ(with_conv, read_again ? want_fused : 0) << g.str();
      EXPECT_EQ(g.count_ops("max_pool2d"), pools - want_fused);
      const std::vector<Tensor> got = run(g, {x});
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_CLOSE(got[i], want[i], 1e-5, 1e-5);
    }
  }
}

// A train step's two conv -> relu -> max pool layers: the pools' gradients take the
// pool mask (attr pool_mask), the convolutions' outputs are never written; the first
// layer's filter gradient reads the mask (fused_conv2d_backward_filter pool_mask), the
// second's pool gradient too (max_pool2d_backward_mask); gradients equal the unfused
// graph's on ties (integer-valued inputs). Without the ReLU, the same; with an extra
// reader of a convolution's output, or that output also a graph output, conv_output
// instead (and the convolution runs once); odd sizes, neither.
TEST(PassesTest, TrainStepPoolsKeepMasksNotConvolutionOutputs) {
  struct Case {
    Shape x;
    bool relu, extra_reader;
    int masks, conv_outputs;
    bool output_c2 = false;
  };
  for (const Case& c : {Case{{2, 12, 12, 1}, true, false, 2, 0}, Case{{3, 8, 12, 1}, false, false, 2, 0},
                        Case{{2, 12, 12, 1}, true, true, 1, 1}, Case{{2, 14, 14, 1}, true, false, 1, 0},
                        Case{{2, 12, 12, 1}, true, false, 1, 1, true}}) {
    SCOPED_TRACE(c.x.str() + (c.relu ? " relu" : "") + (c.extra_reader ? " extra reader" : "") +
                 (c.output_c2 ? " c2 an output" : ""));
    ops::Conv2dOptions same;
    same.padding = "same";
    const Tensor w1 = ops::round(rand_tensor({3, 3, 1, 16}, DType::kF32, -1.4, 1.4, 61));
    const Tensor w2 = ops::round(rand_tensor({3, 3, 16, 32}, DType::kF32, -1.4, 1.4, 62));
    const Tensor b1 = ops::round(rand_tensor({16}, DType::kF32, -1.4, 1.4, 63));
    const Tensor b2 = ops::round(rand_tensor({32}, DType::kF32, -1.4, 1.4, 64));
    auto act = [&](const Tensor& t) { return c.relu ? ops::relu(t) : t; };
    Graph g = traced(
        [&](const std::vector<Tensor>& a) {
          GradientTape tape;
          for (const Tensor& t : {a[1], a[2], a[3], a[4]}) tape.watch(t);
          Tensor c1 = act(ops::conv2d(a[0], a[1], same, a[3]));
          Tensor h = ops::max_pool2d(c1, {2, 2}, {2, 2}, "valid");
          Tensor c2 = act(ops::conv2d(h, a[2], same, a[4]));
          Tensor p = ops::max_pool2d(c2, {2, 2}, {2, 2}, "valid");
          Tensor loss = ops::sum(ops::mul(ops::square(p), a[5]));  // its gradient reads p: the pool stays
          if (c.extra_reader) loss = ops::add(loss, ops::sum(ops::exp(ops::neg(ops::abs(c2)))));
          std::vector<Tensor> out = tape.gradient(loss, {a[1], a[2], a[3], a[4]});
          if (c.output_c2) out.push_back(c2);
          return out;
        },
        {ops::ones(c.x), w1, w2, b1, b2, ops::ones({c.x[0], c.x[1] / 4, c.x[2] / 4, 32})});
    const Tensor x = ops::round(rand_tensor(c.x, DType::kF32, -1.4, 1.4, 65));
    const Tensor dp = rand_tensor({c.x[0], c.x[1] / 4, c.x[2] / 4, 32}, DType::kF32, -1, 1, 66);
    const std::vector<Tensor> in{x, w1, w2, b1, b2, dp};
    const std::vector<Tensor> want = run(g, in);
    const Graph traced_step = g;
    optimize(g);
    int masks = 0, conv_outputs = 0;
    for (const Node& n : g.nodes) {
      masks += n.kind == NodeKind::kOp && n.attrs.get_bool("pool_mask", false) && n.op->name == "fused_conv2d";
      conv_outputs += n.kind == NodeKind::kOp && n.attrs.get_bool("conv_output", false);
    }
    EXPECT_EQ(masks, c.masks) << g.str();
    EXPECT_EQ(conv_outputs, c.conv_outputs) << g.str();
    EXPECT_EQ(g.count_ops("fused_conv2d") + g.count_ops("conv2d"), 2) << g.str();  // one per layer
    {  // PassOptions::pool_mask false: conv_output where the mask would be
      Graph h = traced_step;
      PassOptions no_masks;
      no_masks.pool_mask = false;
      optimize(h, no_masks);
      int outs = 0;
      for (const Node& n : h.nodes) outs += n.kind == NodeKind::kOp && n.attrs.get_bool("conv_output", false);
      EXPECT_EQ(outs, c.masks + c.conv_outputs);
      EXPECT_EQ(h.count_ops("max_pool2d_backward_mask"), 0);
    }
    if (c.masks == 2) {
      EXPECT_EQ(g.count_ops("max_pool2d_backward_mask"), 1) << g.str();
      EXPECT_EQ(g.count_ops("max_pool2d_backward"), 0) << g.str();
    }
    const int saved = num_threads();
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      const std::vector<Tensor> got = run(g, in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE("gradient " + std::to_string(i) + " threads " + std::to_string(threads));
        EXPECT_CLOSE(got[i], want[i], 1e-4, 1e-5);
      }
    }
    set_num_threads(saved);
  }
}

// The gradient through relu -> max_pool2d: relu_grad(max_pool2d_backward(y, g), y)
// becomes one max_pool2d_backward with attr relu (NHWC and NCHW, overlapping windows
// too), equal to the unfused graph; a max_pool2d_backward feeding no relu_grad (the
// second output of the "shared" variant) keeps its plain form.
TEST(PassesTest, FusesMaxPoolBackwardWithReluGrad) {
  struct Case {
    const char* format;
    std::vector<int64_t> k, s;
    Shape x;
  };
  // (8 channels: the vectorised 2x2 stride-2 NHWC kernel; 5: the general loop.)
  for (const Case& c : {Case{"NHWC", {2, 2}, {2, 2}, {2, 8, 8, 5}}, Case{"NHWC", {2, 2}, {2, 2}, {2, 8, 8, 8}},
                        Case{"NHWC", {3, 3}, {2, 2}, {2, 9, 9, 3}}, Case{"NCHW", {2, 2}, {2, 2}, {2, 3, 8, 8}}}) {
    SCOPED_TRACE(std::string(c.format) + " k" + std::to_string(c.k[0]));
    Tensor w = rand_tensor(c.x, DType::kF32, -1, 1, 31);
    for (const bool shared : {false, true}) {
      Graph g = traced(
          [&](const std::vector<Tensor>& x) {
            GradientTape tape;
            tape.watch(x[0]);
            Tensor y = ops::relu(ops::mul(x[0], w));
            Tensor p = ops::max_pool2d(y, c.k, c.s, "valid", c.format);
            Tensor loss = ops::sum(ops::mul(p, p));
            if (!shared) return std::vector<Tensor>{tape.gradient(loss, {x[0]})[0]};
            // A pool gradient of its own, read by no relu_grad: not fused.
            Tensor dp = ops::max_pool2d_backward(y, ops::mul(p, ops::scalar(2.0)), c.k, c.s, "valid", c.format);
            return std::vector<Tensor>{tape.gradient(loss, {x[0]})[0], dp};
          },
          {ops::ones(c.x)});
      Tensor x = rand_tensor(c.x, DType::kF32, -1, 1, 32);
      std::vector<Tensor> want = run(g, {x});
      ASSERT_EQ(g.count_ops("relu_grad"), 1);
      optimize(g);
      int fused = 0;
      for (const Node& n : g.nodes)
        fused += n.kind == NodeKind::kOp && n.op->name == "max_pool2d_backward" && n.attrs.get_bool("relu", false);
      EXPECT_EQ(fused, 1);
      EXPECT_EQ(g.count_ops("relu_grad"), 0);
      std::vector<Tensor> got = run(g, {x});
      for (size_t i = 0; i < want.size(); ++i) EXPECT_CLOSE(got[i], want[i], 1e-6, 1e-6);
      // Some inputs are negative: the mask matters.
      EXPECT_GT(ops::sum(ops::cast(ops::equal(want[0], ops::scalar(0.0f)), DType::kF32)).item<double>(), 0);
    }
  }
}

// A convolution's bias gradient through max pooling: sum(max_pool2d_backward(..), every
// axis but the channel one) becomes the pool backward's second output (attr bias_grad),
// with and without the fused ReLU mask, on the vectorised 2x2 NHWC kernel (C = 8, 16;
// 1-3 threads: the same sums), the general NHWC loop (C = 5), overlapping windows and
// NCHW; axes written negative too. A sum with keepdims or over other axes stays a sum.
TEST(PassesTest, FusesConvBiasGradientIntoPoolBackward) {
  struct Case {
    const char* format;
    std::vector<int64_t> k, s;
    Shape x;
    std::vector<int64_t> axes;
    bool keepdims, fuses;
  };
  const std::vector<int64_t> nhwc{0, 1, 2};
  for (const Case& c : {Case{"NHWC", {2, 2}, {2, 2}, {3, 8, 6, 8}, nhwc, false, true},
                        Case{"NHWC", {2, 2}, {2, 2}, {2, 14, 14, 16}, {-4, -3, -2}, false, true},
                        Case{"NHWC", {2, 2}, {2, 2}, {2, 8, 8, 5}, {2, 0, 1}, false, true},
                        Case{"NHWC", {3, 3}, {2, 2}, {2, 9, 9, 3}, nhwc, false, true},
                        Case{"NCHW", {2, 2}, {2, 2}, {2, 3, 8, 8}, {0, 2, 3}, false, true},
                        Case{"NHWC", {2, 2}, {2, 2}, {2, 8, 8, 8}, nhwc, true, false},
                        Case{"NHWC", {2, 2}, {2, 2}, {2, 8, 8, 8}, {1, 2}, false, false}}) {
    for (const bool relu : {false, true}) {
      SCOPED_TRACE(std::string(c.format) + " " + c.x.str() + " k" + std::to_string(c.k[0]) +
                   (c.keepdims ? " keepdims" : "") + (relu ? " relu" : ""));
      Graph g = traced(
          [&](const std::vector<Tensor>& a) {
            Tensor dx = ops::max_pool2d_backward(a[0], a[1], c.k, c.s, "valid", c.format);
            if (relu) dx = ops::relu_grad(dx, a[0]);
            return std::vector<Tensor>{ops::sum(dx, c.axes, c.keepdims), dx};
          },
          {ops::ones(c.x), ops::ones(ops::max_pool2d(ops::ones(c.x), c.k, c.s, "valid", c.format).shape())});
      const Tensor x = rand_tensor(c.x, DType::kF32, -1, 1, 41);
      const Tensor dy = rand_tensor(ops::max_pool2d(x, c.k, c.s, "valid", c.format).shape(), DType::kF32, -1, 1, 42);
      const std::vector<Tensor> want = run(g, {x, dy});
      optimize(g);
      EXPECT_EQ(g.count_ops("sum"), c.fuses ? 0 : 1) << g.str();
      int with_db = 0;
      for (const Node& n : g.nodes)
        with_db += n.kind == NodeKind::kOp && n.op->name == "max_pool2d_backward" && n.outputs.size() == 2;
      EXPECT_EQ(with_db, c.fuses ? 1 : 0);
      std::vector<Tensor> first;
      const int saved = num_threads();
      for (const int threads : {1, 2, 3}) {
        set_num_threads(threads);
        const std::vector<Tensor> got = run(g, {x, dy});
        ASSERT_EQ(got.size(), 2u);
        EXPECT_CLOSE(got[0], want[0], 1e-5, 1e-5);
        EXPECT_CLOSE(got[1], want[1], 0, 0);
        if (first.empty()) first = got;
        EXPECT_CLOSE(got[0], first[0], 0, 0);  // summed in the same order on any number of threads
      }
      set_num_threads(saved);
    }
  }
  // The op's own contract: the second output only with the attr, [C], zeros for an empty batch.
  const OpDef& op = OpRegistry::global().get("max_pool2d_backward");
  Attrs a{{"ksize", std::vector<int64_t>{2, 2}},
          {"strides", std::vector<int64_t>{2, 2}},
          {"padding", std::string("valid")},
          {"data_format", std::string("NHWC")},
          {"bias_grad", true}};
  std::vector<Tensor> out = call_op(op, std::vector<Tensor>{ops::ones({0, 4, 4, 8}), ops::ones({0, 2, 2, 8})}, a);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].shape(), (Shape{8}));
  EXPECT_CLOSE(out[1], ops::zeros({8}), 0, 0);
}

// The first convolution's gradients in a training graph: conv2d_backward_filter of the
// pool's dx (after the relu and bias fusions) becomes fused_conv2d_backward_filter, whose
// CPU kernel never writes dx whole (the fast path) or runs the unfused pair (others).
TEST(PassesTest, FusesPoolBackwardIntoTheFilterGradient) {
  struct Case {
    Shape x;
    int64_t k, o;
    const char* padding;
    int64_t stride;
  };
  for (const Case& c : {Case{{2, 8, 8, 1}, 3, 32, "same", 1},     // the cnn's first layer: the fast path
                        Case{{3, 12, 10, 3}, 3, 16, "same", 1},   // RGB, 16 channels: fast
                        Case{{2, 10, 6, 4}, 5, 16, "same", 1},    // 5x5, four channels: fast
                        Case{{5, 4, 4, 1}, 3, 32, "same", 1},     // more parts than pooled rows per image
                        Case{{2, 9, 9, 1}, 3, 32, "valid", 1},    // odd convolution output: unfused kernels
                        Case{{2, 8, 8, 8}, 3, 16, "same", 1},     // Winograd's filter gradient: unfused kernels
                        Case{{2, 8, 8, 2}, 3, 24, "same", 1},     // 24 channels: unfused kernels
                        Case{{2, 12, 12, 1}, 3, 16, "same", 2}})  // stride 2: unfused kernels
    for (const bool relu : {false, true})
      for (const bool bias : {false, true}) {
        SCOPED_TRACE(c.x.str() + " k" + std::to_string(c.k) + " o" + std::to_string(c.o) + " " + c.padding + " s" +
                     std::to_string(c.stride) + (relu ? " relu" : "") + (bias ? " bias" : ""));
        ops::Conv2dOptions o;
        o.padding = c.padding;
        o.strides = {c.stride, c.stride};
        const Shape fshape{c.k, c.k, c.x[3], c.o};
        const Shape yshape = ops::conv2d(ops::ones(c.x), ops::ones(fshape), o).shape();
        const Shape pshape = ops::max_pool2d(ops::ones(yshape), {2, 2}, {2, 2}).shape();
        Graph g = traced(
            [&](const std::vector<Tensor>& a) {
              Tensor d = ops::max_pool2d_backward(a[1], a[2], {2, 2}, {2, 2}, "valid");
              if (relu) d = ops::relu_grad(d, a[1]);
              std::vector<Tensor> out{ops::conv2d_backward_filter(a[0], d, fshape, o)};
              if (bias) out.push_back(ops::sum(d, {0, 1, 2}));
              return out;
            },
            {ops::ones(c.x), ops::ones(yshape), ops::ones(pshape)});
        const Tensor x = rand_tensor(c.x, DType::kF32, -1, 1, 51);
        // Quarter steps: ties in most windows (the first maximum takes the gradient), zeros for the ReLU mask.
        const Tensor y = ops::div(ops::floor(ops::mul(rand_tensor(yshape, DType::kF32, -1, 1, 52), ops::full({}, 4))),
                                  ops::full({}, 4));
        const Tensor dp = rand_tensor(pshape, DType::kF32, -1, 1, 53);
        const std::vector<Tensor> want = run(g, {x, y, dp});
        optimize(g);
        EXPECT_EQ(g.count_ops("fused_conv2d_backward_filter"), 1) << g.str();
        EXPECT_EQ(g.count_ops("max_pool2d_backward") + g.count_ops("conv2d_backward_filter") + g.count_ops("sum"), 0)
            << g.str();
        const int saved = num_threads();
        for (const int threads : {1, 2, 3}) {
          set_num_threads(threads);
          const std::vector<Tensor> got = run(g, {x, y, dp});
          ASSERT_EQ(got.size(), want.size());
          EXPECT_CLOSE(got[0], want[0], 1e-5, 1e-5);
          if (bias) EXPECT_CLOSE(got[1], want[1], 1e-5, 1e-5);
        }
        set_num_threads(saved);
      }

  // Not fused: dx read by the data gradient too (a layer whose input needs one), a 3x3
  // pool, and a bias gradient read before the filter gradient.
  const Tensor w = ops::ones({3, 3, 2, 16});
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    const std::vector<int64_t> k = variant == 1 ? std::vector<int64_t>{3, 3} : std::vector<int64_t>{2, 2};
    ops::Conv2dOptions o;
    o.padding = "same";
    const Shape pshape = ops::max_pool2d(ops::ones({2, 8, 8, 16}), k, {2, 2}).shape();
    Graph g = traced(
        [&](const std::vector<Tensor>& a) {
          Tensor d = ops::max_pool2d_backward(a[1], a[2], k, {2, 2}, "valid");
          std::vector<Tensor> out;
          if (variant == 2) out.push_back(ops::mul(ops::sum(d, {0, 1, 2}), ops::full({}, 2)));
          out.push_back(ops::conv2d_backward_filter(a[0], d, w.shape(), o));
          if (variant == 0) out.push_back(ops::conv2d_backward_data(d, w, a[0].shape(), o));
          return out;
        },
        {ops::ones({2, 8, 8, 2}), ops::ones({2, 8, 8, 16}), ops::ones(pshape)});
    const std::vector<Tensor> in{rand_tensor({2, 8, 8, 2}, DType::kF32, -1, 1, 54),
                                 rand_tensor({2, 8, 8, 16}, DType::kF32, -1, 1, 55),
                                 rand_tensor(pshape, DType::kF32, -1, 1, 56)};
    const std::vector<Tensor> want = run(g, in);
    optimize(g);
    EXPECT_EQ(g.count_ops("fused_conv2d_backward_filter"), 0) << g.str();
    EXPECT_EQ(g.count_ops("conv2d_backward_filter"), 1) << g.str();
    const std::vector<Tensor> got = run(g, in);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_CLOSE(got[i], want[i], 1e-5, 1e-5);
  }

  // The op's contract.
  const OpDef& op = OpRegistry::global().get("fused_conv2d_backward_filter");
  Attrs a{{"filter_shape", std::vector<int64_t>{3, 3, 1, 16}}, {"padding", std::string("same")}, {"bias_grad", true}};
  auto call = [&](const Shape& x, const Shape& y, const Shape& dp, DType dt = DType::kF32) {
    return call_op(op, std::vector<Tensor>{ops::ones(x, dt), ops::ones(y), ops::ones(dp)}, a);
  };
  const std::vector<Tensor> out = call({2, 8, 8, 1}, {2, 8, 8, 16}, {2, 4, 4, 16});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{3, 3, 1, 16}));
  EXPECT_EQ(out[1].shape(), (Shape{16}));
  EXPECT_THROW(call({2, 8, 8, 1}, {2, 8, 6, 16}, {2, 4, 3, 16}), InvalidArgumentError);  // y not the conv's output
  EXPECT_THROW(call({2, 8, 8, 1}, {2, 8, 8, 16}, {2, 4, 5, 16}), InvalidArgumentError);  // dp not the pool's
  EXPECT_THROW(call({2, 8, 8, 1}, {2, 8, 8, 16}, {2, 4, 4, 16}, DType::kF64), InvalidArgumentError);
  EXPECT_THROW(call({2, 1, 1, 1}, {2, 1, 1, 16}, {2, 0, 0, 16}), InvalidArgumentError);  // no 2x2 window
  a.set("data_format", std::string("NCHW"));
  EXPECT_THROW(call({2, 1, 8, 8}, {2, 16, 8, 8}, {2, 16, 4, 4}), InvalidArgumentError);
}

// conv2d -> batch_norm_inference (constants) -> relu: one fused_conv2d with the
// statistics folded into its filter and bias; NHWC and NCHW, with and without a bias.
TEST(PassesTest, FoldsBatchNormIntoConv) {
  for (const char* layout : {"NHWC", "NCHW"}) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(std::string(layout) + (with_bias ? " bias" : ""));
      const bool nhwc = std::string(layout) == "NHWC";
      Tensor w = rand_tensor(nhwc ? Shape{3, 3, 2, 4} : Shape{4, 2, 3, 3}, DType::kF32, -1, 1, 21);
      Tensor b = rand_tensor({4}, DType::kF32, -1, 1, 22), mean = rand_tensor({4}, DType::kF32, -1, 1, 23);
      Tensor var = rand_tensor({4}, DType::kF32, 0.5, 2, 24), gamma = rand_tensor({4}, DType::kF32, 0.5, 1.5, 25);
      Tensor beta = rand_tensor({4}, DType::kF32, -1, 1, 26);
      ops::Conv2dOptions o;
      o.padding = "same";
      o.data_format = layout;
      Graph g = traced(
          [&](const std::vector<Tensor>& x) {
            Tensor y = ops::conv2d(x[0], w, o, with_bias ? b : Tensor());
            y = ops::batch_norm_inference(y, mean, var, gamma, beta, 1e-3, nhwc ? -1 : 1);
            return std::vector<Tensor>{ops::relu(y)};
          },
          {ops::ones(nhwc ? Shape{2, 5, 5, 2} : Shape{2, 2, 5, 5})});
      Tensor x = rand_tensor(nhwc ? Shape{2, 5, 5, 2} : Shape{2, 2, 5, 5}, DType::kF32, -1, 1, 27);
      Tensor want = run(g, {x})[0];
      optimize(g);
      EXPECT_EQ(g.count_ops("batch_norm_inference"), 0) << g.str();
      EXPECT_EQ(g.count_ops(), 1) << g.str();  // fused_conv2d: the ReLU fused after the fold
      EXPECT_CLOSE(run(g, {x})[0], want, 1e-5, 1e-5);
    }
  }
  // Statistics that are not constants (a variable: training can change them) stay.
  Variable mv(ops::zeros({4}), "moving_mean");
  Tensor w = rand_tensor({1, 1, 2, 4}, DType::kF32, -1, 1, 28);
  Graph g = traced(
      [&](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{ops::batch_norm_inference(ops::conv2d(x[0], w), mv.value(), ops::ones({4}),
                                                             ops::ones({4}), ops::zeros({4}), 1e-3, -1)};
      },
      {ops::ones({1, 3, 3, 2})});
  optimize(g);
  EXPECT_EQ(g.count_ops("batch_norm_inference"), 1);
}

TEST(PassesTest, SharedMatmulIsNotFused) {
  Tensor w = rand_tensor({3, 2}, DType::kF32), b = rand_tensor({2}, DType::kF32);
  Graph g = traced(
      [&](const std::vector<Tensor>& x) {
        Tensor m = ops::matmul(x[0], w);
        return std::vector<Tensor>{ops::add(m, b), ops::exp(m)};
      },
      {ops::ones({2, 3})});
  optimize(g);
  EXPECT_EQ(g.count_ops("fused_matmul"), 0);
  EXPECT_EQ(g.count_ops("matmul"), 1);
}

TEST(FusedMatmulOp, MatchesComposedOpsAndChecksShapes) {
  const OpDef& op = OpRegistry::global().get("fused_matmul");
  Tensor a = rand_tensor({5, 4}, DType::kF32, -1, 1, 8), b = rand_tensor({3, 4}, DType::kF32, -1, 1, 9);
  Tensor bias = rand_tensor({3}, DType::kF32, -1, 1, 10);
  Tensor got = call_op1(op, std::vector<Tensor>{a, b, bias}, {{"transpose_b", true}, {"activation", std::string("relu")}});
  EXPECT_CLOSE(got, ops::relu(ops::add(ops::matmul(a, b, false, true), bias)), 1e-6, 1e-6);
  Tensor lin = call_op1(op, std::vector<Tensor>{a, b, bias}, {{"transpose_b", true}});
  EXPECT_CLOSE(lin, ops::add(ops::matmul(a, b, false, true), bias), 1e-6, 1e-6);
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{a, b, bias}, {}), kInvalidArgument, "shapes do not chain");
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{a, b, bias}, {{"transpose_b", true}, {"activation", std::string("gelu")}}),
                    kInvalidArgument, "unknown activation 'gelu'");
}

// Random graphs: chains and diamonds of elementwise ops over the input, constants and
// duplicated subexpressions; the optimised graph must compute the same outputs.
// A tree of elementwise ops becomes one fused_elementwise node; a value that is also
// a graph output stays outside; a row broadcast joins; a column broadcast stays
// outside.
TEST(PassesTest, FusesElementwiseTrees) {
  Tensor c = make<float>({0.5f, -1.f, 2.f, 1.f, 3.f}, {5});
  Tensor k = make<float>({1.f, 2.f, -1.f, 0.5f}, {4, 1});
  Graph g = traced(
      [&](const std::vector<Tensor>& x) {
        Tensor a = ops::tanh(ops::mul(x[0], ops::scalar(2.0f)));          // fused (scalar broadcast)
        Tensor b = ops::exp(ops::neg(ops::square(x[1])));                 // fused
        Tensor shared = ops::sigmoid(x[0]);                                // an output too: kept
        Tensor sum = ops::add(ops::add(a, b), ops::mul(shared, shared));   // root of the tree
        Tensor row = ops::add(sum, c);                                     // [4,5] + [5]: a row broadcast, fused
        Tensor col = ops::mul(row, k);                                     // [4,5] * [4,1]: not fused
        Tensor small = ops::relu(ops::sub(c, ops::scalar(1.0f)));          // [5]: folded (constant)
        return std::vector<Tensor>{ops::relu_grad(col, x[1]), shared, small};
      },
      {ops::ones({4, 5}), ops::ones({4, 5})});
  Tensor x0 = rand_tensor({4, 5}, DType::kF32, -2, 2, 7), x1 = rand_tensor({4, 5}, DType::kF32, -2, 2, 8);
  std::vector<Tensor> want = run(g, {x0, x1});
  optimize(g);
  EXPECT_EQ(g.count_ops("fused_elementwise"), 1) << g.str();
  EXPECT_EQ(g.count_ops("sigmoid"), 1) << g.str();  // the shared output
  // fused (up to the row add), sigmoid, the column mul, and relu_grad (alone: its
  // producer is not fusable).
  EXPECT_EQ(g.count_ops(), 4) << g.str();
  EXPECT_EQ(g.count_ops("mul"), 1) << g.str();
  EXPECT_EQ(g.count_ops("add"), 0) << g.str();
  EXPECT_EQ(g.count_ops("relu_grad"), 1) << g.str();
  std::vector<Tensor> got = run(g, {x0, x1});
  for (size_t k = 0; k < want.size(); ++k) EXPECT_CLOSE(got[k], want[k], 1e-6, 1e-6);
}

// Long chains on many elements: the fused loop equals the op-by-op results (blocks,
// threads, tails) and the memory plan needs no intermediates.
TEST(PassesTest, FusedElementwiseChainMatchesOpByOp) {
  Function f = function([](const std::vector<Tensor>& x) {
    Tensor t = x[0];
    for (int i = 0; i < 20; ++i) t = i % 3 == 0 ? ops::tanh(t) : i % 3 == 1 ? ops::mul(t, x[1]) : ops::sub(t, ops::scalar(0.25f));
    return std::vector<Tensor>{ops::maximum(ops::minimum(t, ops::scalar(0.5f)), ops::scalar(-0.5f))};
  });
  for (int64_t n : {1, 7, 513, 100003}) {
    Tensor x = rand_tensor({n}, DType::kF32, -2, 2, 9), y = rand_tensor({n}, DType::kF32, 0.5, 1.5, 10);
    Tensor got = f({x, y})[0];  // traced run (eager)
    got = f({x, y})[0];         // the fused graph
    Tensor t = x;
    for (int i = 0; i < 20; ++i) t = i % 3 == 0 ? ops::tanh(t) : i % 3 == 1 ? ops::mul(t, y) : ops::sub(t, ops::scalar(0.25f));
    SCOPED_TRACE(n);
    EXPECT_CLOSE(got, ops::maximum(ops::minimum(t, ops::scalar(0.5f)), ops::scalar(-0.5f)), 1e-6, 1e-6);
    const Graph& g = f.concrete({x, y}).graph();
    EXPECT_EQ(g.count_ops(), 1) << g.str();
    EXPECT_EQ(f.concrete({x, y}).executor().memory_stats({{x.shape(), x.dtype()}, {y.shape(), y.dtype()}}).num_buffers, 0);
  }
}

// Inputs broadcast along leading dims (rows of every width against the L1 block size,
// leading 1s, several at once) equal the op-by-op results.
TEST(PassesTest, FusedElementwiseBroadcastInputs) {
  for (int64_t width : {1, 3, 100, 1000, 5000}) {
    SCOPED_TRACE(width);
    const Tensor x = rand_tensor({7, 3, width}, DType::kF32, -2, 2, 21);
    const Tensor bias = rand_tensor({width}, DType::kF32, -1, 1, 22);
    const Tensor scale = rand_tensor({1, 3, width}, DType::kF32, 0.5, 1.5, 23);
    auto fn = [&](const std::vector<Tensor>& in) {
      Tensor t = ops::mul(ops::tanh(ops::add(in[0], bias)), scale);
      return std::vector<Tensor>{ops::relu(ops::sub(t, ops::mul(bias, ops::scalar(0.5f))))};
    };
    Function f = function(fn);
    f({x});
    EXPECT_CLOSE(f({x})[0], fn({x})[0], 1e-6, 1e-6);
    const Graph& g = f.concrete({x}).graph();
    EXPECT_EQ(g.count_ops("fused_elementwise"), 1) << g.str();
    EXPECT_LE(g.count_ops(), 2) << g.str();  // and at most the bias * 0.5 (a constant: folded)
  }
}

TEST(FusedElementwiseOp, ChecksItsProgram) {
  const OpDef& op = OpRegistry::global().get("fused_elementwise");
  Tensor x = make<float>({1, -2, 3}, {3});
  EXPECT_CLOSE(call_op1(op, std::vector<Tensor>{x, x}, {{"ops", std::string("mul,relu")}, {"args", std::vector<int64_t>{0, 1, 2, -1}}}),
               make<float>({1, 4, 9}, {3}), 0, 0);
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{x}, {{"ops", std::string("softmax")}, {"args", std::vector<int64_t>{0, -1}}}),
                    kInvalidArgument, "cannot be fused");
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{x}, {{"ops", std::string("add")}, {"args", std::vector<int64_t>{0, 1}}}),
                    kInvalidArgument, "reads registers");
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{x}, {{"ops", std::string("exp")}, {"args", std::vector<int64_t>{0}}}),
                    kInvalidArgument, "two args per op");
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{x, make<float>({1, 2}, {2})}, {{"ops", std::string("add")}, {"args", std::vector<int64_t>{0, 1}}}),
                    kInvalidArgument, "broadcast");
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{ops::ones({3, 2}), ops::ones({3, 1})}, {{"ops", std::string("add")}, {"args", std::vector<int64_t>{0, 1}}}),
                    kInvalidArgument, "trailing dims");
  // A row input: element i reads row[i % 2].
  EXPECT_CLOSE(call_op1(op, std::vector<Tensor>{make<float>({1, 2, 3, 4}, {2, 2}), make<float>({10, 20}, {2})}, {{"ops", std::string("add")}, {"args", std::vector<int64_t>{0, 1}}}),
               make<float>({11, 22, 13, 24}, {2, 2}), 0, 0);
  EXPECT_KILN_ERROR(call_op1(op, std::vector<Tensor>{make<double>({1}, {1})}, {{"ops", std::string("exp")}, {"args", std::vector<int64_t>{0, -1}}}),
                    kInvalidArgument, "must be f32");
}

TEST(PassesTest, RandomGraphsKeepTheirValues) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const uint64_t seed = rng();
    auto fn = [seed](const std::vector<Tensor>& x) {
      std::mt19937 r(static_cast<uint32_t>(seed));
      std::vector<Tensor> pool{x[0], x[1], make<float>({0.5f, -1.f, 2.f, 1.f}, {4})};
      for (int i = 0; i < 12; ++i) {
        const Tensor& a = pool[r() % pool.size()];
        const Tensor& b = pool[r() % pool.size()];
        switch (r() % 8) {
          case 0: pool.push_back(ops::add(a, b)); break;
          case 1: pool.push_back(ops::mul(a, b)); break;
          case 2: pool.push_back(ops::tanh(a)); break;
          case 3: pool.push_back(ops::mul(a, ops::scalar(1.0))); break;
          case 4: pool.push_back(ops::add(ops::tanh(a), ops::tanh(a))); break;
          case 5: pool.push_back(ops::cast(ops::cast(a, DType::kF64), DType::kF32)); break;
          case 6: pool.push_back(ops::reshape(ops::reshape(a, {2, 2}), {4})); break;
          default: pool.push_back(ops::sub(a, ops::zeros({4}))); break;
        }
      }
      return std::vector<Tensor>{pool.back(), pool[pool.size() / 2]};
    };
    std::vector<Tensor> in{rand_tensor({4}, DType::kF32, -1, 1, seed), rand_tensor({4}, DType::kF32, -1, 1, seed + 1)};
    Graph g = trace(fn, in);
    const int before = g.count_ops();
    std::vector<Tensor> want = run(g, in);
    optimize(g);
    EXPECT_LE(g.count_ops(), before);
    std::vector<Tensor> got = run(g, in);
    ASSERT_EQ(got.size(), 2u);
    SCOPED_TRACE("trial " + std::to_string(trial));
    for (size_t k = 0; k < got.size(); ++k) EXPECT_CLOSE(got[k], want[k], 0, 0);
  }
}

}  // namespace
}  // namespace kiln::graph
