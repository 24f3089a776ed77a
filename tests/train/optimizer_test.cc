// Optimizers (Keras 3 update rules) and the fused update ops under them. Expected
// trajectories come from a NumPy transcription of keras/src/optimizers/{sgd,adam,
// rmsprop}.py (three steps from p0 with the gradients G below, in f64); the kernels
// are checked against the same formulas written out per element here.
#include <cmath>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/device.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/optim.h"
#include "kiln/train/optimizers.h"
#include "test_util.h"

namespace kiln::train {
namespace {
using kiln::testing::make;
using kiln::testing::rand_tensor;

const std::vector<double> kP0 = {1.0, -2.0, 3.0, 0.5};
const std::vector<std::vector<double>> kG = {{0.1, -0.2, 0.3, -0.4}, {0.5, 0.5, -0.5, 0.0}, {-0.3, 0.1, 0.2, 0.7}};

// Runs three steps on one variable of dtype dt and checks the parameter after each.
void expect_trajectory(const OptimizerPtr& opt, const std::vector<std::vector<double>>& want, DType dt = DType::kF64,
                       double rtol = 1e-12) {
  Variable w(make<double>(kP0, {4}).to(dt), "w");
  for (size_t s = 0; s < kG.size(); ++s) {
    opt->apply_gradients({make<double>(kG[s], {4}).to(dt)}, {w});
    EXPECT_EQ(opt->iterations(), static_cast<int64_t>(s + 1));
    SCOPED_TRACE(opt->name() + " step " + std::to_string(s + 1));
    EXPECT_CLOSE(w.peek(), make<double>(want[s], {4}), rtol, rtol);
  }
}

OptimizerOptions lr(double v) {
  OptimizerOptions o;
  o.learning_rate = v;
  return o;
}

TEST(OptimizerTest, SgdPlain) {
  // p -= lr * g, lr = 0.1.
  expect_trajectory(optimizers::SGD(lr(0.1)),
                    {{0.99, -1.98, 2.97, 0.54}, {0.94, -2.03, 3.02, 0.54}, {0.97, -2.04, 3.0, 0.47}});
}

TEST(OptimizerTest, SgdMomentum) {
  const std::vector<std::vector<double>> want = {
      {0.99, -1.98, 2.97, 0.54}, {0.931, -2.012, 2.993, 0.576}, {0.9079, -2.0508, 2.9937, 0.5384}};
  expect_trajectory(optimizers::SGD(lr(0.1), 0.9), want);
  expect_trajectory(optimizers::SGD(lr(0.1), 0.9), want, DType::kF32, 1e-6);
}

TEST(OptimizerTest, SgdMomentumSlotValue) {
  auto opt = optimizers::SGD(lr(0.1), 0.9);
  Variable w(make<double>(kP0, {4}), "w");
  for (const auto& g : kG) opt->apply_gradients({make<double>(g, {4})}, {w});
  // m = 0.9 m - 0.1 g after three steps (NumPy).
  std::vector<Variable> s = opt->slots(w);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_CLOSE(s[0].peek(), make<double>({-0.0231, -0.0388, 0.0007, -0.0376}, {4}), 1e-12, 1e-12);
}

TEST(OptimizerTest, SgdNesterov) {
  expect_trajectory(
      optimizers::SGD(lr(0.1), 0.9, true),
      {{0.981, -1.962, 2.943, 0.576}, {0.8779, -2.0408, 3.0137, 0.6084}, {0.88711, -2.08572, 2.99433, 0.50456}});
}

TEST(OptimizerTest, SgdWeightDecay) {
  // Keras applies p -= p * wd * lr before the step.
  OptimizerOptions o = lr(0.1);
  o.weight_decay = 0.1;
  expect_trajectory(
      optimizers::SGD(o),
      {{0.98, -1.96, 2.94, 0.535}, {0.9202, -1.9904, 2.9606, 0.52965}, {0.940998, -1.980496, 2.910994, 0.4543535}});
}

TEST(OptimizerTest, Adam) {
  const std::vector<std::vector<double>> want = {
      {0.9000031621776634, -1.9000015811138304, 2.9000010540814425, 0.5999992094368349},
      {0.8138990699760685, -1.9442228477980377, 2.9293570153320156, 0.6670045048620562},
      {0.7889463805889875, -1.9895002714540357, 2.9300828270450703, 0.6372049009288491}};
  expect_trajectory(optimizers::Adam(lr(0.1)), want);
  expect_trajectory(optimizers::Adam(lr(0.1)), want, DType::kF32, 2e-6);

  auto opt = optimizers::Adam(lr(0.1));
  Variable w(make<double>(kP0, {4}), "w");
  for (const auto& g : kG) opt->apply_gradients({make<double>(g, {4})}, {w});
  std::vector<Variable> s = opt->slots(w);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_CLOSE(s[0].peek(), make<double>({0.0231, 0.0388, -0.0007, 0.0376}, {4}), 1e-12, 1e-14);
  EXPECT_CLOSE(s[1].peek(), make<double>({0.00034973001, 0.00029967004, 0.00037957009, 0.00064968016}, {4}), 1e-10,
               1e-15);
}

TEST(OptimizerTest, AdamWDefaultsToKerasWeightDecay) {
  // weight_decay 0.004 (Keras's AdamW default): p -= p * 0.004 * lr, then Adam.
  expect_trajectory(optimizers::AdamW(lr(0.1)),
                    {{0.8996031621776635, -1.8992015811138305, 2.8988010540814426, 0.599799209436835},
                     {0.8131392287111975, -1.9426631671655923, 2.9269974949103834, 0.6665645851782815},
                     {0.787861283632632, -1.9871635255547242, 2.9265525076254737, 0.6364983554110031}});
}

TEST(OptimizerTest, RmspropPlain) {
  const std::vector<std::vector<double>> want = {
      {0.9683788044185707, -1.9683776186756123, 2.9683773990789444, 0.5316226777809702},
      {0.9373103760961137, -1.9979431867870556, 2.9958598430611754, 0.5316226777809702},
      {0.9540002134204965, -2.004058496915069, 2.9849796836839517, 0.5035009509671048}};
  expect_trajectory(optimizers::RMSprop(lr(0.01)), want);
  expect_trajectory(optimizers::RMSprop(lr(0.01)), want, DType::kF32, 2e-6);
}

TEST(OptimizerTest, RmspropMomentum) {
  expect_trajectory(optimizers::RMSprop(lr(0.01), 0.9, 0.5),
                    {{0.9683788044185707, -1.9683776186756123, 2.9683773990789444, 0.5316226777809702},
                     {0.9214997783053991, -1.9821319961248616, 2.9800485426006476, 0.5474340166714552},
                     {0.914750102573196, -1.9951244949775, 2.9750039549842757, 0.5272179593028323}});
}

TEST(OptimizerTest, RmspropCentered) {
  expect_trajectory(optimizers::RMSprop(lr(0.01), 0.9, 0, 1e-7, true),
                    {{0.9666685183642119, -1.9666671296199847, 2.9666668724260785, 0.5333332175931954},
                     {0.9332750970189752, -1.9967766322567746, 2.9943715940903406, 0.5333332175931954},
                     {0.9501044838436195, -2.0030717125111037, 2.9834913558240923, 0.5048850634590948}});
}

TEST(OptimizerTest, RmspropCenteredMomentum) {
  expect_trajectory(optimizers::RMSprop(lr(0.01), 0.9, 0.5, 1e-7, true),
                    {{0.9666685183642119, -1.9666671296199847, 2.9666668724260785, 0.5333332175931954},
                     {0.9166093562010811, -1.980110197066767, 2.9777050303033796, 0.5499998263897932},
                     {0.90840916194416, -1.993126811044487, 2.9723438709757817, 0.5298849766539914}});
}

TEST(OptimizerTest, ClipNormPerGradient) {
  // clipnorm 0.5: [3, 4] (norm 5) becomes [0.3, 0.4]; [0.1] (norm 0.1) is kept.
  OptimizerOptions o = lr(1.0);
  o.clipnorm = 0.5;
  auto opt = optimizers::SGD(o);
  Variable a(make<double>({0, 0}, {2}), "a"), b(make<double>({0}, {1}), "b");
  opt->apply_gradients({make<double>({3, 4}, {2}), make<double>({0.1}, {1})}, {a, b});
  EXPECT_CLOSE(a.peek(), make<double>({-0.3, -0.4}, {2}), 1e-12, 1e-15);
  EXPECT_CLOSE(b.peek(), make<double>({-0.1}, {1}), 1e-12, 1e-15);
}

TEST(OptimizerTest, GlobalClipNorm) {
  // Global norm of [3, 4] and [12] is 13; clipped to 1 by scaling with 1/13.
  OptimizerOptions o = lr(1.0);
  o.global_clipnorm = 1;
  auto opt = optimizers::SGD(o);
  Variable a(make<double>({0, 0}, {2}), "a"), b(make<double>({0}, {1}), "b");
  opt->apply_gradients({make<double>({3, 4}, {2}), make<double>({12}, {1})}, {a, b});
  EXPECT_CLOSE(a.peek(), make<double>({-3.0 / 13, -4.0 / 13}, {2}), 1e-12, 1e-15);
  EXPECT_CLOSE(b.peek(), make<double>({-12.0 / 13}, {1}), 1e-12, 1e-15);

  std::vector<Tensor> g{make<float>({3, 4}, {2}), Tensor(), make<float>({12}, {1})};
  EXPECT_NEAR(clip_by_global_norm(g, 26), 13, 1e-5);  // below the limit: unchanged
  EXPECT_CLOSE(g[0], make<float>({3, 4}, {2}), 0, 0);
  EXPECT_NEAR(clip_by_global_norm(g, 6.5), 13, 1e-5);
  EXPECT_CLOSE(g[0], make<float>({1.5, 2}, {2}), 1e-6, 1e-6);
  EXPECT_CLOSE(g[2], make<float>({6}, {1}), 1e-6, 1e-6);
  EXPECT_FALSE(g[1].defined());
}

TEST(OptimizerTest, ScheduleDrivesLearningRate) {
  // lr = 0.5^step: step 0 moves by 1 * g, step 1 by 0.5 * g.
  OptimizerOptions o;
  o.learning_rate = schedules::StepDecay(1.0, 1, 0.5);
  auto opt = optimizers::SGD(o);
  Variable w(make<double>({1}, {1}), "w");
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 1.0);
  opt->apply_gradients({make<double>({1}, {1})}, {w});
  EXPECT_DOUBLE_EQ(w.peek().item<double>(), 0.0);
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 0.5);
  opt->apply_gradients({make<double>({1}, {1})}, {w});
  EXPECT_DOUBLE_EQ(w.peek().item<double>(), -0.5);
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 0.25);

  // Restoring the iterations variable (as a checkpoint does) moves the schedule.
  Variable it;
  for (const Variable& v : opt->variables())
    if (v.name() == "sgd/iterations") it = v;
  ASSERT_TRUE(it.defined());
  it.assign(Tensor::scalar<int64_t>(5));
  EXPECT_EQ(opt->iterations(), 5);
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 1.0 / 32);
  opt->apply_gradients({make<double>({1}, {1})}, {w});
  EXPECT_DOUBLE_EQ(w.peek().item<double>(), -0.5 - 1.0 / 32);

  opt->set_learning_rate(0.1);  // drops the schedule
  EXPECT_DOUBLE_EQ(opt->learning_rate(), 0.1);
}

TEST(OptimizerTest, StateIsVariables) {
  auto opt = optimizers::Adam();
  ASSERT_EQ(opt->variables().size(), 1u);  // iterations exists before build
  EXPECT_EQ(opt->variables()[0].name(), "adam/iterations");
  EXPECT_EQ(opt->iterations_variable().dtype(), DType::kI64);
  EXPECT_EQ(opt->iterations_variable().shape(), Shape{});
  EXPECT_FALSE(opt->iterations_variable().trainable());

  Variable w(make<float>({1, 2, 3, 4}, {2, 2}), "dense/kernel"), b(make<float>({0}, {1}), "dense/bias");
  opt->build({w, b});
  std::vector<std::string> names;
  for (const Variable& v : opt->variables()) {
    names.push_back(v.name());
    if (v.name() != "adam/iterations") {
      EXPECT_FALSE(v.trainable()) << v.name();
      EXPECT_EQ(v.peek().to_vector<double>(), std::vector<double>(static_cast<size_t>(v.numel()), 0.0)) << v.name();
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"adam/iterations", "adam/dense/kernel/m", "adam/dense/kernel/v",
                                             "adam/dense/bias/m", "adam/dense/bias/v"}));
  EXPECT_EQ(opt->slots(w)[0].shape(), (Shape{2, 2}));
  opt->build({b, w});  // idempotent, order kept
  EXPECT_EQ(opt->variables().size(), 5u);

  auto sgd = optimizers::SGD();
  sgd->build({w});
  EXPECT_EQ(sgd->variables().size(), 1u);  // no momentum slot without momentum
  auto rms = optimizers::RMSprop({}, 0.9, 0.5, 1e-7, true);
  rms->build({w});
  std::vector<std::string> rn;
  for (const Variable& v : rms->variables()) rn.push_back(v.name());
  EXPECT_EQ(rn, (std::vector<std::string>{"rmsprop/iterations", "rmsprop/dense/kernel/velocity",
                                          "rmsprop/dense/kernel/momentum", "rmsprop/dense/kernel/average_gradient"}));
  EXPECT_EQ(optimizers::AdamW()->variables()[0].name(), "adamw/iterations");
}

TEST(OptimizerTest, RestoredSlotsAreUsed) {
  // Writing m and v (as a checkpoint restore does) changes the next step like Keras would.
  auto opt = optimizers::SGD(lr(0.1), 0.9);
  Variable w(make<double>({1}, {1}), "w");
  opt->build({w});
  opt->slots(w)[0].assign(make<double>({0.5}, {1}));
  opt->apply_gradients({make<double>({1}, {1})}, {w});
  // m = 0.9 * 0.5 - 0.1 = 0.35; p = 1 + 0.35.
  EXPECT_DOUBLE_EQ(w.peek().item<double>(), 1.35);
}

TEST(OptimizerTest, UndefinedGradientsAreSkipped) {
  auto opt = optimizers::SGD(lr(1.0));
  Variable a(make<double>({1}, {1}), "a"), b(make<double>({2}, {1}), "b");
  opt->apply_gradients({Tensor(), make<double>({1}, {1})}, {a, b});
  EXPECT_DOUBLE_EQ(a.peek().item<double>(), 1);
  EXPECT_DOUBLE_EQ(b.peek().item<double>(), 1);
  EXPECT_EQ(opt->iterations(), 1);
  opt->apply_gradients({Tensor(), Tensor()}, {a, b});  // nothing to apply: not counted
  EXPECT_EQ(opt->iterations(), 1);
}

TEST(OptimizerTest, Errors) {
  auto opt = optimizers::Adam();
  Variable w(make<float>({1, 2}, {2}), "w");
  EXPECT_KILN_ERROR(opt->apply_gradients({make<float>({1, 2}, {2})}, {w, w}), kInvalidArgument, "1 gradients for 2");
  EXPECT_KILN_ERROR(opt->apply_gradients({make<float>({1, 2, 3}, {3})}, {w}), kInvalidArgument, "'w'");
  EXPECT_KILN_ERROR(opt->apply_gradients({make<double>({1, 2}, {2})}, {w}), kInvalidArgument, "f64");
  // A bad gradient anywhere leaves every variable and the step count untouched.
  Variable v(make<float>({5}, {1}), "v");
  EXPECT_KILN_ERROR(opt->apply_gradients({make<float>({1}, {1}), make<float>({1}, {1})}, {v, w}), kInvalidArgument,
                    "'w'");
  EXPECT_EQ(v.peek().item<float>(), 5.0f);
  EXPECT_EQ(opt->iterations(), 0);

  EXPECT_KILN_ERROR(optimizers::SGD(lr(0.1), 1.5), kInvalidArgument, "momentum");
  EXPECT_KILN_ERROR(optimizers::get("adagrad", 0.1), kInvalidArgument, "adagrad");
  OptimizerOptions both = lr(0.1);
  both.clipnorm = 1;
  both.global_clipnorm = 1;
  EXPECT_KILN_ERROR(optimizers::SGD(both), kInvalidArgument, "clipnorm");
  OptimizerOptions null_schedule;
  null_schedule.learning_rate = SchedulePtr();
  EXPECT_KILN_ERROR(optimizers::Adam(null_schedule), kInvalidArgument, "schedule");
}

TEST(OptimizerTest, GetByName) {
  EXPECT_EQ(optimizers::get("sgd", 0.5)->name(), "sgd");
  EXPECT_DOUBLE_EQ(optimizers::get("SGD", 0.5)->learning_rate(), 0.5);
  EXPECT_EQ(optimizers::get("adam", 0.1)->name(), "adam");
  EXPECT_EQ(optimizers::get("adamw", 0.1)->name(), "adamw");
  EXPECT_EQ(optimizers::get("rmsprop", 0.1)->name(), "rmsprop");
}

// The optimizer updates its variables in place when nothing else holds their values
// (as TensorFlow and PyTorch do), and never under a tensor someone kept.
TEST(OptimizerTest, UpdatesInPlaceOnlyWhatNothingElseHolds) {
  const std::vector<OptimizerPtr> opts = {optimizers::Adam(lr(0.1)), optimizers::SGD(lr(0.1), 0.9),
                                          optimizers::RMSprop(lr(0.1), 0.9, 0.5, 1e-7, true)};
  for (const OptimizerPtr& opt : opts) {
    SCOPED_TRACE(opt->name());
    Variable w(make<double>(kP0, {4}), "w");
    opt->apply_gradients({make<double>(kG[0], {4})}, {w});  // builds the slots
    std::vector<const void*> where{w.peek().raw_data()};
    for (const Variable& s : opt->slots(w)) where.push_back(s.peek().raw_data());
    opt->apply_gradients({make<double>(kG[1], {4})}, {w});
    std::vector<const void*> now{w.peek().raw_data()};
    for (const Variable& s : opt->slots(w)) now.push_back(s.peek().raw_data());
    EXPECT_EQ(now, where);
    // A kept value keeps its values: the update makes a new tensor.
    const Tensor kept = w.peek(), before = kept.clone();
    opt->apply_gradients({make<double>(kG[2], {4})}, {w});
    EXPECT_TRUE(array_equal(kept, before));
    EXPECT_NE(w.peek().raw_data(), kept.raw_data());
    EXPECT_FALSE(array_equal(w.peek(), before));
  }
  // Under a gradient tape (an op observer) the update makes new tensors.
  auto opt = optimizers::SGD(lr(0.1));
  Variable w(make<double>(kP0, {4}), "w");
  const void* at = w.peek().raw_data();
  {
    GradientTape tape;
    opt->apply_gradients({make<double>(kG[0], {4})}, {w});
  }
  EXPECT_NE(w.peek().raw_data(), at);
  // Borrowed memory (a mapped package's weights) is never written.
  std::vector<double> outside = kP0;
  auto borrowed = std::make_shared<Storage>(outside.data(), outside.size() * sizeof(double), Device::cpu(), nullptr);
  Variable b(Tensor(borrowed, 0, Shape({4}), DType::kF64), "b");
  borrowed.reset();
  opt->apply_gradients({make<double>(kG[0], {4})}, {b});
  EXPECT_EQ(outside, kP0);
  EXPECT_CLOSE(b.peek(), make<double>({0.99, -1.98, 2.97, 0.54}, {4}), 1e-12, 1e-12);
}

// ---- the fused update ops ----------------------------------------------------------

struct Ref {
  std::vector<double> p, a, b, c;  // param and up to three slots, after the update
};

// Per-element reference of every update, in double.
Ref sgd_ref(const std::vector<double>& p, const std::vector<double>& g, const std::vector<double>& m, double lr,
            double mu, bool nesterov, double wd) {
  Ref r{p, m, {}, {}};
  for (size_t i = 0; i < p.size(); ++i) {
    double pi = p[i] - p[i] * wd * lr;
    if (mu != 0) {
      r.a[i] = m[i] * mu - g[i] * lr;
      pi += nesterov ? r.a[i] * mu - g[i] * lr : r.a[i];
    } else {
      pi -= g[i] * lr;
    }
    r.p[i] = pi;
  }
  return r;
}

Ref adam_ref(const std::vector<double>& p, const std::vector<double>& g, const std::vector<double>& m,
             const std::vector<double>& v, double lr, double b1, double b2, double eps, int64_t t, double wd) {
  Ref r{p, m, v, {}};
  const double alpha = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
  for (size_t i = 0; i < p.size(); ++i) {
    r.a[i] = m[i] + (g[i] - m[i]) * (1 - b1);
    r.b[i] = v[i] + (g[i] * g[i] - v[i]) * (1 - b2);
    r.p[i] = p[i] - p[i] * wd * lr - alpha * r.a[i] / (std::sqrt(r.b[i]) + eps);
  }
  return r;
}

Ref rms_ref(const std::vector<double>& p, const std::vector<double>& g, const std::vector<double>& v,
            const std::vector<double>& mom, const std::vector<double>& mg, double lr, double rho, double mu, double eps,
            bool centered, double wd) {
  Ref r{p, v, mom, mg};
  for (size_t i = 0; i < p.size(); ++i) {
    r.a[i] = rho * v[i] + (1 - rho) * g[i] * g[i];
    double d = r.a[i] + eps;
    if (centered) {
      r.c[i] = rho * mg[i] + (1 - rho) * g[i];
      d = r.a[i] - r.c[i] * r.c[i] + eps;
    }
    const double inc = lr * g[i] / std::sqrt(d);
    double pi = p[i] - p[i] * wd * lr;
    if (mu > 0) {
      r.b[i] = mu * mom[i] + inc;
      pi -= r.b[i];
    } else {
      pi -= inc;
    }
    r.p[i] = pi;
  }
  return r;
}

class OptimKernelTest : public ::testing::TestWithParam<DType> {
 protected:
  // Odd size above the parallel grain and the 16-bit chunk: exercises every split.
  static constexpr int64_t kN = 70001;
  Tensor rnd(uint64_t seed, double lo, double hi) { return rand_tensor({kN}, GetParam(), lo, hi, seed); }
  void expect(const Tensor& got, const std::vector<double>& want, const char* what) {
    const DType dt = GetParam();
    // The reference sees the same (rounded) inputs in f64; results are computed in
    // f32 (f64) and rounded once to the storage type.
    // Values are O(1), so the absolute tolerance covers cancellation near zero.
    const double tol = dt == DType::kF64 ? 1e-12 : dt == DType::kF32 ? 2e-6 : dt == DType::kF16 ? 2e-3 : 1.6e-2;
    SCOPED_TRACE(what);
    EXPECT_EQ(got.dtype(), dt);
    EXPECT_CLOSE(got.to(DType::kF64), make<double>(want, {kN}), tol, tol);
  }
  static std::vector<double> v(const Tensor& t) { return t.to_vector<double>(); }
};

TEST_P(OptimKernelTest, Sgd) {
  Tensor p = rnd(1, -1, 1), g = rnd(2, -1, 1), m = rnd(3, -0.5, 0.5);
  const Tensor p_before = p.clone();
  for (bool nesterov : {false, true}) {
    ops::SgdUpdate r = ops::sgd_update(p, g, m, 0.05, 0.9, nesterov, 0.01);
    Ref want = sgd_ref(v(p), v(g), v(m), 0.05, 0.9, nesterov, 0.01);
    expect(r.param, want.p, nesterov ? "nesterov param" : "momentum param");
    expect(r.momentum, want.a, "momentum");
  }
  ops::SgdUpdate plain = ops::sgd_update(p, g, Tensor(), 0.05);
  expect(plain.param, sgd_ref(v(p), v(g), v(m), 0.05, 0, false, 0).p, "plain param");
  EXPECT_FALSE(plain.momentum.defined());
  EXPECT_TRUE(array_equal(p, p_before));  // inputs are not modified
}

TEST_P(OptimKernelTest, Adam) {
  Tensor p = rnd(4, -1, 1), g = rnd(5, -1, 1), m = rnd(6, -0.1, 0.1), vv = rnd(7, 0, 0.1);
  for (int64_t step : {1, 7}) {
    ops::AdamUpdate r = ops::adam_update(p, g, m, vv, 0.01, 0.9, 0.999, 1e-7, step, 0.004);
    Ref want = adam_ref(v(p), v(g), v(m), v(vv), 0.01, 0.9, 0.999, 1e-7, step, 0.004);
    expect(r.param, want.p, "param");
    expect(r.m, want.a, "m");
    expect(r.v, want.b, "v");
  }
}

TEST_P(OptimKernelTest, Rmsprop) {
  Tensor p = rnd(8, -1, 1), g = rnd(9, -1, 1), vv = rnd(10, 0.5, 1), mom = rnd(11, -0.1, 0.1), mg = rnd(12, -0.1, 0.1);
  for (double mu : {0.0, 0.5}) {
    for (bool centered : {false, true}) {
      ops::RmspropUpdate r = ops::rmsprop_update(p, g, vv, mu > 0 ? mom : Tensor(), centered ? mg : Tensor(), 0.01, 0.9,
                                                 mu, 1e-7, centered, 0.1);
      Ref want = rms_ref(v(p), v(g), v(vv), v(mom), v(mg), 0.01, 0.9, mu, 1e-7, centered, 0.1);
      expect(r.param, want.p, "param");
      expect(r.velocity, want.a, "velocity");
      EXPECT_EQ(r.momentum.defined(), mu > 0);
      EXPECT_EQ(r.average_grad.defined(), centered);
      if (mu > 0) expect(r.momentum, want.b, "momentum");
      if (centered) expect(r.average_grad, want.c, "average_grad");
    }
  }
}

// The (lr, step) input of a traced step gives what the attrs give, for each rule.
TEST_P(OptimKernelTest, HyperInputReplacesLrAndStep) {
  Tensor p = rnd(13, -1, 1), g = rnd(14, -1, 1), m = rnd(15, -0.1, 0.1), vv = rnd(16, 0, 0.1);
  Tensor hyper = make<double>({0.01, 7}, {2});
  ops::AdamUpdate a = ops::adam_update(p, g, m, vv, /*lr=*/99, 0.9, 0.999, 1e-7, /*step=*/1, 0.004, hyper);
  Ref want = adam_ref(v(p), v(g), v(m), v(vv), 0.01, 0.9, 0.999, 1e-7, 7, 0.004);
  expect(a.param, want.p, "adam param");
  expect(a.v, want.b, "adam v");
  ops::SgdUpdate s = ops::sgd_update(p, g, m, /*lr=*/99, 0.9, false, 0.01, hyper);
  expect(s.param, sgd_ref(v(p), v(g), v(m), 0.01, 0.9, false, 0.01).p, "sgd param");
  ops::RmspropUpdate r = ops::rmsprop_update(p, g, vv, Tensor(), Tensor(), /*lr=*/99, 0.9, 0, 1e-7, false, 0.1, hyper);
  expect(r.param, rms_ref(v(p), v(g), v(vv), v(m), v(m), 0.01, 0.9, 0, 1e-7, false, 0.1).p, "rmsprop param");
}

// in_place: the results are the param and slot tensors themselves, holding exactly what
// the out-of-place update returns (the same kernels, each element read before written).
TEST_P(OptimKernelTest, InPlaceGivesTheSameValuesInTheSameBuffers) {
  Tensor p = rnd(17, -1, 1), g = rnd(18, -1, 1), s1 = rnd(19, 0.1, 0.5), s2 = rnd(20, 0.5, 1), s3 = rnd(21, -0.1, 0.1);
  auto expect_same = [](const Tensor& got, const Tensor& in, const Tensor& want, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(got.is_same(in));
    EXPECT_TRUE(array_equal(got, want));
  };
  {
    const ops::AdamUpdate want = ops::adam_update(p, g, s1, s2, 0.01, 0.9, 0.999, 1e-7, 3, 0.004);
    Tensor pc = p.clone(), mc = s1.clone(), vc = s2.clone();
    const ops::AdamUpdate got = ops::adam_update(pc, g, mc, vc, 0.01, 0.9, 0.999, 1e-7, 3, 0.004, {}, true);
    expect_same(got.param, pc, want.param, "adam param");
    expect_same(got.m, mc, want.m, "adam m");
    expect_same(got.v, vc, want.v, "adam v");
  }
  for (double mu : {0.0, 0.9}) {
    const ops::SgdUpdate want = ops::sgd_update(p, g, s3, 0.05, mu, true, 0.01);
    Tensor pc = p.clone(), mc = s3.clone();
    const ops::SgdUpdate got = ops::sgd_update(pc, g, mc, 0.05, mu, true, 0.01, {}, true);
    expect_same(got.param, pc, want.param, "sgd param");
    if (mu != 0) expect_same(got.momentum, mc, want.momentum, "sgd momentum");
    if (mu == 0) {
      EXPECT_TRUE(array_equal(mc, s3));  // unused slot untouched
    }
  }
  {
    const ops::RmspropUpdate want = ops::rmsprop_update(p, g, s2, s3, s1, 0.01, 0.9, 0.5, 1e-7, true, 0.1);
    Tensor pc = p.clone(), vc = s2.clone(), mc = s3.clone(), ac = s1.clone();
    const ops::RmspropUpdate got = ops::rmsprop_update(pc, g, vc, mc, ac, 0.01, 0.9, 0.5, 1e-7, true, 0.1, {}, true);
    expect_same(got.param, pc, want.param, "rmsprop param");
    expect_same(got.velocity, vc, want.velocity, "rmsprop velocity");
    expect_same(got.momentum, mc, want.momentum, "rmsprop momentum");
    expect_same(got.average_grad, ac, want.average_grad, "rmsprop average_grad");
  }
}

INSTANTIATE_TEST_SUITE_P(OptimKernel, OptimKernelTest,
                         ::testing::Values(DType::kF32, DType::kF64, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(OptimOpsTest, Errors) {
  Tensor p = make<float>({1, 2}, {2});
  EXPECT_KILN_ERROR(ops::sgd_update(p, make<float>({1, 2, 3}, {3}), Tensor(), 0.1), kInvalidArgument, "grad");
  EXPECT_KILN_ERROR(ops::sgd_update(p, make<double>({1, 2}, {2}), Tensor(), 0.1), kInvalidArgument, "f64");
  EXPECT_KILN_ERROR(ops::sgd_update(p, p, Tensor(), 0.1, 0.9), kInvalidArgument, "momentum");
  EXPECT_KILN_ERROR(ops::sgd_update(make<int32_t>({1, 2}, {2}), make<int32_t>({1, 2}, {2}), Tensor(), 0.1),
                    kInvalidArgument, "floating");
  EXPECT_KILN_ERROR(ops::adam_update(p, p, p, p, 0.1, 0.9, 0.999, 1e-7, 0), kInvalidArgument, "step");
  EXPECT_KILN_ERROR(ops::adam_update(p, p, p, make<float>({1}, {1}), 0.1, 0.9, 0.999, 1e-7, 1), kInvalidArgument,
                    "v is");
  EXPECT_KILN_ERROR(ops::rmsprop_update(p, p, p, Tensor(), Tensor(), 0.1, 0.9, 0, 1e-7, true), kInvalidArgument,
                    "average_grad");
  // The hyperparameter input: f64[2] only.
  EXPECT_KILN_ERROR(ops::adam_update(p, p, p, p, 0.1, 0.9, 0.999, 1e-7, 1, 0, make<float>({0.1f, 1}, {2})),
                    kInvalidArgument, "must be f64[2] (lr, step)");
  EXPECT_KILN_ERROR(ops::sgd_update(p, p, Tensor(), 0.1, 0, false, 0, make<double>({0.1, 1, 2}, {3})),
                    kInvalidArgument, "must be f64[2] (lr, step)");
  const OpDef& d = OpRegistry::global().get("adam_update");
  EXPECT_EQ(d.differentiable, Differentiable::kNo);
}

// call_op_into: outputs as inference gives them, aliasing only as the op allows.
TEST(OptimOpsTest, CallOpIntoChecksItsOutputs) {
  const OpDef& sgd = OpRegistry::global().get("sgd_update");
  const Attrs attrs{{"lr", 0.5}, {"momentum", 0.0}, {"nesterov", false}, {"weight_decay", 0.0}};
  Tensor p = make<float>({1, 2, 3}, {3}), g = make<float>({2, 2, 2}, {3});
  std::vector<Tensor> in{p, g};
  std::vector<Tensor> wrong_shape{Tensor::empty(Shape({4}), DType::kF32)};
  EXPECT_KILN_ERROR(call_op_into(sgd, in, wrong_shape, attrs), kInvalidArgument, "output 0 must be f32[3]");
  std::vector<Tensor> wrong_dtype{Tensor::empty(Shape({3}), DType::kF64)};
  EXPECT_KILN_ERROR(call_op_into(sgd, in, wrong_dtype, attrs), kInvalidArgument, "output 0 must be f32[3]");
  std::vector<Tensor> none;
  EXPECT_KILN_ERROR(call_op_into(sgd, in, none, attrs), kInvalidArgument, "has 1 outputs");
  std::vector<Tensor> over_grad{g};  // the gradient is not overwritable
  EXPECT_KILN_ERROR(call_op_into(sgd, in, over_grad, attrs), kInvalidArgument, "shares memory with input 1");
  // A view of part of param's buffer is not param itself.
  Tensor big = make<float>({1, 2, 3, 4}, {4});
  Tensor head(big.storage(), 0, Shape({3}), DType::kF32), tail(big.storage(), 4, Shape({3}), DType::kF32);
  std::vector<Tensor> in2{head, g}, shifted{tail};
  EXPECT_KILN_ERROR(call_op_into(sgd, in2, shifted, attrs), kInvalidArgument, "shares memory with input 0");
  EXPECT_TRUE(array_equal(big, make<float>({1, 2, 3, 4}, {4})));  // nothing ran
  // Allowed: param' over param; and into a fresh buffer.
  std::vector<Tensor> fresh{Tensor::empty(Shape({3}), DType::kF32)};
  call_op_into(sgd, in, fresh, attrs);
  EXPECT_TRUE(array_equal(fresh[0], make<float>({0, 1, 2}, {3})));
  std::vector<Tensor> over_param{p};
  call_op_into(sgd, in, over_param, attrs);
  EXPECT_TRUE(array_equal(p, make<float>({0, 1, 2}, {3})));
}

}  // namespace
}  // namespace kiln::train
