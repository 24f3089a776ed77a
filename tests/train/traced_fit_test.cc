// fit's traced training step (Model::train_step through kiln::function) against the
// eager step: same weights, optimizer state, batch-norm statistics and dropout masks;
// learning-rate changes between steps; the eager fallbacks.
#include <cmath>

#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/train/layers.h"
#include "kiln/train/model.h"
#include "test_util.h"

namespace kiln::train {
namespace {

namespace L = layers;
using kiln::testing::rand_tensor;

struct Data {
  Tensor x, y;
};
Data data(int64_t n) {
  Tensor x = rand_tensor({n, 8}, DType::kF32, -1, 1, 3);
  std::vector<float> xv = x.to_vector<float>();
  std::vector<int32_t> yv(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) yv[static_cast<size_t>(i)] = xv[static_cast<size_t>(i * 8)] > 0 ? 1 : 0;
  return {x, Tensor::from_vector<int32_t>(yv, {n})};
}

// Dense + BatchNorm + Dropout + Dense: assignments beyond the optimizer's (moving
// statistics) and a random op per step.
ModelPtr model(bool eager, OptimizerPtr opt) {
  set_seed(42);
  auto m = std::make_shared<Sequential>(
      std::vector<LayerPtr>{L::Dense(16, "relu"), L::BatchNormalization(), L::Dropout(0.25), L::Dense(2)}, Shape{8});
  CompileOptions co{std::move(opt), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}};
  co.run_eagerly = eager;
  m->compile(co);
  return m;
}

void expect_same_state(const Model& a, const Model& b, double tol) {
  std::vector<Variable> wa = a.weights(), wb = b.weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    SCOPED_TRACE(wa[i].name());
    EXPECT_CLOSE(wa[i].peek(), wb[i].peek(), tol, tol);
  }
  std::vector<Variable> oa = a.optimizer()->variables(), ob = b.optimizer()->variables();
  ASSERT_EQ(oa.size(), ob.size());
  for (size_t i = 0; i < oa.size(); ++i) {
    SCOPED_TRACE(oa[i].name());
    if (oa[i].dtype() == DType::kI64)
      EXPECT_TRUE(array_equal(oa[i].peek(), ob[i].peek()));
    else
      EXPECT_CLOSE(oa[i].peek(), ob[i].peek(), tol, tol);
  }
}

TEST(TracedFit, EqualsEagerFit) {
  Data d = data(100);  // batches of 32: three full ones and one of 4 (a second trace)
  FitOptions fo;
  fo.epochs = 3;
  fo.batch_size = 32;
  fo.verbose = 0;
  ModelPtr eager = model(true, optimizers::Adam({0.01}));
  History he = eager->fit(d.x, d.y, fo);
  ModelPtr traced = model(false, optimizers::Adam({0.01}));
  History ht = traced->fit(d.x, d.y, fo);
  EXPECT_EQ(eager->traced_steps(), 0);
  EXPECT_EQ(eager->num_train_traces(), 0);
  // 12 steps: the first eager, the second traced (the trace runs it), the 4-row
  // batch traced once more at step 4.
  EXPECT_EQ(traced->traced_steps(), 11);
  EXPECT_EQ(traced->num_train_traces(), 2);
  EXPECT_EQ(traced->optimizer()->iterations(), 12);
  // Fusion (matmul + bias + ReLU) may round differently: close, not bitwise.
  expect_same_state(*eager, *traced, 1e-5);
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_NEAR(ht.history["loss"][e], he.history["loss"][e], 1e-5);
    EXPECT_NEAR(ht.history["accuracy"][e], he.history["accuracy"][e], 1e-9);
  }
}

// Eager and traced steps update the weights and the optimizer's slots in place: their
// buffers stay where they are from the third step on (the first builds the slots, the
// second is the trace); the moving statistics of batch norm are not optimizer updates
// and get new buffers.
TEST(TracedFit, StepsUpdateVariablesInPlace) {
  Data d = data(64);
  for (bool eager : {true, false}) {
    SCOPED_TRACE(eager ? "eager" : "traced");
    ModelPtr m = model(eager, optimizers::Adam({0.01}));
    auto where = [&] {
      std::vector<const void*> at;
      for (const Variable& v : m->trainable_weights()) at.push_back(v.peek().raw_data());
      for (const Variable& v : m->optimizer()->variables())
        if (v.dtype() != DType::kI64) at.push_back(v.peek().raw_data());
      return at;
    };
    m->train_step({d.x}, {d.y});
    m->train_step({d.x}, {d.y});
    const std::vector<const void*> before = where();
    const Tensor first = m->trainable_weights()[0].peek().clone();
    for (int s = 0; s < 3; ++s) m->train_step({d.x}, {d.y});
    EXPECT_EQ(where(), before);
    EXPECT_FALSE(array_equal(m->trainable_weights()[0].peek(), first));  // and they did change
  }
}

// A learning rate changed between steps (schedules, LearningRateScheduler) reaches
// the traced graph: it is an argument of the traced function, not a traced constant.
TEST(TracedFit, LearningRateChangesReachTheTrace) {
  Data d = data(64);
  auto run = [&](bool eager) {
    ModelPtr m = model(eager, optimizers::SGD({0.1}, 0.9));
    for (int s = 0; s < 6; ++s) {
      m->optimizer()->set_learning_rate(0.1 / (s + 1));
      m->train_step({d.x}, {d.y});
    }
    return m;
  };
  ModelPtr eager = run(true), traced = run(false);
  EXPECT_EQ(traced->traced_steps(), 5);  // steps 2-6 (step 2 is the trace)
  expect_same_state(*eager, *traced, 1e-5);
  // And it matters: a fixed rate gives other weights.
  ModelPtr fixed = model(false, optimizers::SGD({0.1}, 0.9));
  for (int s = 0; s < 6; ++s) fixed->train_step({d.x}, {d.y});
  EXPECT_FALSE(allclose(fixed->weights()[0].peek(), traced->weights()[0].peek(), 1e-4, 1e-4));
}

TEST(TracedFit, HostDecidingOptimizersRunEagerly) {
  Data d = data(64);
  OptimizerOptions clip{0.01};
  clip.clipnorm = 1.0;
  ModelPtr m = model(false, optimizers::Adam(clip));
  EXPECT_FALSE(m->optimizer()->traceable());
  for (int s = 0; s < 3; ++s) m->train_step({d.x}, {d.y});
  EXPECT_EQ(m->traced_steps(), 0);
  EXPECT_EQ(m->optimizer()->iterations(), 3);
  EXPECT_KILN_ERROR(m->optimizer()->apply_gradients_traced({}, {}, Tensor(), Tensor()), kFailedPrecondition,
                    "cannot be traced");
  ModelPtr ok = model(false, optimizers::Adam({0.01}));
  EXPECT_KILN_ERROR(ok->optimizer()->apply_gradients_traced({}, {}, Tensor::scalar<double>(0.1), Tensor()),
                    kInvalidArgument, "hyper must be f64[2]");
}

// compile() again (a new optimizer) drops the trace: the next steps use the new one.
TEST(TracedFit, RecompileTracesAgain) {
  Data d = data(64);
  ModelPtr m = model(false, optimizers::Adam({0.01}));
  for (int s = 0; s < 3; ++s) m->train_step({d.x}, {d.y});
  EXPECT_EQ(m->num_train_traces(), 1);
  m->compile({optimizers::SGD({0.05}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
  EXPECT_EQ(m->num_train_traces(), 0);
  for (int s = 0; s < 3; ++s) m->train_step({d.x}, {d.y});
  EXPECT_EQ(m->num_train_traces(), 1);
  EXPECT_EQ(m->optimizer()->iterations(), 3);
}

// Each stateful layer alone (batch-norm statistics, dropout masks shared by the
// forward op and its gradient), with plain SGD.
TEST(TracedFit, EachStatefulLayerMatchesEager) {
  Data d = data(64);
  for (int variant = 1; variant < 4; ++variant) {
    SCOPED_TRACE(variant & 1 ? (variant & 2 ? "batch norm + dropout" : "batch norm") : "dropout");
    auto run = [&](bool eager) {
      set_seed(42);
      std::vector<LayerPtr> ls{L::Dense(16, "relu")};
      if (variant & 1) ls.push_back(L::BatchNormalization());
      if (variant & 2) ls.push_back(L::Dropout(0.5));
      ls.push_back(L::Dense(2));
      auto m = std::make_shared<Sequential>(ls, Shape{8});
      CompileOptions co{optimizers::SGD({0.1}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}};
      co.run_eagerly = eager;
      m->compile(co);
      for (int s = 0; s < 5; ++s) m->train_step({d.x}, {d.y});
      return m;
    };
    ModelPtr eager = run(true), traced = run(false);
    EXPECT_EQ(traced->traced_steps(), 4);
    expect_same_state(*eager, *traced, 1e-5);
  }
}

}  // namespace
}  // namespace kiln::train

namespace kiln::train {
namespace {

// evaluate() and predict() trace their inference forward after the first batch (one
// trace per batch shape), read the current weights on every call, and equal the eager
// forward; run_eagerly keeps them eager.
TEST(TracedInference, PredictAndEvaluateEqualTheEagerForward) {
  Data d = data(100);
  ModelPtr m = model(false, optimizers::Adam({0.01}));
  const Tensor eager = (*m)(d.x, /*training=*/false);
  EXPECT_EQ(m->num_predict_traces(), 0);
  const Tensor first = m->predict(d.x, 32);  // 32, 32, 32, 4: the second batch traces
  EXPECT_EQ(m->num_predict_traces(), 2);     // one trace for 32 rows, one for 4
  EXPECT_CLOSE(first, eager, 1e-5, 1e-6);
  // Weights change (a fit): the traces read them as variables, not as constants.
  FitOptions fo;
  fo.epochs = 1;
  fo.batch_size = 32;
  fo.verbose = 0;
  m->fit(d.x, d.y, fo);
  const Tensor after = m->predict(d.x, 32);
  EXPECT_CLOSE(after, (*m)(d.x, false), 1e-5, 1e-6);
  EXPECT_FALSE(allclose(after, first, 1e-3, 1e-3));
  EXPECT_EQ(m->num_predict_traces(), 2);
  // evaluate: the same loss as the eager model's.
  ModelPtr e = model(true, optimizers::Adam({0.01}));
  for (size_t i = 0; i < m->weights().size(); ++i) e->weights()[i].assign(m->weights()[i].peek());
  EvaluateOptions eo;
  const Logs traced_logs = m->evaluate(d.x, d.y, eo), eager_logs = e->evaluate(d.x, d.y, eo);
  EXPECT_NEAR(traced_logs.at("loss"), eager_logs.at("loss"), 1e-5);
  EXPECT_NEAR(traced_logs.at("accuracy"), eager_logs.at("accuracy"), 1e-9);
  EXPECT_EQ(e->num_predict_traces(), 0);  // run_eagerly
}

}  // namespace
}  // namespace kiln::train
