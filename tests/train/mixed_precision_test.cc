// Mixed precision: dtype policies, variable autocasting, the float32 exceptions
// (normalization, output layers, model outputs), and training under mixed_bfloat16 and
// mixed_float16. References: the same layers computed in f32 by hand.
#include <cmath>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "kiln/train/layers.h"
#include "kiln/train/mixed_precision.h"
#include "kiln/train/model.h"
#include "test_util.h"

namespace kiln::train {
namespace {
using kiln::testing::make;
using kiln::testing::rand_tensor;

// Sets the global policy for one test and restores float32 afterwards.
struct PolicyGuard {
  explicit PolicyGuard(const std::string& name) { set_global_policy(name); }
  ~PolicyGuard() { set_global_policy("float32"); }
};

TEST(MixedPrecisionTest, PolicyNames) {
  EXPECT_EQ(DTypePolicy().name(), "float32");
  EXPECT_FALSE(DTypePolicy().is_mixed());
  DTypePolicy bf("mixed_bfloat16"), f16("mixed_float16");
  EXPECT_EQ(bf.compute_dtype(), DType::kBF16);
  EXPECT_EQ(bf.variable_dtype(), DType::kF32);
  EXPECT_EQ(f16.compute_dtype(), DType::kF16);
  EXPECT_EQ(f16.variable_dtype(), DType::kF32);
  EXPECT_TRUE(f16.is_mixed());
  EXPECT_KILN_ERROR(DTypePolicy("mixed_float8"), kInvalidArgument, "expected float32, mixed_bfloat16");
  EXPECT_KILN_ERROR(set_global_policy("fp16"), kInvalidArgument, "unknown dtype policy 'fp16'");
  EXPECT_EQ(global_policy().name(), "float32");  // unchanged by the failed call
}

TEST(MixedPrecisionTest, LayersTakeTheGlobalPolicyAtConstruction) {
  LayerPtr before = layers::Dense(4);
  PolicyGuard g("mixed_bfloat16");
  LayerPtr after = layers::Dense(4);
  EXPECT_EQ(before->dtype_policy().name(), "float32");
  EXPECT_EQ(after->dtype_policy().name(), "mixed_bfloat16");
  EXPECT_FALSE(after->has_explicit_dtype_policy());
  before->set_dtype_policy(DTypePolicy("mixed_float16"));
  EXPECT_TRUE(before->has_explicit_dtype_policy());
  EXPECT_EQ(before->dtype_policy().compute_dtype(), DType::kF16);
}

TEST(MixedPrecisionTest, AutocastScopeCastsFloatingVariablesOnly) {
  Variable w(make<float>({1.5f, -2.25f}, {2}), "w");
  Variable steps(Tensor::scalar<int64_t>(7), "steps", false);
  EXPECT_EQ(w.value().dtype(), DType::kF32);
  {
    AutocastScope s(DType::kBF16);
    EXPECT_EQ(AutocastScope::current(), DType::kBF16);
    EXPECT_EQ(w.value().dtype(), DType::kBF16);
    EXPECT_EQ(steps.value().dtype(), DType::kI64);
    EXPECT_EQ(w.peek().dtype(), DType::kF32);  // peek never casts
    {
      AutocastScope off(std::nullopt);
      EXPECT_EQ(w.value().dtype(), DType::kF32);
    }
    EXPECT_EQ(w.value().dtype(), DType::kBF16);
  }
  EXPECT_FALSE(AutocastScope::current().has_value());
  // Gradients flow through the cast back to the f32 variable: d/dw sum(w^2) = 2w.
  GradientTape tape;
  Tensor y;
  {
    AutocastScope s(DType::kF16);
    y = ops::sum(ops::square(w.value()));
  }
  Tensor g = tape.gradient(ops::cast(y, DType::kF32), {w})[0];
  EXPECT_EQ(g.dtype(), DType::kF32);
  EXPECT_CLOSE(g, make<float>({3.0f, -4.5f}, {2}), 0, 1e-6);
}

// y = x @ W + b in f32, the reference for the mixed layers.
Tensor dense_ref(const Tensor& x, const LayerPtr& d) {
  return ops::add(ops::matmul(x, d->weights()[0].peek()), d->weights()[1].peek());
}

TEST(MixedPrecisionTest, DenseComputesInBf16WithF32Variables) {
  PolicyGuard g("mixed_bfloat16");
  LayerPtr d = layers::Dense(8);
  Tensor x = rand_tensor({16, 32}, DType::kF32, -1, 1, 3);
  Tensor y = d(x);
  EXPECT_EQ(y.dtype(), DType::kBF16);
  for (const Variable& v : d->weights()) EXPECT_EQ(v.dtype(), DType::kF32);
  // bf16 has an 8-bit significand: relative error ~2^-8 per rounding.
  EXPECT_CLOSE(y.to(DType::kF32), dense_ref(x, d), 0.03, 0.03);

  GradientTape tape;
  Tensor loss = ops::sum(ops::cast(d(x), DType::kF32));
  std::vector<Tensor> grads = tape.gradient(loss, d->trainable_weights());
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads[0].dtype(), DType::kF32);
  // d/dW sum(xW + b) = x^T 1, d/db = batch size.
  Tensor want_w = ops::matmul(ops::transpose(x, {1, 0}), ops::ones({16, 8}));
  EXPECT_CLOSE(grads[0], want_w, 0.05, 0.02);
  EXPECT_CLOSE(grads[1], ops::full({8}, 16.0), 0, 1e-6);
}

TEST(MixedPrecisionTest, SequentialOutputLayerAndOutputsStayF32) {
  PolicyGuard g("mixed_bfloat16");
  LayerPtr hidden = layers::Dense(16, "relu");
  LayerPtr out = layers::Dense(3, "softmax");
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{hidden, out}, Shape{5});
  EXPECT_EQ(m->dtype_policy().name(), "mixed_bfloat16");
  EXPECT_EQ(hidden->dtype_policy().name(), "mixed_bfloat16");
  EXPECT_EQ(out->dtype_policy().name(), "float32");  // the final activation runs in f32
  Tensor x = rand_tensor({4, 5}, DType::kF32, -1, 1, 5);
  EXPECT_EQ(hidden(x).dtype(), DType::kBF16);
  Tensor y = (*m)(x);
  EXPECT_EQ(y.dtype(), DType::kF32);
  // The f32 output layer reads its kernel in f32 even inside the bf16 model.
  Tensor h = ops::relu(dense_ref(x, hidden));
  EXPECT_CLOSE(y, ops::softmax(dense_ref(h, out), -1), 0.02, 0.02);
}

TEST(MixedPrecisionTest, ExplicitOutputPolicyIsKeptButModelOutputsAreF32) {
  PolicyGuard g("mixed_float16");
  LayerPtr out = layers::Dense(3);
  out->set_dtype_policy(DTypePolicy("mixed_float16"));
  auto x = Input({5});
  auto y = out(layers::Dense(8)(x));
  auto m = Model::functional({x}, {y});
  EXPECT_EQ(out->dtype_policy().name(), "mixed_float16");
  EXPECT_EQ(m->outputs()[0].dtype(), DType::kF32);
  EXPECT_EQ((*m)(rand_tensor({2, 5}, DType::kF32)).dtype(), DType::kF32);
}

TEST(MixedPrecisionTest, FunctionalOutputLayerDefaultsToF32) {
  PolicyGuard g("mixed_bfloat16");
  auto x = Input({6});
  LayerPtr h = layers::Dense(8, "relu"), o = layers::Dense(2);
  auto y = o(h(x));
  EXPECT_EQ(y.dtype(), DType::kBF16);  // traced before the model existed
  auto m = Model::functional({x}, {y});
  EXPECT_EQ(o->dtype_policy().name(), "float32");
  EXPECT_EQ(m->outputs()[0].dtype(), DType::kF32);
}

TEST(MixedPrecisionTest, BatchNormKeepsF32StatisticsAndReturnsComputeDtype) {
  PolicyGuard g("mixed_bfloat16");
  LayerPtr bn = layers::BatchNormalization();
  Tensor x = rand_tensor({32, 4}, DType::kF32, -3, 5, 9).to(DType::kBF16);
  Tensor y = bn(x, /*training=*/true);
  EXPECT_EQ(y.dtype(), DType::kBF16);
  for (const Variable& v : bn->weights()) EXPECT_EQ(v.dtype(), DType::kF32);
  // Normalised per feature: mean ~0, variance ~1 (computed in f32, rounded to bf16).
  Tensor yf = y.to(DType::kF32);
  EXPECT_CLOSE(ops::mean(yf, {0}), ops::zeros({4}), 0, 0.02);
  EXPECT_CLOSE(ops::mean(ops::square(yf), {0}), ops::ones({4}), 0.02, 0.02);
  // The moving mean moved towards the batch mean of the f32 values (momentum 0.99).
  Tensor want = ops::mul(ops::mean(x.to(DType::kF32), {0}), ops::scalar(0.01));
  EXPECT_CLOSE(bn->weights()[2].peek(), want, 1e-5, 1e-5);
}

// Two Gaussian blobs per class in 8-d: separable, so a small MLP reaches high accuracy.
void blobs(Tensor* x, Tensor* y, int64_t n, uint64_t seed) {
  *x = rand_tensor({n, 8}, DType::kF32, -1, 1, seed);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  const float* p = x->data<float>();
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = (p[i * 8] + p[i * 8 + 1] > 0) ? 1 : 0;
  *y = make<int64_t>(labels, {n});
}

ModelPtr mlp() {
  auto m = std::make_shared<Sequential>(
      std::vector<LayerPtr>{layers::Dense(32, "relu"), layers::Dense(32, "relu"), layers::Dense(2)}, Shape{8});
  m->compile({optimizers::Adam(), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
  return m;
}

TEST(MixedPrecisionTest, FitMixedBfloat16Converges) {
  set_seed(11);
  PolicyGuard g("mixed_bfloat16");
  ModelPtr m = mlp();
  EXPECT_EQ(m->optimizer()->name(), "adam");  // bf16 needs no loss scaling
  Tensor x, y;
  blobs(&x, &y, 512, 21);
  History h = m->fit(x, y, {.epochs = 15, .batch_size = 32, .verbose = 0});
  EXPECT_LT(h.at("loss").back(), 0.5 * h.at("loss").front());
  EXPECT_GT(h.at("accuracy").back(), 0.93);
  for (const Variable& v : m->weights()) EXPECT_EQ(v.dtype(), DType::kF32);
}

TEST(MixedPrecisionTest, Float16CompileWrapsTheOptimizerAndRecoversFromOverflow) {
  set_seed(12);
  PolicyGuard g("mixed_float16");
  auto m = std::make_shared<Sequential>(
      std::vector<LayerPtr>{layers::Dense(32, "relu"), layers::Dense(32, "relu"), layers::Dense(2)}, Shape{8});
  // A scale of 2^40 overflows f16 (max 65504) in the backward pass: the first steps
  // are skipped and halve the scale until the gradients are finite.
  auto lso = std::make_shared<LossScaleOptimizer>(optimizers::Adam(), std::ldexp(1.0, 40), 2000);
  m->compile({lso, {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
  EXPECT_EQ(m->optimizer().get(), lso.get());
  Tensor x, y;
  blobs(&x, &y, 512, 22);
  History h = m->fit(x, y, {.epochs = 15, .batch_size = 32, .verbose = 0});
  EXPECT_GT(lso->skipped_steps(), 0);
  EXPECT_LT(lso->loss_scale(), std::ldexp(1.0, 40));
  EXPECT_GE(lso->loss_scale(), 1.0);
  EXPECT_EQ(lso->iterations(), 15 * 16);  // skipped steps count too
  EXPECT_GT(h.at("accuracy").back(), 0.93);
  for (const Variable& v : m->weights()) EXPECT_TRUE(std::isfinite(ops::sum(v.peek()).item<double>()));

  auto auto_wrapped = std::make_shared<Sequential>(std::vector<LayerPtr>{layers::Dense(2)}, Shape{8});
  auto_wrapped->compile({optimizers::SGD(), {losses::SparseCategoricalCrossentropy(true)}});
  auto* w = dynamic_cast<LossScaleOptimizer*>(auto_wrapped->optimizer().get());
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->loss_scale(), 32768.0);
  EXPECT_EQ(w->inner()->name(), "sgd");
}

TEST(MixedPrecisionTest, CompilePrecisionRetrofitsABuiltModel) {
  set_seed(13);
  LayerPtr hidden = layers::Dense(32, "relu"), pinned = layers::Dense(32, "relu"), out = layers::Dense(2);
  pinned->set_dtype_policy(DTypePolicy("float32"));
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{hidden, pinned, out}, Shape{8});
  Tensor x, y;
  blobs(&x, &y, 256, 23);
  const Tensor before = (*m)(x);
  EXPECT_KILN_ERROR(m->compile({optimizers::Adam(), {losses::SparseCategoricalCrossentropy(true)}, {}, {}, {}, "fp8"}),
                    kInvalidArgument, "unknown dtype policy 'fp8'");
  EXPECT_EQ(hidden->dtype_policy().name(), "float32");  // a rejected compile changes nothing
  m->compile({optimizers::Adam(), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}, {}, {}, "mixed_float16"});
  EXPECT_EQ(m->dtype_policy().name(), "mixed_float16");
  EXPECT_EQ(hidden->dtype_policy().name(), "mixed_float16");
  EXPECT_EQ(pinned->dtype_policy().name(), "float32");  // explicit policies are kept
  EXPECT_EQ(out->dtype_policy().name(), "float32");     // the output layer stays f32
  EXPECT_NE(dynamic_cast<LossScaleOptimizer*>(m->optimizer().get()), nullptr);
  EXPECT_EQ(hidden(x).dtype(), DType::kF16);
  // Same weights, now computed through f16: close to the f32 outputs, not identical.
  const Tensor after = (*m)(x);
  EXPECT_EQ(after.dtype(), DType::kF32);
  EXPECT_FALSE(array_equal(after, before));
  EXPECT_CLOSE(after, before, 0.02, 0.02);
  History h = m->fit(x, y, {.epochs = 10, .batch_size = 32, .verbose = 0});
  EXPECT_GT(h.at("accuracy").back(), 0.9);
}

}  // namespace
}  // namespace kiln::train
