// cross_replica_sum outside a strategy (one replica: the identity, and so its gradient)
// and under an installed collective (here three replicas holding the same tensor): the
// forward is the collective's sum, the gradient the collective's sum of the upstream
// gradients. Real replicas: tests/distribute/strategy_test.cc.
#include "gradcheck.h"
#include "kiln/autodiff/tape.h"
#include "kiln/core/cross_replica.h"
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

}  // namespace
}  // namespace kiln::testing
