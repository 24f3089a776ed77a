// Shape simplification (src/graph/passes/shape_simplification.cc): ops that move no
// data at the traced shapes disappear or become reshapes, the values stay equal, and
// what must stay (a reordering transpose, a dtype-changing sum, a full strided slice)
// stays.
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/function.h"
#include "kiln/graph/passes.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "graph_test_util.h"
#include "test_util.h"

namespace kiln::graph {
namespace {
using testing::rand_tensor;

using testing::run;

// Runs simplify_shapes then dead-code elimination; returns the outputs before and after.
void simplify_and_compare(Graph& g, const std::vector<Tensor>& in) {
  const std::vector<Tensor> want = run(g, in);
  simplify_shapes(g);
  eliminate_dead_code(g);
  g.check();
  const std::vector<Tensor> got = run(g, in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(got[k].shape(), want[k].shape()) << k;
    EXPECT_EQ(got[k].dtype(), want[k].dtype()) << k;
    EXPECT_CLOSE(got[k], want[k], 0, 0);
  }
}

TEST(ShapeSimplificationTest, NoOpShapeOpsDisappear) {
  Graph g = trace(
      [](const std::vector<Tensor>& x) {
        Tensor t = ops::broadcast_to(x[0], {3, 4});
        t = ops::tile(t, {1, 1});
        t = ops::pad(t, {{0, 0}, {0, 0}});
        t = ops::exp(t);  // keeps the chain from being one value end to end
        t = ops::concat({t}, 1);
        t = ops::split(t, std::vector<int64_t>{3}, 0)[0];
        return std::vector<Tensor>{ops::neg(t)};
      },
      {rand_tensor({3, 4}, DType::kF32, -1, 1, 1)});
  const int before = g.count_ops();
  ASSERT_GE(before, 3) << g.str();
  simplify_and_compare(g, {rand_tensor({3, 4}, DType::kF32, -1, 1, 2)});
  EXPECT_EQ(g.count_ops(), 2) << g.str();  // exp and neg
  EXPECT_EQ(g.count_ops("exp"), 1);
  EXPECT_EQ(g.count_ops("neg"), 1);
}

TEST(ShapeSimplificationTest, UnitDimMovesBecomeReshapes) {
  Graph g = trace(
      [](const std::vector<Tensor>& x) {
        Tensor a = ops::transpose(x[0], {1, 0, 2});          // [4,1,5] -> [1,4,5]: only a unit dim moves
        Tensor b = ops::sum(x[0], {1}, true);                 // over the size-1 dim, kept
        Tensor c = ops::mean(x[0], {-2}, false);              // [4,5]
        Tensor d = ops::max(x[0], {1});                       // [4,5]
        Tensor e = ops::stack({x[1]}, 0);                     // [1,4,5]
        return std::vector<Tensor>{ops::exp(a), ops::exp(b), ops::add(c, d), ops::neg(e)};
      },
      {rand_tensor({4, 1, 5}, DType::kF32, -1, 1, 3), rand_tensor({4, 5}, DType::kF32, -1, 1, 4)});
  simplify_and_compare(g, {rand_tensor({4, 1, 5}, DType::kF32, -1, 1, 5), rand_tensor({4, 5}, DType::kF32, -1, 1, 6)});
  EXPECT_EQ(g.count_ops("transpose"), 0) << g.str();
  EXPECT_EQ(g.count_ops("sum") + g.count_ops("mean") + g.count_ops("max"), 0) << g.str();
  EXPECT_EQ(g.count_ops("stack"), 0) << g.str();
  EXPECT_EQ(g.count_ops("reshape"), 5) << g.str();
}

TEST(ShapeSimplificationTest, BinaryOpsReadTheUnbroadcastOperand) {
  Graph g = trace(
      [](const std::vector<Tensor>& x) {
        Tensor b = ops::broadcast_to(x[1], {8, 6});
        return std::vector<Tensor>{ops::mul(x[0], b), ops::greater(b, x[0])};
      },
      {rand_tensor({8, 6}, DType::kF32, -1, 1, 7), rand_tensor({6}, DType::kF32, -1, 1, 8)});
  simplify_and_compare(g, {rand_tensor({8, 6}, DType::kF32, -1, 1, 9), rand_tensor({6}, DType::kF32, -1, 1, 10)});
  EXPECT_EQ(g.count_ops("broadcast_to"), 0) << g.str();
  EXPECT_EQ(g.count_ops(), 2) << g.str();
}

TEST(ShapeSimplificationTest, KeepsWhatMovesData) {
  Graph g = trace(
      [](const std::vector<Tensor>& x) {
        Tensor reordered = ops::transpose(x[0], {2, 1, 0});        // [5,1,4]: 4 and 5 swap
        Tensor widened = ops::sum(ops::cast(x[0], DType::kI32), {1});  // i32 -> i64
        Tensor all = ops::strided_slice(x[0], {0, 0, 0}, {4, 1, 5});   // bounds fixed at trace time
        Tensor grown = ops::broadcast_to(x[1], {3, 5});                 // read by a unary op
        return std::vector<Tensor>{reordered, widened, ops::neg(all), ops::exp(grown)};
      },
      {rand_tensor({4, 1, 5}, DType::kF32, -3, 3, 11), rand_tensor({5}, DType::kF32, -1, 1, 12)});
  const int before = g.count_ops();
  simplify_and_compare(g, {rand_tensor({4, 1, 5}, DType::kF32, -3, 3, 13), rand_tensor({5}, DType::kF32, -1, 1, 14)});
  EXPECT_EQ(g.count_ops(), before) << g.str();
  EXPECT_EQ(g.count_ops("transpose"), 1);
  EXPECT_EQ(g.count_ops("sum"), 1);
  EXPECT_EQ(g.count_ops("broadcast_to"), 1);
}

// A pinned signature with an open batch traced at batch 1: the reduction over the batch
// became a reshape, which rejects batch 3; the function traces that shape again and the
// values are those of the reduction.
TEST(ShapeSimplificationTest, OpenDimensionsTraceAgain) {
  FunctionOptions opts;
  opts.input_signature = std::vector<TensorSpec>{{{-1, 4}, DType::kF32}};
  Function f = function([](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::sum(x[0], {0})}; }, opts);
  Tensor one = rand_tensor({1, 4}, DType::kF32, -1, 1, 15), three = rand_tensor({3, 4}, DType::kF32, -1, 1, 16);
  EXPECT_CLOSE(f({one})[0], ops::sum(one, {0}), 0, 0);
  EXPECT_CLOSE(f({one})[0], ops::sum(one, {0}), 0, 0);  // the graph: a reshape
  EXPECT_EQ(f.concrete({one}).graph().count_ops("sum"), 0) << f.concrete({one}).graph().str();
  EXPECT_CLOSE(f({three})[0], ops::sum(three, {0}), 1e-6, 1e-6);
  EXPECT_CLOSE(f({three})[0], ops::sum(three, {0}), 1e-6, 1e-6);
  EXPECT_EQ(f.num_traces(), 2);
}

}  // namespace
}  // namespace kiln::graph
