// LossScaleOptimizer: the dynamic loss-scale rules of TensorFlow's
// tf.keras.mixed_precision.LossScaleOptimizer, checked step by step with injected
// overflows (inf and NaN gradients), against trajectories written out by hand.
#include <cmath>
#include <limits>

#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "kiln/train/model.h"
#include "kiln/train/optimizers.h"
#include "test_util.h"

namespace kiln::train {
namespace {
using kiln::testing::make;

OptimizerPtr sgd(double lr, double momentum = 0) {
  OptimizerOptions o;
  o.learning_rate = lr;
  return optimizers::SGD(o, momentum);
}

const double kInf = std::numeric_limits<double>::infinity();

TEST(LossScaleOptimizerTest, DefaultsScaleLossAndUnscaleGradients) {
  LossScaleOptimizer opt(sgd(1.0));
  EXPECT_EQ(opt.loss_scale(), 32768.0);
  EXPECT_EQ(opt.dynamic_growth_steps(), 2000);
  EXPECT_EQ(opt.good_steps(), 0);
  EXPECT_EQ(opt.scale_loss(Tensor::scalar<float>(0.5f)).item<double>(), 16384.0);
  // The gradients reach the inner optimizer divided by the scale: w -= 1.0 * g.
  Variable w(make<float>({1, 2, 3}, {3}), "w");
  opt.apply_gradients({make<double>({32768, -65536, 16384}, {3}).to(DType::kF32)}, {w});
  EXPECT_CLOSE(w.peek(), make<float>({0, 4, 2.5}, {3}), 0, 0);
  EXPECT_EQ(opt.iterations(), 1);
  EXPECT_EQ(opt.good_steps(), 1);
  EXPECT_EQ(opt.learning_rate(), 1.0);
  opt.set_learning_rate(0.5);
  EXPECT_EQ(opt.inner()->learning_rate(), 0.5);
}

TEST(LossScaleOptimizerTest, ScaleTrajectoryWithInjectedOverflows) {
  // growth every 3 finite steps; f = finite step, i = inf, n = NaN.
  LossScaleOptimizer opt(sgd(0.1, 0.9), 8.0, 3);
  Variable w(make<float>({1, -1}, {2}), "w");
  const std::string steps = "fffiffffnniffff";
  // Hand-computed: after each step, (scale, good_steps).
  const std::vector<std::pair<double, int64_t>> want = {
      {8, 1},  {8, 2},  {16, 0}, {8, 0},  {8, 1}, {8, 2}, {16, 0}, {16, 1},
      {8, 0},  {4, 0},  {2, 0},  {2, 1},  {2, 2}, {4, 0}, {4, 1}};
  ASSERT_EQ(steps.size(), want.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s + 1) + " '" + steps[s] + "'");
    const double bad = steps[s] == 'i' ? kInf : std::nan("");
    Tensor g = steps[s] == 'f' ? make<float>({0.5f, 0.25f}, {2}) : make<double>({0.5, bad}, {2}).to(DType::kF32);
    const Tensor before = w.peek().clone();
    const Tensor slot_before = opt.slots(w).empty() ? Tensor() : opt.slots(w)[0].peek().clone();
    opt.apply_gradients({g}, {w});
    EXPECT_EQ(opt.loss_scale(), want[s].first);
    EXPECT_EQ(opt.good_steps(), want[s].second);
    EXPECT_EQ(opt.iterations(), static_cast<int64_t>(s + 1));  // skipped steps count
    if (steps[s] == 'f') {
      EXPECT_FALSE(array_equal(w.peek(), before));
    } else {
      // A skipped step leaves the weights and the momentum slot exactly as they were.
      EXPECT_TRUE(array_equal(w.peek(), before));
      if (slot_before.defined()) {
        EXPECT_TRUE(array_equal(opt.slots(w)[0].peek(), slot_before));
      }
    }
  }
  EXPECT_EQ(opt.skipped_steps(), 4);
}

TEST(LossScaleOptimizerTest, ScaleNeverDropsBelowOneOrGrowsToInfinity) {
  LossScaleOptimizer low(sgd(0.1), 2.0, 5);
  Variable w(make<float>({1}, {1}), "w");
  for (int i = 0; i < 4; ++i) low.apply_gradients({make<double>({kInf}, {1}).to(DType::kF32)}, {w});
  EXPECT_EQ(low.loss_scale(), 1.0);  // 2 -> 1 -> 1 -> 1 (TF: max(scale / 2, 1))

  // 2^127 * 2 overflows f32: the scale stays, the counter restarts.
  LossScaleOptimizer high(sgd(0.1), std::ldexp(1.0, 127), 1);
  high.apply_gradients({make<float>({1}, {1})}, {w});
  EXPECT_EQ(high.loss_scale(), std::ldexp(1.0, 127));
  EXPECT_EQ(high.good_steps(), 0);
}

TEST(LossScaleOptimizerTest, OneNonFiniteGradientSkipsEveryVariable) {
  LossScaleOptimizer opt(sgd(1.0), 4.0);
  Variable a(make<float>({1, 2}, {2}), "a"), b(make<float>({3}, {1}), "b");
  opt.apply_gradients({make<float>({4, 4}, {2}), make<double>({-kInf}, {1}).to(DType::kF32)}, {a, b});
  EXPECT_CLOSE(a.peek(), make<float>({1, 2}, {2}), 0, 0);
  EXPECT_CLOSE(b.peek(), make<float>({3}, {1}), 0, 0);
  EXPECT_EQ(opt.loss_scale(), 2.0);
  // Undefined gradients are skipped, as the inner optimizer does.
  opt.apply_gradients({Tensor(), make<float>({2}, {1})}, {a, b});
  EXPECT_CLOSE(b.peek(), make<float>({2}, {1}), 0, 0);
}

TEST(LossScaleOptimizerTest, BadArguments) {
  EXPECT_KILN_ERROR(LossScaleOptimizer(nullptr), kInvalidArgument, "inner optimizer is null");
  auto inner = std::make_shared<LossScaleOptimizer>(sgd(0.1));
  EXPECT_KILN_ERROR(LossScaleOptimizer(inner), kInvalidArgument, "already scales the loss");
  EXPECT_KILN_ERROR(LossScaleOptimizer(sgd(0.1), 0.0), kInvalidArgument, "finite and > 0");
  EXPECT_KILN_ERROR(LossScaleOptimizer(sgd(0.1), kInf), kInvalidArgument, "finite and > 0");
  EXPECT_KILN_ERROR(LossScaleOptimizer(sgd(0.1), 8.0, 0), kInvalidArgument, "dynamic_growth_steps must be >= 1");
  LossScaleOptimizer opt(sgd(0.1));
  Variable w(make<float>({1}, {1}), "w");
  EXPECT_KILN_ERROR(opt.apply_gradients({}, {w}), kInvalidArgument, "got 0 gradients for 1 variables");
  EXPECT_KILN_ERROR(opt.apply_gradients({make<float>({1, 2}, {2})}, {w}), kInvalidArgument, "gradient of 'w'");
  EXPECT_EQ(opt.loss_scale(), 32768.0);  // a rejected call changes nothing
  EXPECT_EQ(opt.good_steps(), 0);
}

TEST(LossScaleOptimizerTest, CheckpointRestoresScaleAndCounter) {
  auto make_model = [] {
    auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{layers::Dense(2)}, Shape{3});
    m->compile({std::make_shared<LossScaleOptimizer>(optimizers::Adam(), 64.0, 2),
                {losses::MeanSquaredError()}});
    return m;
  };
  ModelPtr a = make_model();
  Tensor x = kiln::testing::rand_tensor({8, 3}, DType::kF32), y = kiln::testing::rand_tensor({8, 2}, DType::kF32);
  a->train_step({x}, {y});
  a->train_step({x}, {y});
  a->train_step({x}, {y});
  auto* la = dynamic_cast<LossScaleOptimizer*>(a->optimizer().get());
  EXPECT_EQ(la->loss_scale(), 128.0);
  EXPECT_EQ(la->good_steps(), 1);
  CheckpointData d = a->state();
  ASSERT_NE(d.find("optimizer/loss_scale"), nullptr);
  ModelPtr b = make_model();
  b->load_state(d);
  auto* lb = dynamic_cast<LossScaleOptimizer*>(b->optimizer().get());
  EXPECT_EQ(lb->loss_scale(), 128.0);
  EXPECT_EQ(lb->good_steps(), 1);
  EXPECT_EQ(lb->iterations(), 3);
}

}  // namespace
}  // namespace kiln::train
