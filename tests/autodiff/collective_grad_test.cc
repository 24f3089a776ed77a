// cross_replica_sum outside a strategy (one replica: the identity, and so its gradient)
// and under an installed collective (here three replicas holding the same tensor): the
// forward is the collective's sum, the gradient the collective's sum of the upstream
// gradients. Real replicas: tests/distribute/strategy_test.cc.
#include "gradcheck.h"
#include "kiln/autodiff/tape.h"
#include "kiln/core/cross_replica.h"
#include "kiln/graph/function.h"
#include "kiln/ops/collective.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"

namespace kiln::testing {
namespace {

using In = const std::vector<Tensor>&;

KILN_GRAD_CASES({
    {"cross_replica_sum/one_replica", {"cross_replica_sum"}, {rnd({2, 3}, 1)},
     [](In x) { return ops::square(ops::cross_replica_sum(x[0])); }},
});

TEST(CrossReplicaSum, SumsThroughTheInstalledCollectiveBothWays) {
  const Tensor x = f64({1, -2, 3}, {3});
  EXPECT_TRUE(array_equal(ops::cross_replica_sum(x), x));  // no collective: one replica
  int calls = 0;
  CrossReplicaSumScope three([&calls](const Tensor& t) {  // three replicas with the same t
    ++calls;
    return ops::mul(t, ops::scalar(3, t.dtype()));
  });
  Variable v(x, "v");
  GradientTape tape;
  const Tensor y = ops::cross_replica_sum(v.value());
  EXPECT_TRUE(array_equal(y, f64({3, -6, 9}, {3})));
  // d/dv sum(y * w) over the three replicas' objectives: 3 w.
  const Tensor w = f64({1, 10, 100}, {3});
  std::vector<Tensor> g = tape.gradient(ops::sum(ops::mul(y, w)), {v});
  EXPECT_TRUE(array_equal(g[0], f64({3, 30, 300}, {3})));
  EXPECT_EQ(calls, 2);  // forward, backward
  EXPECT_KILN_ERROR(ops::cross_replica_sum(Tensor::from_vector<int32_t>({1}, {1})), kInvalidArgument, "");
}

// A traced function never folds the sum into a constant (its value depends on the other
// replicas): the replay sums through the collective installed then.
TEST(CrossReplicaSum, IsNeverFoldedInATrace) {
  Function f([](const std::vector<Tensor>& a) {
    const Tensor c = ops::add(f64({1, 2}, {2}), f64({1, 1}, {2}));  // a constant of the trace
    return std::vector<Tensor>{ops::add(ops::cross_replica_sum(c), a[0])};
  });
  const Tensor zero = f64({0, 0}, {2});
  EXPECT_TRUE(array_equal(f({zero})[0], f64({2, 3}, {2})));  // traced alone: one replica
  CrossReplicaSumScope three([](const Tensor& t) { return ops::mul(t, ops::scalar(3, t.dtype())); });
  EXPECT_TRUE(array_equal(f({zero})[0], f64({6, 9}, {2})));  // replayed under a collective
  EXPECT_EQ(f.num_traces(), 1);
}

}  // namespace
}  // namespace kiln::testing
