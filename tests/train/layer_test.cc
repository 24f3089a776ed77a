// Layer base class: naming, building, weights, freezing, regularisation, symbolic calls.
#include "kiln/train/layer.h"

#include <gtest/gtest.h>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/train/layers.h"
#include "test_util.h"

namespace kiln::train {
namespace {

using kiln::testing::make;

// A symbolic shape: the per-sample dims with an unknown (-1) batch dimension in
// front (Shape's constructors reject negative dims).
Shape batched(std::initializer_list<int64_t> dims) {
  Shape s(dims);
  s.insert(0, -1);
  return s;
}

Initializer from(Tensor t) {
  return [t](const Shape&, DType) { return t; };
}

// A layer with its own weight and a tracked Dense sublayer: y = dense(x) * scale.
class Scaled : public UnaryLayer {
 public:
  explicit Scaled(std::string name = "") : UnaryLayer(std::move(name)) {}
  std::string type() const override { return "ScaledBlock"; }
  LayerPtr dense;
  Variable scale, counter;

 protected:
  void build(const std::vector<Shape>& shapes) override {
    dense = layers::Dense(2, layers::DenseOptions{.kernel_initializer = initializers::ones()});
    track(dense);
    scale = add_weight("scale", {2}, initializers::constant(3), true, regularizers::l1(0.5));
    counter = add_weight("counter", {}, initializers::zeros(), /*trainable=*/false);
    dense->ensure_built(shapes);
  }
  Tensor forward(const Tensor& x, bool) override { return (*dense)(x)*scale.value(); }
};

// Fails to build on inputs whose last dimension is 0 (after creating a weight).
class Picky : public UnaryLayer {
 public:
  using UnaryLayer::UnaryLayer;
  std::string type() const override { return "Picky"; }

 protected:
  void build(const std::vector<Shape>& shapes) override {
    add_weight("w", {1}, initializers::zeros());
    if (shapes[0].dim(-1) == 0) throw InvalidArgumentError("Picky: empty features");
  }
  Tensor forward(const Tensor& x, bool) override { return x; }
};

TEST(LayerTest, SnakeCaseFollowsKeras) {
  EXPECT_EQ(snake_case("Dense"), "dense");
  EXPECT_EQ(snake_case("MultiHeadAttention"), "multi_head_attention");
  EXPECT_EQ(snake_case("Conv2D"), "conv2d");
  EXPECT_EQ(snake_case("MaxPooling2D"), "max_pooling2d");
  EXPECT_EQ(snake_case("GlobalAveragePooling2D"), "global_average_pooling2d");
  EXPECT_EQ(snake_case("HTTPServer"), "http_server");
  EXPECT_EQ(snake_case("BatchNormalization"), "batch_normalization");
}

TEST(LayerTest, AutoNamesAndExplicitNames) {
  LayerPtr d = layers::Dense(3);
  EXPECT_EQ(d->name(), "dense");
  EXPECT_TRUE(d->has_auto_name());
  LayerPtr n = layers::Dense(3, "relu", "head");
  EXPECT_EQ(n->name(), "head");
  EXPECT_FALSE(n->has_auto_name());
  EXPECT_EQ(layers::MultiHeadAttention(2, 4)->name(), "multi_head_attention");
  EXPECT_EQ(layers::MaxPool2D()->name(), "max_pooling2d");
  EXPECT_EQ(layers::GlobalAveragePool2D()->name(), "global_average_pooling2d");
}

TEST(LayerTest, BuildsOnFirstCallWithNamedWeights) {
  LayerPtr d = layers::Dense(4);
  EXPECT_FALSE(d->built());
  EXPECT_TRUE(d->weights().empty());
  EXPECT_EQ(d->count_params(), 0);
  // Renaming before the build (what Model::uniquify_names does) names the weights.
  d->set_name("dense_1");
  Tensor y = (*d)(ops::ones({5, 3}));
  EXPECT_TRUE(d->built());
  EXPECT_EQ(y.shape(), Shape({5, 4}));
  std::vector<Variable> w = d->weights();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].name(), "dense_1/kernel");
  EXPECT_EQ(w[0].shape(), Shape({3, 4}));
  EXPECT_EQ(w[1].name(), "dense_1/bias");
  EXPECT_EQ(w[1].shape(), Shape({4}));
  EXPECT_EQ(d->count_params(), 3 * 4 + 4);
  // A second call reuses the weights.
  (*d)(ops::ones({2, 3}));
  EXPECT_TRUE(d->weights()[0].is_same(w[0]));
  EXPECT_EQ(d->weights().size(), 2u);
}

TEST(LayerTest, EnsureBuiltBuildsWithoutCalling) {
  LayerPtr d = layers::Dense(7);
  d->ensure_built({Shape{1, 5}});
  EXPECT_TRUE(d->built());
  EXPECT_EQ(d->count_params(), 5 * 7 + 7);
  d->ensure_built({Shape{1, 9}});  // no-op once built
  EXPECT_EQ(d->count_params(), 5 * 7 + 7);
}

TEST(LayerTest, FailedBuildLeavesNoWeights) {
  auto p = std::make_shared<Picky>();
  EXPECT_KILN_ERROR((*p)(ops::ones({2, 0})), kInvalidArgument, "empty features");
  EXPECT_FALSE(p->built());
  EXPECT_TRUE(p->weights().empty());
  (*p)(ops::ones({2, 3}));
  EXPECT_TRUE(p->built());
  EXPECT_EQ(p->weights().size(), 1u);
}

TEST(LayerTest, ArityAndUndefinedInputsAreErrorsNamingTheLayer) {
  LayerPtr d = layers::Dense(2, "", "proj");
  EXPECT_KILN_ERROR((*d)(std::vector<Tensor>{ops::ones({1, 2}), ops::ones({1, 2})}), kInvalidArgument,
                    "Dense 'proj': expected 1 input, got 2");
  EXPECT_KILN_ERROR((*d)(std::vector<Tensor>{}), kInvalidArgument, "Dense 'proj'");
  EXPECT_KILN_ERROR((*d)(Tensor()), kInvalidArgument, "Dense 'proj': input 0 is an undefined tensor");
  EXPECT_FALSE(d->built());
}

TEST(LayerTest, InitializerOfWrongShapeIsAnError) {
  LayerPtr d = layers::Dense(2, layers::DenseOptions{.kernel_initializer = from(ops::ones({3, 3}))});
  EXPECT_KILN_ERROR((*d)(ops::ones({1, 3})), kInvalidArgument, "initializer of weight 'kernel'");
}

TEST(LayerTest, SublayerWeightsAreIncluded) {
  auto s = std::make_shared<Scaled>();
  (*s)(ops::ones({1, 3}));
  std::vector<std::string> names;
  for (const Variable& v : s->weights()) names.push_back(v.name());
  EXPECT_EQ(names,
            (std::vector<std::string>{"scaled_block/scale", "scaled_block/counter", "dense/kernel", "dense/bias"}));
  EXPECT_EQ(s->trainable_weights().size(), 3u);
  ASSERT_EQ(s->non_trainable_weights().size(), 1u);
  EXPECT_EQ(s->non_trainable_weights()[0].name(), "scaled_block/counter");
  EXPECT_EQ(s->count_params(), 2 + 1 + 3 * 2 + 2);
  ASSERT_EQ(s->sublayers().size(), 1u);
  EXPECT_EQ(s->sublayers()[0], s->dense);
}

TEST(LayerTest, SharedWeightsAreCountedOnce) {
  auto outer = std::make_shared<Scaled>();
  (*outer)(ops::ones({1, 3}));
  // A second container tracking the same sublayer twice still lists each weight once.
  class Twice : public UnaryLayer {
   public:
    explicit Twice(LayerPtr l) : sub_(std::move(l)) {}
    std::string type() const override { return "Twice"; }

   protected:
    void build(const std::vector<Shape>&) override {
      track(sub_);
      track(sub_);
    }
    Tensor forward(const Tensor& x, bool) override { return (*sub_)((*sub_)(x)); }

   private:
    LayerPtr sub_;
  };
  auto t = std::make_shared<Twice>(outer->dense);
  t->ensure_built({Shape{1, 2}});
  EXPECT_EQ(t->sublayers().size(), 1u);
  EXPECT_EQ(t->weights().size(), 2u);
  EXPECT_EQ(t->count_params(), 3 * 2 + 2);
}

TEST(LayerTest, FrozenLayersHaveNonTrainableWeightsAndNoGradients) {
  auto s = std::make_shared<Scaled>();
  Tensor x = make<float>({1, 2, 3}, {1, 3});
  (*s)(x);
  s->set_trainable(false);
  EXPECT_FALSE(s->trainable());
  EXPECT_FALSE(s->dense->trainable());  // propagates to sublayers, as in Keras
  EXPECT_TRUE(s->trainable_weights().empty());
  EXPECT_EQ(s->non_trainable_weights().size(), 4u);
  for (const Variable& v : s->weights()) EXPECT_FALSE(v.trainable()) << v.name();
  {
    GradientTape tape;
    Tensor loss = ops::sum((*s)(x));
    std::vector<Tensor> g = tape.gradient(loss, s->weights());
    for (const Tensor& t : g) EXPECT_FALSE(t.defined());  // not watched
  }
  // Unfreezing restores each weight's own flag (the counter stays non-trainable).
  s->set_trainable(true);
  EXPECT_EQ(s->trainable_weights().size(), 3u);
  EXPECT_FALSE(s->counter.trainable());
  EXPECT_TRUE(s->scale.trainable());
  GradientTape tape;
  Tensor loss = ops::sum((*s)(x));
  std::vector<Tensor> g = tape.gradient(loss, {s->scale});
  ASSERT_TRUE(g[0].defined());
  // y_j = scale_j * sum(x) (kernel of ones, zero bias): d loss / d scale_j = 6.
  EXPECT_CLOSE(g[0], make<float>({6, 6}, {2}), 1e-6, 1e-6);
}

TEST(LayerTest, FreezingBeforeBuildMakesNewWeightsNonTrainable) {
  auto s = std::make_shared<Scaled>();
  s->set_trainable(false);
  (*s)(ops::ones({1, 3}));  // the Dense sublayer is tracked (and frozen) during the build
  EXPECT_TRUE(s->trainable_weights().empty());
  for (const Variable& v : s->weights()) EXPECT_FALSE(v.trainable()) << v.name();
}

TEST(LayerTest, RegularizersComputePenalties) {
  Tensor w = make<float>({1, -2, 3}, {3});
  EXPECT_NEAR(regularizers::l2(0.1)(w).item<double>(), 0.1 * 14, 1e-6);
  EXPECT_NEAR(regularizers::l1(0.5)(w).item<double>(), 0.5 * 6, 1e-6);
  EXPECT_NEAR(regularizers::l2()(w).item<double>(), 0.01 * 14, 1e-6);  // Keras default factor 0.01
  EXPECT_KILN_ERROR(regularizers::l2(-1), kInvalidArgument, "factor");
}

TEST(LayerTest, RegularizationLossesOfLayerAndSublayers) {
  layers::DenseOptions o;
  o.kernel_initializer = from(make<float>({1, 2, -3, 4}, {2, 2}));
  o.bias_initializer = from(make<float>({-1, 1}, {2}));
  o.kernel_regularizer = regularizers::l2(0.1);
  o.bias_regularizer = regularizers::l1(0.5);
  LayerPtr d = layers::Dense(2, o);
  EXPECT_TRUE(d->regularization_losses().empty());  // not built yet
  (*d)(ops::ones({1, 2}));
  std::vector<Tensor> r = d->regularization_losses();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NEAR(r[0].item<double>(), 0.1 * (1 + 4 + 9 + 16), 1e-6);
  EXPECT_NEAR(r[1].item<double>(), 0.5 * 2, 1e-6);

  // The penalty is differentiable w.r.t. the weight: d(0.1 sum k^2)/dk = 0.2 k.
  {
    GradientTape tape;
    Tensor p = d->regularization_losses()[0];
    Tensor g = tape.gradient(p, {d->weights()[0]})[0];
    EXPECT_CLOSE(g, make<float>({0.2f, 0.4f, -0.6f, 0.8f}, {2, 2}), 1e-6, 1e-6);
  }

  auto s = std::make_shared<Scaled>();
  (*s)(ops::ones({1, 3}));
  std::vector<Tensor> rs = s->regularization_losses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_NEAR(rs[0].item<double>(), 0.5 * (3 + 3), 1e-6);
  // Keras 3: frozen weights contribute no penalty.
  s->set_trainable(false);
  EXPECT_TRUE(s->regularization_losses().empty());
  d->set_trainable(false);
  EXPECT_TRUE(d->regularization_losses().empty());
}

TEST(LayerTest, InputIsSymbolicWithUnknownBatch) {
  SymbolicTensor x = Input({28, 28, 1}, DType::kF32, "image");
  EXPECT_TRUE(x.defined());
  EXPECT_EQ(x.shape(), batched({28, 28, 1}));
  EXPECT_EQ(x.dtype(), DType::kF32);
  EXPECT_EQ(x.node()->layer, nullptr);
  EXPECT_EQ(x.node()->input_name, "image");
  EXPECT_EQ(Input({5}, DType::kI32).dtype(), DType::kI32);
  SymbolicTensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_KILN_ERROR(undefined.shape(), kFailedPrecondition, "undefined");
}

TEST(LayerTest, SymbolicCallsInferShapesAndBuild) {
  SymbolicTensor x = Input({784});
  LayerPtr d1 = layers::Dense(256, "relu");
  SymbolicTensor h = (*d1)(x);
  EXPECT_TRUE(d1->built());
  EXPECT_EQ(d1->count_params(), 200960);
  EXPECT_EQ(h.shape(), batched({256}));
  EXPECT_EQ(h.dtype(), DType::kF32);
  EXPECT_EQ(h.node()->layer, d1);
  ASSERT_EQ(h.node()->inputs.size(), 1u);
  EXPECT_EQ(h.node()->inputs[0].node(), x.node());
  SymbolicTensor y = (*layers::Dense(10))(h);
  EXPECT_EQ(y.shape(), batched({10}));

  // Multi-input layers and images.
  SymbolicTensor img = Input({8, 8, 3});
  SymbolicTensor c = (*layers::Conv2D(4, {3, 3}, {.padding = "same"}))(img);
  EXPECT_EQ(c.shape(), batched({8, 8, 4}));
  SymbolicTensor p = (*layers::MaxPool2D())(c);
  EXPECT_EQ(p.shape(), batched({4, 4, 4}));
  SymbolicTensor cat = (*layers::Concatenate())(std::vector<SymbolicTensor>{p, p})[0];
  EXPECT_EQ(cat.shape(), batched({4, 4, 8}));
  SymbolicTensor f = (*layers::Flatten())(cat);
  EXPECT_EQ(f.shape(), batched({128}));
  // Integer ids keep their dtype through the probe; the embedding output is f32.
  SymbolicTensor ids = Input({6}, DType::kI32);
  SymbolicTensor e = (*layers::Embedding(100, 16))(ids);
  EXPECT_EQ(e.shape(), batched({6, 16}));
  EXPECT_EQ(e.dtype(), DType::kF32);
  SymbolicTensor seq = Input({5, 8});
  SymbolicTensor a = (*layers::MultiHeadAttention(2, 4))(std::vector<SymbolicTensor>{seq, seq})[0];
  EXPECT_EQ(a.shape(), batched({5, 8}));
}

TEST(LayerTest, SymbolicCallErrors) {
  SymbolicTensor x = Input({4});
  LayerPtr d = layers::Dense(2, "", "d");
  EXPECT_KILN_ERROR((*d)(std::vector<SymbolicTensor>{x, x}), kInvalidArgument, "Dense 'd': expected 1 input");
  EXPECT_KILN_ERROR((*d)(SymbolicTensor()), kInvalidArgument, "Dense 'd': symbolic input 0 is undefined");
  // Shape errors surface at wiring time.
  EXPECT_KILN_ERROR((*layers::Conv2D(2, {3, 3}, {}, "c"))(x), kInvalidArgument, "Conv2D 'c'");
  // A layer not owned by a shared_ptr cannot be a graph node.
  Picky on_stack("stack");
  EXPECT_KILN_ERROR(on_stack(x), kFailedPrecondition, "shared_ptr");
}

}  // namespace
}  // namespace kiln::train
