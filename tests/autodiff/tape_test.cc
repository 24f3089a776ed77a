// GradientTape semantics: watching, variables, persistence, nesting, pruning, errors.
#include <cmath>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "gradcheck.h"

namespace kiln::testing {
namespace {

TEST(GradientTape, WatchedTensor) {
  Tensor x = f64({1, 2, 3}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::sum(ops::mul(x, x));
  auto g = tape.gradient(y, {x});
  EXPECT_CLOSE(g[0], f64({2, 4, 6}, {3}), 0, 0);
}

TEST(GradientTape, UnwatchedTensorGetsNoneOrZeros) {
  Tensor x = f64({1, 2}, {2}), z = f64({5, 6}, {2});
  GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  Tensor y = ops::sum(ops::mul(x, z));
  EXPECT_FALSE(tape.gradient(y, {z})[0].defined());
  EXPECT_CLOSE(tape.gradient(y, {z}, {}, UnconnectedGradients::kZero)[0], f64({0, 0}, {2}), 0, 0);
  EXPECT_CLOSE(tape.gradient(y, {x})[0], z, 0, 0);
}

// stop_gradient: the value passes, the gradient does not (y = x*x + sg(x)*x: dy/dx = 2x + sg(x)).
TEST(GradientTape, StopGradientCutsTheGradient) {
  Tensor x = f64({1, -2, 3}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor s = ops::stop_gradient(x);
  EXPECT_CLOSE(s, x, 0, 0);
  EXPECT_NE(s.raw_data(), x.raw_data());  // a copy: writing one leaves the other
  Tensor y = ops::sum(ops::add(ops::mul(x, x), ops::mul(s, x)));
  EXPECT_CLOSE(tape.gradient(y, {x})[0], f64({3, -6, 9}, {3}), 0, 0);
  EXPECT_CLOSE(ops::stop_gradient(make<int32_t>({4, 5}, {2})), make<int32_t>({4, 5}, {2}), 0, 0);
}

TEST(GradientTape, TrainableVariablesAreWatchedOnRead) {
  Variable w(f64({3, -1}, {2}), "w"), frozen(f64({1, 1}, {2}), "f", /*trainable=*/false);
  GradientTape tape;
  Tensor y = ops::sum(ops::mul(ops::square(w.value()), frozen.value()));
  auto g = tape.gradient(y, std::vector<Variable>{w, frozen});
  EXPECT_CLOSE(g[0], f64({6, -2}, {2}), 0, 0);
  EXPECT_FALSE(g[1].defined());
}

TEST(GradientTape, NoVariableWatchingWhenDisabled) {
  Variable w(f64({3}, {1}), "w");
  GradientTape tape(false, /*watch_accessed_variables=*/false);
  Tensor y = ops::square(w.value());
  EXPECT_EQ(tape.recorded_ops(), 0u);
  EXPECT_FALSE(tape.gradient(y, std::vector<Variable>{w})[0].defined());
}

TEST(GradientTape, NonPersistentTapeAnswersOnce) {
  Tensor x = f64({1}, {1});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::exp(x);
  tape.gradient(y, {x});
  EXPECT_KILN_ERROR(tape.gradient(y, {x}), kFailedPrecondition, "persistent");
}

TEST(GradientTape, PersistentTapeAnswersMany) {
  Tensor x = f64({2}, {1});
  GradientTape tape(true);
  tape.watch(x);
  Tensor y = ops::square(x);
  Tensor z = ops::exp(y);
  EXPECT_NEAR(tape.gradient(y, {x})[0].item<double>(), 4, 1e-12);
  EXPECT_NEAR(tape.gradient(z, {x})[0].item<double>(), 4 * std::exp(4.0), 1e-9);
}

TEST(GradientTape, GradientOfGradient) {
  Tensor x = f64({0.7}, {1});
  GradientTape outer;
  outer.watch(x);
  Tensor dy;
  {
    GradientTape inner;
    inner.watch(x);
    Tensor y = ops::mul(ops::square(x), x);  // x^3
    dy = inner.gradient(y, {x})[0];          // 3x^2
  }
  Tensor d2 = outer.gradient(dy, {x})[0];    // 6x
  EXPECT_NEAR(dy.item<double>(), 3 * 0.49, 1e-12);
  EXPECT_NEAR(d2.item<double>(), 6 * 0.7, 1e-12);
}

TEST(GradientTape, PauseStopsRecording) {
  Tensor x = f64({2}, {1});
  GradientTape tape;
  tape.watch(x);
  Tensor y;
  {
    GradientTape::Pause p(tape);
    y = ops::square(x);
  }
  EXPECT_EQ(tape.recorded_ops(), 0u);
  EXPECT_FALSE(tape.gradient(y, {x})[0].defined());
}

TEST(GradientTape, ReusedTensorAccumulates) {
  Tensor x = f64({1.5}, {1});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::add(ops::mul(x, x), ops::exp(x));
  EXPECT_NEAR(tape.gradient(y, {x})[0].item<double>(), 3 + std::exp(1.5), 1e-12);
}

TEST(GradientTape, NonDifferentiableOpsStopGradients) {
  Tensor x = f64({1, 3, 2}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor i = ops::argmax(x, 0);
  Tensor y = ops::sum(ops::mul(x, ops::cast(ops::greater(x, ops::scalar(1.5, DType::kF64)), DType::kF64)));
  auto g = tape.gradient(y, {x});
  EXPECT_CLOSE(g[0], f64({0, 1, 1}, {3}), 0, 0);
  EXPECT_EQ(i.item<int64_t>(), 1);
}

TEST(GradientTape, TargetMustBeFloat) {
  Tensor x = Tensor::from_vector<int32_t>({1, 2}, {2});
  GradientTape tape;
  EXPECT_KILN_ERROR(tape.gradient(x, std::vector<Tensor>{x}), kInvalidArgument, "floating");
}

TEST(GradientTape, OutputGradientShapeChecked) {
  Tensor x = f64({1, 2}, {2});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::exp(x);
  EXPECT_KILN_ERROR(tape.gradient(y, {x}, f64({1}, {1})), kInvalidArgument, "output_gradient");
}

TEST(GradientTape, IntegerSourceGetsNone) {
  Tensor x = f64({1, 2}, {2});
  Tensor n = Tensor::from_vector<int32_t>({1, 2}, {2});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::sum(ops::exp(x));
  auto g = tape.gradient(y, {x, n});
  EXPECT_TRUE(g[0].defined());
  EXPECT_FALSE(g[1].defined());
}

TEST(GradientTape, TensorIdsAreFreshPerValue) {
  Tensor x = f64({1, 2}, {2});
  Tensor y = x;
  Tensor r = x.reshape(Shape{2, 1});
  EXPECT_EQ(x.id(), y.id());
  EXPECT_NE(x.id(), r.id());
  EXPECT_NE(x.id(), 0u);
  EXPECT_EQ(Tensor().id(), 0u);
}

TEST(Variable, AssignChecksShapeAndDtype) {
  Variable v(f64({1, 2}, {2}), "v");
  v.assign(f64({3, 4}, {2}));
  EXPECT_CLOSE(v.peek(), f64({3, 4}, {2}), 0, 0);
  EXPECT_KILN_ERROR(v.assign(f64({1}, {1})), kInvalidArgument, "'v'");
  EXPECT_KILN_ERROR(v.assign(Tensor::from_vector<float>({1, 2}, {2})), kInvalidArgument, "f32");
  Variable copy = v;
  EXPECT_TRUE(copy.is_same(v));
  EXPECT_KILN_ERROR(Variable().value(), kFailedPrecondition, "undefined");
}

}  // namespace
}  // namespace kiln::testing
