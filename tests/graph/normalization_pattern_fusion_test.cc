// Softmax, log-softmax and layer norm written out of primitive ops become the fused
// ops (src/graph/passes/normalization_pattern_fusion.cc); the values stay those of the
// op-by-op graph and of the eager fused ops; patterns whose intermediates are read
// elsewhere, or that differ (axes, a non-constant eps, ddof 1), stay as they are.
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/function.h"
#include "kiln/graph/passes.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "graph_test_util.h"
#include "test_util.h"

namespace kiln::graph {
namespace {
using testing::rand_tensor;

using testing::run;

// The pass then dead-code elimination; outputs equal to rounding.
void fuse_and_compare(Graph& g, const std::vector<Tensor>& in, double tol = 2e-6) {
  const std::vector<Tensor> want = run(g, in);
  fuse_normalization_patterns(g);
  eliminate_dead_code(g);
  g.check();
  const std::vector<Tensor> got = run(g, in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_CLOSE(got[k], want[k], tol, tol);
}

Tensor softmax_by_hand(const Tensor& x, int64_t axis) {
  Tensor e = ops::exp(ops::sub(x, ops::max(x, {axis}, true)));
  return ops::div(e, ops::sum(e, {axis}, true));
}
Tensor log_softmax_by_hand(const Tensor& x, int64_t axis) {
  Tensor s = ops::sub(x, ops::max(x, {axis}, true));
  return ops::sub(s, ops::log(ops::sum(ops::exp(s), {axis}, true)));
}

TEST(NormalizationPatternFusionTest, Softmax) {
  for (int64_t axis : {-1, 1}) {
    SCOPED_TRACE(axis);
    Tensor x = rand_tensor({3, 7, 5}, DType::kF32, -20, 20, 1);
    Graph g = trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_by_hand(in[0], axis)}; }, {x});
    ASSERT_EQ(g.count_ops(), 5) << g.str();
    fuse_and_compare(g, {x});
    EXPECT_EQ(g.count_ops(), 1) << g.str();
    EXPECT_EQ(g.count_ops("softmax"), 1) << g.str();
    EXPECT_CLOSE(run(g, {x})[0], ops::softmax(x, axis), 0, 0);
  }
}

TEST(NormalizationPatternFusionTest, LogSoftmax) {
  Tensor x = rand_tensor({16, 10}, DType::kF32, -30, 30, 2);
  Graph g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{log_softmax_by_hand(in[0], -1)}; }, {x});
  fuse_and_compare(g, {x}, 1e-5);
  EXPECT_EQ(g.count_ops(), 1) << g.str();
  EXPECT_EQ(g.count_ops("log_softmax"), 1) << g.str();
  EXPECT_CLOSE(run(g, {x})[0], ops::log_softmax(x, -1), 0, 0);
}

// The forms a user writes: rsqrt or sqrt, square or d * d or var, gamma/beta in either
// operand order or absent, normalised over one or two trailing axes.
TEST(NormalizationPatternFusionTest, LayerNormForms) {
  const Tensor x = rand_tensor({4, 6, 8}, DType::kF32, -3, 3, 3);
  const Tensor gamma = rand_tensor({8}, DType::kF32, 0.5, 1.5, 4), beta = rand_tensor({8}, DType::kF32, -1, 1, 5);
  const Tensor gamma2 = rand_tensor({6, 8}, DType::kF32, 0.5, 1.5, 6);
  const Tensor eps = ops::scalar(1e-5f);
  auto norm = [&](const Tensor& t, std::vector<int64_t> axes, int form) {
    Tensor d = ops::sub(t, ops::mean(t, axes, true));
    Tensor v = form == 0 ? ops::mean(ops::square(d), axes, true)
               : form == 1 ? ops::mean(ops::mul(d, d), axes, true)
                           : ops::var(t, axes, true);
    Tensor ve = form == 1 ? ops::add(eps, v) : ops::add(v, eps);
    return form == 2 ? ops::div(d, ops::sqrt(ve)) : ops::mul(ops::rsqrt(ve), d);
  };
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
    Tensor want;  // the eager fused op
  };
  const std::vector<Case> cases = {
      {"affine, square, rsqrt", [&](const Tensor& t) { return ops::add(ops::mul(norm(t, {-1}, 0), gamma), beta); },
       ops::layer_norm(x, gamma, beta, 1e-5, -1)},
      {"affine swapped, d*d", [&](const Tensor& t) { return ops::add(beta, ops::mul(gamma, norm(t, {2}, 1))); },
       ops::layer_norm(x, gamma, beta, 1e-5, -1)},
      {"var, sqrt, gamma only", [&](const Tensor& t) { return ops::mul(norm(t, {-1}, 2), gamma); },
       ops::layer_norm(x, gamma, Tensor(), 1e-5, -1)},
      {"beta only", [&](const Tensor& t) { return ops::add(norm(t, {-1}, 0), beta); },
       ops::layer_norm(x, Tensor(), beta, 1e-5, -1)},
      {"plain, two axes", [&](const Tensor& t) { return norm(t, {1, 2}, 0); },
       ops::layer_norm(x, Tensor(), Tensor(), 1e-5, 1)},
      {"two axes, gamma [6,8]", [&](const Tensor& t) { return ops::mul(norm(t, {-2, -1}, 1), gamma2); },
       ops::layer_norm(x, gamma2, Tensor(), 1e-5, 1)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Graph g = trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.fn(in[0])}; }, {x});
    fuse_and_compare(g, {x}, 1e-5);
    EXPECT_EQ(g.count_ops(), 1) << g.str();
    EXPECT_EQ(g.count_ops("layer_norm"), 1) << g.str();
    EXPECT_CLOSE(run(g, {x})[0], c.want, 1e-6, 1e-6);
  }
}

TEST(NormalizationPatternFusionTest, LeavesOtherGraphsAlone) {
  const Tensor x = rand_tensor({4, 8}, DType::kF32, -3, 3, 7);
  struct Case {
    const char* name;
    TracedFn fn;
  };
  const std::vector<Case> cases = {
      {"an intermediate is an output too",
       [](const std::vector<Tensor>& in) {
         Tensor e = ops::exp(ops::sub(in[0], ops::max(in[0], {-1}, true)));
         return std::vector<Tensor>{ops::div(e, ops::sum(e, {-1}, true)), e};
       }},
      {"max and sum over different axes",
       [](const std::vector<Tensor>& in) {
         Tensor e = ops::exp(ops::sub(in[0], ops::max(in[0], {0}, true)));
         return std::vector<Tensor>{ops::div(e, ops::sum(e, {1}, true))};
       }},
      {"the max of another tensor",
       [](const std::vector<Tensor>& in) {
         Tensor e = ops::exp(ops::sub(in[0], ops::max(in[1], {-1}, true)));
         return std::vector<Tensor>{ops::div(e, ops::sum(e, {-1}, true))};
       }},
      {"eps is an input",
       [](const std::vector<Tensor>& in) {
         Tensor d = ops::sub(in[0], ops::mean(in[0], {-1}, true));
         Tensor v = ops::mean(ops::square(d), {-1}, true);
         return std::vector<Tensor>{ops::mul(d, ops::rsqrt(ops::add(v, ops::reshape(in[1], {4, 8}))))};
       }},
      {"unbiased variance",
       [](const std::vector<Tensor>& in) {
         Tensor d = ops::sub(in[0], ops::mean(in[0], {-1}, true));
         return std::vector<Tensor>{ops::div(d, ops::sqrt(ops::add(ops::var(in[0], {-1}, true, 1), ops::scalar(1e-5f))))};
       }},
      {"normalised over a leading axis",
       [](const std::vector<Tensor>& in) {
         Tensor d = ops::sub(in[0], ops::mean(in[0], {0}, true));
         return std::vector<Tensor>{ops::mul(d, ops::rsqrt(ops::add(ops::var(in[0], {0}, true), ops::scalar(1e-5f))))};
       }},
  };
  const Tensor y = rand_tensor({4, 8}, DType::kF32, 0.1, 1, 8);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Graph g = trace(c.fn, {x, y});
    const int before = g.count_ops();
    fuse_and_compare(g, {x, y}, 0);
    EXPECT_EQ(g.count_ops(), before) << g.str();
    EXPECT_EQ(g.count_ops("softmax") + g.count_ops("layer_norm"), 0) << g.str();
  }
}

// In the default pipeline (kiln::function) of a small transformer-style block.
TEST(NormalizationPatternFusionTest, InThePipeline) {
  const Tensor w = rand_tensor({8, 8}, DType::kF32, -0.5, 0.5, 9), gamma = rand_tensor({8}, DType::kF32, 0.5, 1.5, 10);
  const Tensor beta = rand_tensor({8}, DType::kF32, -1, 1, 11);
  auto block = [&](const std::vector<Tensor>& in) {
    Tensor h = ops::matmul(in[0], w);
    Tensor d = ops::sub(h, ops::mean(h, {-1}, true));
    Tensor n = ops::mul(d, ops::rsqrt(ops::add(ops::mean(ops::square(d), {-1}, true), ops::scalar(1e-6f))));
    return std::vector<Tensor>{softmax_by_hand(ops::add(ops::mul(n, gamma), beta), -1)};
  };
  Function f = function(block);
  const Tensor x = rand_tensor({5, 8}, DType::kF32, -2, 2, 12);
  const Tensor want = block({x})[0];
  f({x});
  EXPECT_CLOSE(f({x})[0], want, 1e-6, 1e-6);
  const Graph& g = f.concrete({x}).graph();
  EXPECT_EQ(g.count_ops("layer_norm"), 1) << g.str();
  EXPECT_EQ(g.count_ops("softmax"), 1) << g.str();
  EXPECT_EQ(g.count_ops(), 3) << g.str();  // matmul, layer_norm, softmax
}

}  // namespace
}  // namespace kiln::graph
