// Losses against NumPy references (the literals below were computed with NumPy in
// f64 from the Keras 3 formulas: mean over the last axis for the pointwise losses,
// clip to [1e-7, 1 - 1e-7] for probabilities, sum over classes for cross-entropy),
// from_logits vs probability agreement, and tape gradients vs central differences.
#include <functional>

#include "kiln/autodiff/tape.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/shape.h"
#include "kiln/train/losses.h"
#include "test_util.h"

namespace kiln::train {
namespace {
using kiln::testing::make;
using kiln::testing::rand_tensor;

Tensor f64(std::vector<double> v, Shape s) { return make<double>(std::move(v), s); }

// Regression data [2, 3].
Tensor reg_true() { return f64({0, 1, 2, 3, -1, 0.5}, {2, 3}); }
Tensor reg_pred() { return f64({0.5, 1, 1, 1, 0, 2.5}, {2, 3}); }

// Tape gradient of fn at x (f64) vs central differences.
void expect_grad_fd(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x0, double tol = 1e-6) {
  Tensor x = x0.clone();
  Tensor g;
  {
    GradientTape tape;
    tape.watch(x);
    Tensor y = fn(x);
    ASSERT_EQ(y.numel(), 1);
    g = tape.gradient(y, std::vector<Tensor>{x})[0];
  }
  ASSERT_TRUE(g.defined());
  const double eps = 1e-6;
  std::vector<double> num(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    Tensor a = x.clone(), b = x.clone();
    a.data<double>()[i] += eps;
    b.data<double>()[i] -= eps;
    num[static_cast<size_t>(i)] = (fn(a).item<double>() - fn(b).item<double>()) / (2 * eps);
  }
  EXPECT_CLOSE(g, make<double>(num, x.shape()), tol, tol);
}

void expect_loss_grad(const LossPtr& loss, const Tensor& y_true, const Tensor& y_pred, double tol = 1e-6) {
  SCOPED_TRACE(loss->name());
  expect_grad_fd([&](const Tensor& p) { return (*loss)(y_true, p); }, y_pred, tol);
}

TEST(LossTest, MeanSquaredError) {
  auto l = losses::MeanSquaredError();
  EXPECT_EQ(l->name(), "mean_squared_error");
  EXPECT_CLOSE(l->per_sample(reg_true(), reg_pred()), f64({0.4166666666666667, 3.0}, {2}), 1e-14, 1e-14);
  EXPECT_NEAR((*l)(reg_true(), reg_pred()).item<double>(), (0.4166666666666667 + 3.0) / 2, 1e-14);
  // f32 in, f32 out; integer y_true is cast.
  Tensor r = (*l)(make<int32_t>({0, 1, 2, 3}, {4}), make<float>({1, 1, 2, 1}, {4}));
  EXPECT_EQ(r.dtype(), DType::kF32);
  EXPECT_EQ(r.shape(), Shape{});
  EXPECT_NEAR(r.item<double>(), 5.0 / 4, 1e-6);
}

TEST(LossTest, MeanAbsoluteError) {
  EXPECT_CLOSE(losses::MeanAbsoluteError()->per_sample(reg_true(), reg_pred()), f64({0.5, 1.6666666666666667}, {2}),
               1e-14, 1e-14);
}

TEST(LossTest, Huber) {
  EXPECT_CLOSE(losses::Huber()->per_sample(reg_true(), reg_pred()), f64({0.20833333333333334, 1.1666666666666667}, {2}),
               1e-14, 1e-14);
  EXPECT_CLOSE(losses::Huber(1.5)->per_sample(reg_true(), reg_pred()),
               f64({0.20833333333333334, 1.4166666666666667}, {2}), 1e-14, 1e-14);
  EXPECT_KILN_ERROR(losses::Huber(0), kInvalidArgument, "delta");
}

// BCE data [3, 2].
Tensor bce_true() { return f64({0, 1, 1, 0, 1, 1}, {3, 2}); }
Tensor bce_logits() { return f64({-1.5, 2.0, 0.3, 0.0, -4.0, 3.0}, {3, 2}); }

TEST(LossTest, BinaryCrossentropy) {
  const Tensor want = f64({0.16417064451286245, 0.6237512125142362, 2.0333686397457758}, {3});
  EXPECT_CLOSE(losses::BinaryCrossentropy(true)->per_sample(bce_true(), bce_logits()), want, 1e-13, 1e-14);
  // Probabilities (sigmoid of the logits) agree.
  EXPECT_CLOSE(losses::BinaryCrossentropy()->per_sample(bce_true(), ops::sigmoid(bce_logits())), want, 1e-12, 1e-14);
  // Probabilities at 0 and 1 are clipped to [1e-7, 1 - 1e-7].
  Tensor q = f64({0.2, 0.9, 0.0, 1.0, 0.5, 0.999}, {3, 2});
  EXPECT_CLOSE(losses::BinaryCrossentropy()->per_sample(bce_true(), q),
               f64({0.164252033486018, 16.1180956512215, 0.3470738404467644}, {3}), 1e-12, 1e-12);
  // Label smoothing 0.2: labels become 0.1 / 0.9.
  EXPECT_CLOSE(losses::BinaryCrossentropy(true, 0.2)->per_sample(bce_true(), bce_logits()),
               f64({0.33917064451286244, 0.6387512125142363, 1.983368639745776}, {3}), 1e-13, 1e-14);
  // Extreme logits stay finite and exact: softplus(100) - 0 = 100, softplus(-100) + 100 = 100.
  EXPECT_CLOSE(losses::BinaryCrossentropy(true)->per_sample(f64({0, 1}, {1, 2}), f64({100, -100}, {1, 2})),
               f64({100}, {1}), 1e-15, 0);
  Tensor f32 = losses::BinaryCrossentropy(true)->per_sample(bce_true().to(DType::kF32), bce_logits().to(DType::kF32));
  EXPECT_EQ(f32.dtype(), DType::kF32);
  EXPECT_CLOSE(f32, want, 1e-6, 1e-6);
}

// CCE data [2, 3].
Tensor cce_true() { return f64({0, 0, 1, 0.2, 0.5, 0.3}, {2, 3}); }
Tensor cce_logits() { return f64({1, 2, 3, 1, -1, 0}, {2, 3}); }

TEST(LossTest, CategoricalCrossentropy) {
  const Tensor want = f64({0.4076059644443804, 1.7076059644443806}, {2});
  EXPECT_CLOSE(losses::CategoricalCrossentropy(true)->per_sample(cce_true(), cce_logits()), want, 1e-13, 1e-14);
  EXPECT_CLOSE(losses::CategoricalCrossentropy()->per_sample(cce_true(), ops::softmax(cce_logits())), want, 1e-12,
               1e-14);
  EXPECT_CLOSE(losses::CategoricalCrossentropy(true, 0.1)->per_sample(cce_true(), cce_logits()),
               f64({0.5076059644443804, 1.6776059644443806}, {2}), 1e-13, 1e-14);
  // Unnormalised probabilities are renormalised, zeros clipped.
  EXPECT_CLOSE(losses::CategoricalCrossentropy()->per_sample(cce_true(), f64({0.1, 0.2, 0.7, 0.0, 0.5, 1.5}, {2, 3})),
               f64({0.35667494393873245, 4.003070932487144}, {2}), 1e-12, 1e-12);
}

TEST(LossTest, SparseCategoricalCrossentropy) {
  auto l = losses::SparseCategoricalCrossentropy(true);
  const Tensor want = f64({0.4076059644443804, 0.4076059644443804}, {2});  // labels {2, 0}
  EXPECT_CLOSE(l->per_sample(make<int32_t>({2, 0}, {2}), cce_logits()), want, 1e-13, 1e-14);
  EXPECT_CLOSE(l->per_sample(make<int64_t>({2, 0}, {2, 1}), cce_logits()), want, 1e-13, 1e-14);
  EXPECT_CLOSE(l->per_sample(make<uint8_t>({2, 0}, {2}), cce_logits()), want, 1e-13, 1e-14);
  EXPECT_CLOSE(l->per_sample(make<int8_t>({2, 0}, {2, 1}), cce_logits()), want, 1e-13, 1e-14);
  EXPECT_CLOSE(l->per_sample(make<float>({2, 0}, {2}), cce_logits()), want, 1e-13, 1e-14);
  EXPECT_CLOSE(l->per_sample(make<double>({2, 0}, {2, 1}), cce_logits()), want, 1e-13, 1e-14);
  // Probabilities: renormalised and clipped.
  EXPECT_CLOSE(losses::SparseCategoricalCrossentropy()->per_sample(make<int32_t>({2, 0}, {2}),
                                                                   f64({0.1, 0.2, 0.7, 0.0, 0.5, 1.5}, {2, 3})),
               f64({0.35667494393873245, 16.11809565095832}, {2}), 1e-12, 1e-12);
  EXPECT_CLOSE(
      losses::SparseCategoricalCrossentropy()->per_sample(make<int32_t>({2, 0}, {2}), ops::softmax(cce_logits())), want,
      1e-12, 1e-14);
  // Weighted: Keras's sum_over_batch_size, sum(loss * w) / batch.
  EXPECT_NEAR((*l)(make<int32_t>({2, 0}, {2}), cce_logits(), f64({0.5, 2.0}, {2})).item<double>(), 0.5095074555554755,
              1e-14);
  EXPECT_NEAR((*l)(make<int32_t>({2, 0}, {2}), cce_logits(), make<int64_t>({1, 0}, {2, 1})).item<double>(),
              0.4076059644443804 / 2, 1e-14);
}

TEST(LossTest, SparseMatchesCategoricalOnOneHot) {
  // [batch, time, classes] logits with [batch, time] ids.
  Tensor logits = rand_tensor({2, 4, 5}, DType::kF32, -3, 3, 7);
  Tensor ids = make<int64_t>({0, 4, 2, 1, 3, 3, 0, 2}, {2, 4});
  Tensor sparse = losses::SparseCategoricalCrossentropy(true)->per_sample(ids, logits);
  Tensor dense = losses::CategoricalCrossentropy(true)->per_sample(ops::one_hot(ids, 5), logits);
  EXPECT_EQ(sparse.shape(), Shape{2});
  EXPECT_CLOSE(sparse, dense, 1e-6, 1e-6);
}

TEST(LossTest, Errors) {
  EXPECT_KILN_ERROR(losses::MeanSquaredError()->per_sample(f64({1, 2, 3, 4, 5, 6}, {3, 2}), reg_pred()),
                    kInvalidArgument, "mean_squared_error: y_true shape [3, 2] does not match y_pred shape [2, 3]");
  EXPECT_KILN_ERROR(losses::BinaryCrossentropy()->per_sample(f64({1}, {1}), reg_pred()), kInvalidArgument,
                    "binary_crossentropy");
  auto s = losses::SparseCategoricalCrossentropy(true);
  EXPECT_KILN_ERROR(s->per_sample(make<int32_t>({3, 0}, {2}), cce_logits()), kOutOfRange,
                    "sparse_categorical_crossentropy");
  EXPECT_KILN_ERROR(s->per_sample(make<int64_t>({0, -1}, {2}), cce_logits()), kOutOfRange, "class id -1 at position 1");
  EXPECT_KILN_ERROR(s->per_sample(make<float>({0, 3}, {2, 1}), cce_logits()), kOutOfRange, "outside [0, 3)");
  EXPECT_KILN_ERROR(s->per_sample(make<int32_t>({0, 1, 2}, {3}), cce_logits()), kInvalidArgument, "[3]");
  EXPECT_KILN_ERROR(s->per_sample(make<bool>({true, false}, {2}), cce_logits()), kInvalidArgument, "bool");
  EXPECT_KILN_ERROR((*losses::MeanSquaredError())(reg_true(), reg_pred(), f64({1, 2, 3}, {3})), kInvalidArgument,
                    "sample_weight");
  EXPECT_KILN_ERROR(losses::BinaryCrossentropy(false, 1.5), kInvalidArgument, "label_smoothing");
  EXPECT_KILN_ERROR(losses::get("hinge"), kInvalidArgument, "hinge");
}

TEST(LossTest, GetByName) {
  EXPECT_EQ(losses::get("mse")->name(), "mean_squared_error");
  EXPECT_EQ(losses::get("mae")->name(), "mean_absolute_error");
  EXPECT_EQ(losses::get("huber")->name(), "huber_loss");
  EXPECT_EQ(losses::get("binary_crossentropy")->name(), "binary_crossentropy");
  EXPECT_EQ(losses::get("categorical_crossentropy")->name(), "categorical_crossentropy");
  auto s = losses::get("sparse_categorical_crossentropy");
  EXPECT_EQ(s->name(), "sparse_categorical_crossentropy");
  // get() gives the probability form: a softmax output reproduces the logits reference.
  EXPECT_CLOSE(s->per_sample(make<int32_t>({2, 0}, {2}), ops::softmax(cce_logits())),
               f64({0.4076059644443804, 0.4076059644443804}, {2}), 1e-12, 1e-14);
}

TEST(LossTest, GradientsMatchFiniteDifferences) {
  // Data away from the kinks (|e| = 0 or delta, the clip bounds).
  Tensor rt = reg_true(), rp = f64({0.5, 1.3, 1, 1, 0.2, 2.25}, {2, 3});
  expect_loss_grad(losses::MeanSquaredError(), rt, rp);
  expect_loss_grad(losses::MeanAbsoluteError(), rt, rp);
  expect_loss_grad(losses::Huber(), rt, rp);
  expect_loss_grad(losses::BinaryCrossentropy(true), bce_true(), bce_logits());
  expect_loss_grad(losses::BinaryCrossentropy(true, 0.1), bce_true(), bce_logits());
  expect_loss_grad(losses::BinaryCrossentropy(), bce_true(), f64({0.2, 0.9, 0.6, 0.3, 0.5, 0.95}, {3, 2}));
  expect_loss_grad(losses::CategoricalCrossentropy(true), cce_true(), cce_logits());
  expect_loss_grad(losses::CategoricalCrossentropy(true, 0.1), cce_true(), cce_logits());
  expect_loss_grad(losses::CategoricalCrossentropy(), cce_true(), f64({0.1, 0.2, 0.7, 0.3, 0.5, 1.5}, {2, 3}));
  expect_loss_grad(losses::SparseCategoricalCrossentropy(true), make<int32_t>({2, 0}, {2}), cce_logits());
  expect_loss_grad(losses::SparseCategoricalCrossentropy(), make<int64_t>({1, 0}, {2, 1}),
                   f64({0.1, 0.2, 0.7, 0.3, 0.5, 1.5}, {2, 3}));
  // Sample weights.
  auto mse = losses::MeanSquaredError();
  Tensor w = f64({0.25, 3}, {2});
  expect_grad_fd([&](const Tensor& p) { return (*mse)(rt, p, w); }, rp);
}

}  // namespace
}  // namespace kiln::train
