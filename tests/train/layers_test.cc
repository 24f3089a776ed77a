// Built-in layers: values against NumPy references, Keras parameter counts, input checks.
//
// Reference numbers come from float64 NumPy (scripts noted next to each); inputs are
// generated identically here: seq(n, step, start) = start + step * i and
// wave(shape, a, b, s) = s * sin(a * i + b) over the flat index i.
#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/train/layers.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace kiln::train {
namespace {

using kiln::testing::make;

Tensor seq(const Shape& s, double step, double start) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + step * static_cast<double>(i);
  return Tensor::from_vector<double>(v, s).to(DType::kF32);
}

Tensor wave(const Shape& s, double a, double b, double scale = 1) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(a * static_cast<double>(i) + b);
  return Tensor::from_vector<double>(v, s).to(DType::kF32);
}

Tensor f32(std::vector<float> v, Shape s) { return make<float>(std::move(v), s); }

Initializer given(Tensor t) {
  return [t](const Shape&, DType) { return t; };
}

// ---- activations ---------------------------------------------------------------------

TEST(LayersActivationTest, NamesMatchNumPy) {
  const Tensor x = f32({-2, -0.5, 0, 0.5, 3, 7}, {6});
  // NumPy float64 on the same x: e.g. gelu = 0.5 x (1 + erf(x / sqrt 2)), elu = where(x > 0, x, exp(x) - 1),
  // leaky_relu slope 0.2, softplus = log1p(exp(x)), softmax over the vector.
  const std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"linear", {-2, -0.5, 0, 0.5, 3, 7}},
      {"", {-2, -0.5, 0, 0.5, 3, 7}},
      {"relu", {0, 0, 0, 0.5, 3, 7}},
      {"relu6", {0, 0, 0, 0.5, 3, 6}},
      {"sigmoid", {0.1192029, 0.3775407, 0.5, 0.6224593, 0.9525741, 0.9990889}},
      {"tanh", {-0.9640276, -0.4621172, 0, 0.4621172, 0.9950548, 0.9999983}},
      {"softmax", {0.0001208233, 0.0005414924, 0.00089277, 0.001471929, 0.01793177, 0.9790412}},
      {"log_softmax", {-9.021182, -7.521182, -7.021182, -6.521182, -4.021182, -0.02118153}},
      {"gelu", {-0.04550026, -0.1542688, 0, 0.3457312, 2.99595, 7}},
      {"silu", {-0.2384058, -0.1887703, 0, 0.3112297, 2.857722, 6.993623}},
      {"swish", {-0.2384058, -0.1887703, 0, 0.3112297, 2.857722, 6.993623}},
      {"elu", {-0.8646647, -0.3934693, 0, 0.5, 3, 7}},
      {"leaky_relu", {-0.4, -0.1, 0, 0.5, 3, 7}},
      {"softplus", {0.126928, 0.474077, 0.6931472, 0.974077, 3.048587, 7.000911}},
  };
  for (const auto& [name, want] : cases) {
    SCOPED_TRACE(name);
    EXPECT_CLOSE(layers::activation(name, x), f32(want, {6}), 1e-5, 1e-6);
    LayerPtr a = layers::Activation(name);
    EXPECT_CLOSE((*a)(x), f32(want, {6}), 1e-5, 1e-6);
    EXPECT_EQ(a->count_params(), 0);
  }
}

TEST(LayersActivationTest, UnknownNameListsKnownOnes) {
  EXPECT_KILN_ERROR(layers::activation("rleu", ops::ones({2})), kInvalidArgument, "unknown activation 'rleu'");
  EXPECT_KILN_ERROR(layers::activation("rleu", ops::ones({2})), kInvalidArgument, "relu");
  EXPECT_KILN_ERROR(layers::activation("rleu", ops::ones({2})), kInvalidArgument, "softplus");
  // Layers reject a bad name when constructed, not on first use.
  EXPECT_KILN_ERROR(layers::Activation("Relu"), kInvalidArgument, "unknown activation 'Relu'");
  EXPECT_KILN_ERROR(layers::Dense(3, "sigmoidal"), kInvalidArgument, "unknown activation 'sigmoidal'");
  EXPECT_KILN_ERROR(layers::Conv2D(3, {3}, {.activation = "x"}), kInvalidArgument, "unknown activation 'x'");
}

// ---- Dense ---------------------------------------------------------------------------

layers::DenseOptions fixed_dense(const std::string& act) {
  layers::DenseOptions o;
  o.activation = act;
  o.kernel_initializer = given(seq({3, 4}, 0.05, -0.3));
  o.bias_initializer = given(f32({0.1, -0.2, 0.3, -0.4}, {4}));
  return o;
}

TEST(LayersDenseTest, MatchesNumPy) {
  LayerPtr d = layers::Dense(4, fixed_dense("relu"));
  // np.maximum(x @ k + b, 0) with x = seq(6, 0.1, -0.2).reshape(2, 3), k = seq(12, 0.05, -0.3).reshape(3, 4).
  Tensor y = (*d)(seq({2, 3}, 0.1, -0.2));
  EXPECT_CLOSE(y, f32({0.17, 0, 0.34, 0, 0.08, 0, 0.34, 0}, {2, 4}), 1e-5, 1e-6);
}

TEST(LayersDenseTest, ActsOnTheLastAxisOfHigherRankInputs) {
  LayerPtr d = layers::Dense(4, fixed_dense("linear"));
  // x3 = seq(12, 0.1, -0.5).reshape(2, 2, 3); x3 @ k + b.
  Tensor y = (*d)(seq({2, 2, 3}, 0.1, -0.5));
  EXPECT_CLOSE(
      y,
      f32({0.26, -0.1, 0.34, -0.42, 0.17, -0.145, 0.34, -0.375, 0.08, -0.19, 0.34, -0.33, -0.01, -0.235, 0.34, -0.285},
          {2, 2, 4}),
      1e-5, 1e-6);
}

TEST(LayersDenseTest, ParameterCountsAndNoBias) {
  LayerPtr d = layers::Dense(256);
  d->ensure_built({Shape{1, 784}});
  EXPECT_EQ(d->count_params(), 200960);  // Keras: Dense(256) on 784 features
  LayerPtr nb = layers::Dense(3, layers::DenseOptions{.use_bias = false});
  nb->ensure_built({Shape{1, 5}});
  EXPECT_EQ(nb->count_params(), 15);
  EXPECT_EQ(nb->weights().size(), 1u);
}

TEST(LayersDenseTest, GlorotUniformKernelIsWithinLimit) {
  set_seed(3);
  LayerPtr d = layers::Dense(30);
  (*d)(ops::ones({1, 20}));
  // Keras glorot_uniform: U(-sqrt(6 / (20 + 30)), +sqrt(6 / 50)) = U(-0.3464, 0.3464).
  Tensor k = d->weights()[0].peek();
  EXPECT_LE(ops::max(ops::abs(k)).item<double>(), std::sqrt(6.0 / 50) + 1e-6);
  EXPECT_GT(ops::max(ops::abs(k)).item<double>(), 0.3);
  EXPECT_TRUE(array_equal(d->weights()[1].peek(), ops::zeros({30})));
  // kiln::set_seed makes the initialisation reproducible.
  set_seed(3);
  LayerPtr d2 = layers::Dense(30);
  (*d2)(ops::ones({1, 20}));
  EXPECT_TRUE(array_equal(d2->weights()[0].peek(), k));
}

TEST(LayersDenseTest, WrongInputAfterBuildNamesTheLayer) {
  LayerPtr d = layers::Dense(4, "", "dense_7");
  (*d)(ops::ones({2, 3}));
  EXPECT_KILN_ERROR((*d)(ops::ones({2, 5})), kInvalidArgument, "Dense 'dense_7': was built for inputs [..., 3]");
  EXPECT_KILN_ERROR((*d)(ops::ones({3})), kInvalidArgument, "Dense 'dense_7'");
  LayerPtr fresh = layers::Dense(4);
  EXPECT_KILN_ERROR((*fresh)(ops::ones({3})), kInvalidArgument, "Dense 'dense': expects an input of rank >= 2");
  EXPECT_KILN_ERROR(layers::Dense(0), kInvalidArgument, "units");
}

// ---- Flatten, Reshape ------------------------------------------------------------------

TEST(LayersShapeTest, FlattenAndReshape) {
  Tensor x = seq({2, 3, 4}, 1, 0);
  Tensor f = (*layers::Flatten())(x);
  EXPECT_EQ(f.shape(), Shape({2, 12}));
  EXPECT_TRUE(array_equal(f, seq({2, 12}, 1, 0)));
  LayerPtr flat = layers::Flatten("flat");
  (*flat)(x);
  EXPECT_KILN_ERROR((*flat)(ops::ones({2, 12})), kInvalidArgument, "Flatten 'flat': was built for inputs of rank 3");

  Tensor r = (*layers::Reshape({3, -1}))(f);
  EXPECT_EQ(r.shape(), Shape({2, 3, 4}));
  EXPECT_TRUE(array_equal(r, x));
  EXPECT_EQ((*layers::Reshape({4, 3}))(f).shape(), Shape({2, 4, 3}));
  EXPECT_KILN_ERROR((*layers::Reshape({5, -1}, "rs"))(f), kInvalidArgument,
                    "Reshape 'rs': cannot reshape samples of 12");
  EXPECT_KILN_ERROR((*layers::Reshape({5}))(f), kInvalidArgument, "cannot reshape");
  EXPECT_KILN_ERROR(layers::Reshape({-1, -1}), kInvalidArgument, "at most one");
}

// ---- Conv2D, pooling -------------------------------------------------------------------

layers::Conv2DOptions fixed_conv() {
  layers::Conv2DOptions o;
  o.kernel_initializer = given(wave({3, 3, 2, 2}, 0.3, 1.0, 0.2));
  o.bias_initializer = given(f32({0.1, -0.1}, {2}));
  return o;
}

TEST(LayersConvTest, ValidAndSameMatchNumPy) {
  // NumPy loop over output pixels: y[:, i, j] = einsum('nhwc,hwco->no', padded patch, w) + b,
  // x = wave((1,4,4,2), 0.7, 0), w = wave((3,3,2,2), 0.3, 1.0, 0.2); TF "same" pads bottom/right by 1 at stride 2.
  const Tensor x = wave({1, 4, 4, 2}, 0.7, 0.0);
  LayerPtr valid = layers::Conv2D(2, {3, 3}, fixed_conv());
  EXPECT_CLOSE((*valid)(x),
               f32({0.06280437, -0.08306866, 0.08316249, -0.07812408, 0.07788842, -0.09903861, 0.0649476, -0.0745696},
                   {1, 2, 2, 2}),
               1e-4, 1e-6);
  layers::Conv2DOptions o = fixed_conv();
  o.strides = {2};
  o.padding = "SAME";
  LayerPtr same = layers::Conv2D(2, {3}, o);
  EXPECT_CLOSE((*same)(x),
               f32({0.06280437, -0.08306866, -0.00479049, -0.2307915, 0.3712372, -0.003513712, 0.07721055, 0.002746304},
                   {1, 2, 2, 2}),
               1e-4, 1e-6);
  o.activation = "relu";
  LayerPtr relu = layers::Conv2D(2, {3, 3}, o);
  EXPECT_CLOSE((*relu)(x), f32({0.06280437, 0, 0, 0, 0.3712372, 0, 0.07721055, 0.002746304}, {1, 2, 2, 2}), 1e-4, 1e-6);
}

TEST(LayersConvTest, ParameterCountsAndShapes) {
  LayerPtr c = layers::Conv2D(32, {3, 3});
  Tensor y = (*c)(ops::ones({2, 28, 28, 1}));
  EXPECT_EQ(c->count_params(), 320);  // Keras: Conv2D(32, 3) on 1 channel
  EXPECT_EQ(y.shape(), Shape({2, 26, 26, 32}));
  EXPECT_EQ(c->weights()[0].shape(), Shape({3, 3, 1, 32}));  // HWIO
  LayerPtr g = layers::Conv2D(6, {3, 3}, {.padding = "same", .dilation_rate = {2, 2}, .groups = 2});
  EXPECT_EQ((*g)(ops::ones({1, 9, 9, 4})).shape(), Shape({1, 9, 9, 6}));
  EXPECT_EQ(g->weights()[0].shape(), Shape({3, 3, 2, 6}));
  EXPECT_EQ(g->count_params(), 3 * 3 * 2 * 6 + 6);
}

TEST(LayersConvTest, BadArgumentsAndInputs) {
  EXPECT_KILN_ERROR(layers::Conv2D(4, {3, 3}, {.padding = "full"}), kInvalidArgument, "padding");
  EXPECT_KILN_ERROR(layers::Conv2D(4, {3, 3, 3}), kInvalidArgument, "kernel_size");
  EXPECT_KILN_ERROR(layers::Conv2D(5, {3, 3}, {.groups = 2}), kInvalidArgument, "groups");
  LayerPtr c = layers::Conv2D(4, {3, 3}, {}, "conv");
  EXPECT_KILN_ERROR((*c)(ops::ones({4, 4, 3})), kInvalidArgument, "Conv2D 'conv': expects NHWC");
  (*c)(ops::ones({1, 5, 5, 3}));
  EXPECT_KILN_ERROR((*c)(ops::ones({1, 5, 5, 2})), kInvalidArgument, "Conv2D 'conv': was built for NHWC inputs");
  EXPECT_KILN_ERROR((*c)(ops::ones({5, 5, 3})), kInvalidArgument, "Conv2D 'conv'");
}

TEST(LayersPoolTest, MaxAndAverage) {
  const Tensor x = seq({1, 4, 4, 1}, 1, 0);  // rows 0..3, 4..7, 8..11, 12..15
  EXPECT_TRUE(array_equal((*layers::MaxPool2D())(x), f32({5, 7, 13, 15}, {1, 2, 2, 1})));
  EXPECT_CLOSE((*layers::AveragePool2D())(x), f32({2.5, 4.5, 10.5, 12.5}, {1, 2, 2, 1}), 1e-6, 1e-6);
  // 2x2 windows at stride 1: the max is the bottom-right cell of each window.
  EXPECT_TRUE(
      array_equal((*layers::MaxPool2D({2, 2}, {1, 1}))(x), f32({5, 6, 7, 9, 10, 11, 13, 14, 15}, {1, 3, 3, 1})));
  // "same" 3x3 at stride 2: windows rows/cols {0,1,2}, {2,3} -> max at (2,2), (2,3), (3,2), (3,3).
  EXPECT_TRUE(array_equal((*layers::MaxPool2D({3, 3}, {2, 2}, "same"))(x), f32({10, 11, 14, 15}, {1, 2, 2, 1})));
  LayerPtr p = layers::MaxPool2D({2, 2}, {}, "valid", "pool");
  EXPECT_EQ(p->count_params(), 0);
  EXPECT_KILN_ERROR((*p)(ops::ones({4, 4, 1})), kInvalidArgument, "MaxPooling2D 'pool'");
  (*p)(x);
  EXPECT_KILN_ERROR((*p)(ops::ones({1, 4, 4, 2})), kInvalidArgument, "MaxPooling2D 'pool': was built for");
  EXPECT_KILN_ERROR(layers::AveragePool2D({2, 2}, {}, "causal"), kInvalidArgument, "padding");
}

TEST(LayersPoolTest, GlobalPools) {
  // x[0] = [[[1, -1], [2, 5]], [[3, 0], [6, -2]]] (H=W=2, C=2).
  const Tensor x = f32({1, -1, 2, 5, 3, 0, 6, -2, 0, 0, 0, 0, 0, 0, 0, 4}, {2, 2, 2, 2});
  EXPECT_CLOSE((*layers::GlobalAveragePool2D())(x), f32({3, 0.5, 0, 1}, {2, 2}), 1e-6, 1e-6);
  EXPECT_TRUE(array_equal((*layers::GlobalMaxPool2D())(x), f32({6, 5, 0, 4}, {2, 2})));
  LayerPtr g = layers::GlobalMaxPool2D("gmp");
  EXPECT_KILN_ERROR((*g)(ops::ones({2, 3})), kInvalidArgument, "GlobalMaxPooling2D 'gmp'");
}

// ---- BatchNormalization, LayerNormalization, Dropout --------------------------------

// x [4, 3]; NumPy: m = x.mean(0) = [0.5, 2, 0], v = x.var(0) = [3.25, 2, 3] (biased).
const std::vector<float> kBnX = {1, 2, -1, 3, 0, -1, -2, 4, -1, 0, 2, 3};

TEST(LayersBatchNormTest, ParameterCounts) {
  LayerPtr bn = layers::BatchNormalization();
  bn->ensure_built({Shape{1, 8, 8, 64}});
  EXPECT_EQ(bn->count_params(), 256);  // Keras: gamma, beta, moving_mean, moving_variance
  EXPECT_EQ(bn->non_trainable_weights().size(), 2u);
  int64_t non_trainable = 0;
  for (const Variable& v : bn->non_trainable_weights()) non_trainable += v.numel();
  EXPECT_EQ(non_trainable, 128);
  std::vector<std::string> names;
  for (const Variable& v : bn->weights()) names.push_back(v.name());
  EXPECT_EQ(names,
            (std::vector<std::string>{"batch_normalization/gamma", "batch_normalization/beta",
                                      "batch_normalization/moving_mean", "batch_normalization/moving_variance"}));
  LayerPtr bare = layers::BatchNormalization({.center = false, .scale = false});
  bare->ensure_built({Shape{1, 5}});
  EXPECT_EQ(bare->count_params(), 10);
  EXPECT_TRUE(bare->trainable_weights().empty());
}

TEST(LayersBatchNormTest, TrainingUsesBatchStatsAndUpdatesMovingAverages) {
  LayerPtr bn = layers::BatchNormalization({.momentum = 0.9});
  const Tensor x = f32(kBnX, {4, 3});
  // (x - m) / sqrt(v + 1e-3)
  EXPECT_CLOSE((*bn)(x, /*training=*/true),
               f32({0.2773074, 0, -0.5772541, 1.386537, -1.41386, -0.5772541, -1.386537, 1.41386, -0.5772541,
                    -0.2773074, 0, 1.731762},
                   {4, 3}),
               1e-5, 1e-5);
  // moving = 0.9 * moving + 0.1 * batch, from (0, 1).
  std::vector<Variable> w = bn->weights();
  EXPECT_CLOSE(w[2].peek(), f32({0.05, 0.2, 0}, {3}), 1e-6, 1e-6);
  EXPECT_CLOSE(w[3].peek(), f32({1.225, 1.1, 1.2}, {3}), 1e-6, 1e-6);
  // Inference uses the moving statistics and leaves them alone: (x - mm) / sqrt(mv + 1e-3).
  const Tensor want = f32({0.8579824, 1.715453, -0.9124908, 2.664261, -0.1906059, -0.9124908, -1.851436, 3.621512,
                           -0.9124908, -0.04515697, 1.715453, 2.737472},
                          {4, 3});
  EXPECT_CLOSE((*bn)(x), want, 1e-5, 1e-5);
  EXPECT_CLOSE(w[2].peek(), f32({0.05, 0.2, 0}, {3}), 1e-6, 1e-6);
  // A frozen BatchNormalization runs in inference mode even when training (Keras).
  bn->set_trainable(false);
  EXPECT_CLOSE((*bn)(x, /*training=*/true), want, 1e-5, 1e-5);
  EXPECT_CLOSE(w[3].peek(), f32({1.225, 1.1, 1.2}, {3}), 1e-6, 1e-6);
}

TEST(LayersBatchNormTest, ChannelsOnOtherAxesAndInputChecks) {
  LayerPtr bn = layers::BatchNormalization({.axis = 1}, "bn");
  // [N=4, C=3, L=1]: the same statistics as the [4, 3] case.
  Tensor y = (*bn)(f32(kBnX, {4, 3, 1}), true);
  EXPECT_EQ(y.shape(), Shape({4, 3, 1}));
  EXPECT_CLOSE(bn->weights()[2].peek(), f32({0.005, 0.02, 0}, {3}), 1e-6, 1e-6);  // momentum 0.99
  EXPECT_KILN_ERROR((*bn)(ops::ones({4, 2, 1})), kInvalidArgument, "BatchNormalization 'bn': was built for");
  EXPECT_KILN_ERROR((*bn)(ops::ones({4, 3})), kInvalidArgument, "BatchNormalization 'bn'");
  EXPECT_KILN_ERROR((*layers::BatchNormalization({.axis = 3}, "b2"))(ops::ones({2, 3})), kInvalidArgument,
                    "BatchNormalization 'b2': axis 3 is out of range");
}

TEST(LayersLayerNormTest, MatchesNumPy) {
  LayerPtr ln = layers::LayerNormalization();
  // (x - x.mean(-1)) / sqrt(x.var(-1) + 1e-3)
  Tensor y = (*ln)(f32({1, 2, 3, 6, -1, 0, 0, 5}, {2, 4}));
  EXPECT_CLOSE(y, f32({-1.068892, -0.5344461, 0, 1.603338, -0.8527253, -0.4263627, -0.4263627, 1.705451}, {2, 4}), 1e-5,
               1e-5);
  EXPECT_EQ(ln->count_params(), 8);
  // From axis 1 to the end of [2, 3, 4]: gamma/beta [3, 4]; each sample normalised as a whole.
  LayerPtr ln2 = layers::LayerNormalization(1e-3, 1, "ln2");
  Tensor x = seq({2, 3, 4}, 1, 0);
  Tensor y2 = (*ln2)(x);
  EXPECT_EQ(ln2->weights()[0].shape(), Shape({3, 4}));
  // Each sample is 12 consecutive integers: mean 5.5 (+12), var (12^2 - 1) / 12.
  const double sd = std::sqrt(143.0 / 12 + 1e-3);
  EXPECT_NEAR(y2.to_vector<float>()[0], -5.5 / sd, 1e-5);
  EXPECT_NEAR(y2.to_vector<float>()[23], 5.5 / sd, 1e-5);
  EXPECT_KILN_ERROR((*ln2)(ops::ones({2, 3, 5})), kInvalidArgument, "LayerNormalization 'ln2': was built for");
}

TEST(LayersDropoutTest, OffInInferenceScaledInTraining) {
  set_seed(11);
  LayerPtr d = layers::Dropout(0.25);
  const Tensor x = ops::full({100, 100}, 2.0);
  EXPECT_TRUE(array_equal((*d)(x), x));  // inference: identity
  Tensor y = (*d)(x, /*training=*/true);
  std::vector<float> v = y.to_vector<float>();
  int64_t zeros = 0;
  for (float f : v) {
    if (f == 0) {
      ++zeros;
    } else {
      EXPECT_NEAR(f, 2.0 / 0.75, 1e-5);  // kept elements scaled by 1 / (1 - rate)
    }
  }
  // Binomial(10000, 0.25): mean 2500, sd 43.
  EXPECT_GT(zeros, 2300);
  EXPECT_LT(zeros, 2700);
  // A new mask per call.
  EXPECT_FALSE(array_equal((*d)(x, true), y));
  // Reproducible under kiln::set_seed.
  set_seed(11);
  LayerPtr d2 = layers::Dropout(0.25);
  EXPECT_TRUE(array_equal((*d2)(x, true), y));
  EXPECT_EQ(d->count_params(), 0);
  EXPECT_KILN_ERROR(layers::Dropout(1.0), kInvalidArgument, "rate");
}

TEST(LayersDropoutTest, SeededLayersRepeatTheirSequence) {
  const Tensor x = ops::ones({64});
  LayerPtr a = layers::Dropout(0.5, 42), b = layers::Dropout(0.5, 42), c = layers::Dropout(0.5, 43);
  set_seed(1);
  Tensor a1 = (*a)(x, true), a2 = (*a)(x, true);
  set_seed(2);  // the layer seed, not the global one, decides
  Tensor b1 = (*b)(x, true), b2 = (*b)(x, true);
  EXPECT_TRUE(array_equal(a1, b1));
  EXPECT_TRUE(array_equal(a2, b2));
  EXPECT_FALSE(array_equal(a1, a2));
  EXPECT_FALSE(array_equal((*c)(x, true), a1));
}

// ---- Embedding -------------------------------------------------------------------------

TEST(LayersEmbeddingTest, LooksUpRows) {
  LayerPtr e = layers::Embedding(4, 3, given(seq({4, 3}, 1, 0)), "emb");
  Tensor ids = make<int32_t>({0, 3, 2, 2}, {2, 2});
  Tensor y = (*e)(ids);
  EXPECT_TRUE(array_equal(y, f32({0, 1, 2, 9, 10, 11, 6, 7, 8, 6, 7, 8}, {2, 2, 3})));
  EXPECT_EQ(e->count_params(), 12);
  EXPECT_EQ(e->weights()[0].name(), "emb/embeddings");
  // Integral float ids are accepted (Keras casts them), fractional ones are not.
  EXPECT_TRUE(array_equal((*e)(f32({1, 0}, {2})), f32({3, 4, 5, 0, 1, 2}, {2, 3})));
  EXPECT_KILN_ERROR((*e)(f32({1.5}, {1})), kInvalidArgument, "Embedding 'emb': ids must be integers");
  EXPECT_TRUE(array_equal((*e)(make<int64_t>({1}, {1})), f32({3, 4, 5}, {1, 3})));
}

TEST(LayersEmbeddingTest, OutOfRangeIdsNameTheLayer) {
  LayerPtr e = layers::Embedding(10, 4, initializers::random_uniform(), "tok");
  EXPECT_KILN_ERROR((*e)(make<int32_t>({1, 10}, {2})), kOutOfRange, "Embedding 'tok'");
  EXPECT_KILN_ERROR((*e)(make<int32_t>({-1}, {1})), kOutOfRange, "Embedding 'tok'");
  EXPECT_KILN_ERROR(layers::Embedding(0, 4), kInvalidArgument, "input_dim");
  // Default initializer: U(-0.05, 0.05).
  (*e)(make<int32_t>({0}, {1}));
  EXPECT_LE(ops::max(ops::abs(e->weights()[0].peek())).item<double>(), 0.05);
}

// ---- MultiHeadAttention ---------------------------------------------------------------

// Sets the weights in Keras order (q, k, v, output; kernel then bias) to
// wave(shape, 0.11 * (i + 1), 0.3 * i, 0.5), as the NumPy reference does.
void set_mha_weights(const Layer& mha) {
  std::vector<Variable> w = mha.weights();
  ASSERT_EQ(w.size(), 8u);
  for (size_t i = 0; i < w.size(); ++i) w[i].assign(wave(w[i].shape(), 0.11 * double(i + 1), 0.3 * double(i), 0.5));
}

TEST(LayersAttentionTest, ParameterCountMatchesKeras) {
  LayerPtr mha = layers::MultiHeadAttention(2, 4);
  Tensor q = ops::ones({1, 5, 8});
  EXPECT_EQ((*mha)(std::vector<Tensor>{q, q})[0].shape(), Shape({1, 5, 8}));
  // Keras: 3 * (8*2*4 + 2*4) + (2*4*8 + 8) = 288.
  EXPECT_EQ(mha->count_params(), 288);
  std::vector<std::string> names;
  for (const Variable& v : mha->weights()) names.push_back(v.name() + v.shape().str());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "multi_head_attention/query/kernel[8, 2, 4]", "multi_head_attention/query/bias[2, 4]",
                       "multi_head_attention/key/kernel[8, 2, 4]", "multi_head_attention/key/bias[2, 4]",
                       "multi_head_attention/value/kernel[8, 2, 4]", "multi_head_attention/value/bias[2, 4]",
                       "multi_head_attention/attention_output/kernel[2, 4, 8]",
                       "multi_head_attention/attention_output/bias[8]"}));
  LayerPtr nb = layers::MultiHeadAttention(2, 4, {.value_dim = 3, .output_dim = 5, .use_bias = false});
  Tensor y = (*nb)(std::vector<Tensor>{ops::ones({2, 3, 6}), ops::ones({2, 4, 7})})[0];
  EXPECT_EQ(y.shape(), Shape({2, 3, 5}));
  EXPECT_EQ(nb->count_params(), 6 * 8 + 7 * 8 + 7 * 6 + 6 * 5);
}

TEST(LayersAttentionTest, CrossAttentionMatchesNumPy) {
  // NumPy: q/k/v = einsum('btd,dhk->bhtk', input, kernel) + bias; softmax(q k^T / sqrt(4)) v;
  // einsum('bhqv,hvo->bqo', o, out_kernel) + out_bias; query = wave((2,3,8), 0.37, 0.1),
  // value = key = wave((2,4,8), 0.53, 0.2).
  LayerPtr mha = layers::MultiHeadAttention(2, 4);
  const Tensor q = wave({2, 3, 8}, 0.37, 0.1), v = wave({2, 4, 8}, 0.53, 0.2);
  mha->ensure_built({q.shape(), v.shape()});
  set_mha_weights(*mha);
  Tensor y = (*mha)(std::vector<Tensor>{q, v})[0];
  EXPECT_CLOSE(y,
               f32({0.2437053, -0.2546147, -0.6222799, -0.5857133, -0.1379709,  0.4373297, 0.7485252, 0.5655624,
                    0.2254599, -0.3139065, -0.6891669, -0.6224593, -0.1238447,  0.4943585, 0.8162821, 0.6058204,
                    0.2410646, -0.2403627, -0.5991759, -0.5667921, -0.1339074,  0.4242429, 0.7256714, 0.5458352,
                    0.2206451, -0.361267,  -0.7523534, -0.6658232, -0.1229211,  0.5390485, 0.8795255, 0.6519365,
                    0.1430112, -0.3668257, -0.6827008, -0.5602558, -0.04099775, 0.5511084, 0.814918,  0.5471118,
                    0.2498326, -0.3440622, -0.7568379, -0.6894669, -0.1523847,  0.5203877, 0.8821955, 0.674431},
                   {2, 3, 8}),
               1e-4, 1e-5);
  // An explicit key equal to the value gives the same result.
  Tensor y_key = (*mha)(std::vector<Tensor>{q, v, v})[0];
  EXPECT_CLOSE(y_key, y, 1e-6, 1e-6);
}

TEST(LayersAttentionTest, CausalSelfAttentionMatchesNumPy) {
  // As above with query = value = key = wave((2,3,8), 0.37, 0.1) and scores masked to j <= i.
  LayerPtr mha = layers::MultiHeadAttention(2, 4, {.causal = true});
  const Tensor q = wave({2, 3, 8}, 0.37, 0.1);
  mha->ensure_built({q.shape(), q.shape()});
  set_mha_weights(*mha);
  const Tensor want = f32({0.2234042, -0.3393694, -0.7236714, -0.6465386, -0.1239138, 0.5183385, 0.8507823, 0.6313765,
                           0.2644817, -0.2808504, -0.6807262, -0.6433959, -0.1623467, 0.4600131, 0.8054703, 0.624642,
                           0.2315703, -0.3190161, -0.7026139, -0.636657,  -0.1307832, 0.4985938, 0.8293018, 0.620279,
                           0.4098068, -0.1208841, -0.5963682, -0.6822392, -0.3024767, 0.2976547, 0.7124827, 0.6534867,
                           0.2527136, -0.2926648, -0.6859214, -0.6390409, -0.1508985, 0.4720957, 0.8113705, 0.621031,
                           0.2546713, -0.2834742, -0.6746831, -0.6320953, -0.1521641, 0.4633328, 0.8000543, 0.6135457},
                          {2, 3, 8});
  Tensor y = (*mha)(std::vector<Tensor>{q, q})[0];
  EXPECT_CLOSE(y, want, 1e-4, 1e-5);
  // Attention dropout is off in inference; in training the unfused path with rate ~0
  // (nothing dropped) must agree with the fused kernel, causal mask included.
  LayerPtr dropped = layers::MultiHeadAttention(2, 4, {.dropout = 1e-9, .causal = true});
  dropped->ensure_built({q.shape(), q.shape()});
  set_mha_weights(*dropped);
  Tensor y_train = (*dropped)(std::vector<Tensor>{q, q}, /*training=*/true)[0];
  EXPECT_CLOSE(y_train, want, 1e-4, 1e-5);
}

TEST(LayersAttentionTest, InputChecks) {
  LayerPtr mha = layers::MultiHeadAttention(2, 4, {}, "att");
  Tensor q = ops::ones({2, 3, 8});
  EXPECT_KILN_ERROR((*mha)(q), kInvalidArgument, "MultiHeadAttention 'att': takes {query, value}");
  EXPECT_KILN_ERROR((*mha)(std::vector<Tensor>{ops::ones({3, 8}), q}), kInvalidArgument,
                    "MultiHeadAttention 'att': query must be [batch, seq, features]");
  (*mha)(std::vector<Tensor>{q, q});
  EXPECT_KILN_ERROR((*mha)(std::vector<Tensor>{q, ops::ones({2, 3, 6})}), kInvalidArgument,
                    "MultiHeadAttention 'att': was built for value [batch, seq, 8]");
  EXPECT_KILN_ERROR((*mha)(std::vector<Tensor>{q, ops::ones({3, 3, 8})}), kInvalidArgument, "share the batch size");
  EXPECT_KILN_ERROR(layers::MultiHeadAttention(0, 4), kInvalidArgument, "num_heads");
}

// ---- merging ---------------------------------------------------------------------------

TEST(LayersMergeTest, AddAndConcatenate) {
  const Tensor a = f32({1, 2, 3, 4}, {2, 2}), b = f32({10, 20, 30, 40}, {2, 2}), c = f32({100, 200}, {1, 2});
  EXPECT_TRUE(array_equal((*layers::Add())(std::vector<Tensor>{a, b, c})[0], f32({111, 222, 133, 244}, {2, 2})));
  EXPECT_TRUE(
      array_equal((*layers::Concatenate())(std::vector<Tensor>{a, b})[0], f32({1, 2, 10, 20, 3, 4, 30, 40}, {2, 4})));
  EXPECT_TRUE(
      array_equal((*layers::Concatenate(0))(std::vector<Tensor>{a, c})[0], f32({1, 2, 3, 4, 100, 200}, {3, 2})));
  EXPECT_KILN_ERROR((*layers::Add("add"))(std::vector<Tensor>{a}), kInvalidArgument, "Add 'add': needs at least 2");
  EXPECT_KILN_ERROR((*layers::Add())(std::vector<Tensor>{a, ops::ones({3})}), kInvalidArgument,
                    "Add 'add': inputs have incompatible shapes [2, 2], [3]");
  EXPECT_KILN_ERROR((*layers::Concatenate(-1, "cat"))(std::vector<Tensor>{a, c}), kInvalidArgument,
                    "Concatenate 'cat': inputs must have equal shapes except on axis -1");
  EXPECT_KILN_ERROR((*layers::Concatenate(2, "cat"))(std::vector<Tensor>{a, b}), kInvalidArgument,
                    "Concatenate 'cat': axis 2 is out of range");
}

// ---- gradients -------------------------------------------------------------------------

// Runs the layer under a tape in training mode and checks that every trainable weight
// gets a defined gradient of its own shape.
void expect_gradients(Layer& layer, const std::vector<Tensor>& inputs) {
  SCOPED_TRACE(layer.type());
  layer.ensure_built([&] {
    std::vector<Shape> s;
    for (const Tensor& t : inputs) s.push_back(t.shape());
    return s;
  }());
  std::vector<Variable> w = layer.trainable_weights();
  ASSERT_FALSE(w.empty());
  GradientTape tape;
  Tensor y = layer(inputs, /*training=*/true)[0];
  // A non-uniform weighting so that normalisation layers have non-zero gradients.
  Tensor loss = ops::sum(ops::mul(y, wave(y.shape(), 0.9, 0.4)));
  std::vector<Tensor> g = tape.gradient(loss, w);
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_TRUE(g[i].defined()) << w[i].name();
    EXPECT_EQ(g[i].shape(), w[i].shape()) << w[i].name();
    EXPECT_GT(ops::max(ops::abs(g[i])).item<double>(), 0) << w[i].name();
  }
}

TEST(LayersGradientTest, DenseGradientIsXTransposeTimesUpstream) {
  LayerPtr d = layers::Dense(4, fixed_dense("linear"));
  const Tensor x = seq({2, 3}, 0.1, -0.2);  // column sums [-0.1, 0.1, 0.3]
  (*d)(x);
  GradientTape tape;
  Tensor loss = ops::sum((*d)(x));
  std::vector<Tensor> g = tape.gradient(loss, d->trainable_weights());
  // dL/dk[i][j] = sum_n x[n][i]; dL/db[j] = batch size.
  EXPECT_CLOSE(g[0], f32({-0.1, -0.1, -0.1, -0.1, 0.1, 0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.3}, {3, 4}), 1e-5, 1e-6);
  EXPECT_CLOSE(g[1], f32({2, 2, 2, 2}, {4}), 1e-6, 1e-6);
}

TEST(LayersGradientTest, ReachEveryTrainableWeight) {
  set_seed(5);
  const Tensor x2 = wave({4, 6}, 0.7, 0.3), x3 = wave({2, 5, 6}, 0.45, 0.2), img = wave({2, 6, 6, 3}, 0.31, 0.5);
  expect_gradients(*layers::Dense(3, "tanh"), {x2});
  expect_gradients(*layers::Dense(3), {x3});
  expect_gradients(*layers::Conv2D(4, {3, 3}, {.padding = "same", .activation = "relu"}), {img});
  expect_gradients(*layers::BatchNormalization(), {img});
  expect_gradients(*layers::BatchNormalization(), {x2});
  expect_gradients(*layers::LayerNormalization(), {x3});
  expect_gradients(*layers::Embedding(7, 4), {make<int32_t>({0, 3, 6, 3, 1, 2}, {2, 3})});
  expect_gradients(*layers::MultiHeadAttention(2, 4), {x3, x3});
  expect_gradients(*layers::MultiHeadAttention(2, 3, {.causal = true}), {x3, wave({2, 4, 6}, 0.2, 0.1)});
  expect_gradients(*layers::MultiHeadAttention(2, 3, {.dropout = 0.2}), {x3, x3});
}

TEST(LayersGradientTest, FlowThroughWeightlessLayers) {
  // Gradients reach a Dense kernel through pooling, flatten, reshape, dropout and merges.
  set_seed(6);
  const Tensor img = wave({2, 4, 4, 2}, 0.31, 0.5);
  auto check = [&](const std::function<Tensor(const Tensor&)>& f, const char* what) {
    SCOPED_TRACE(what);
    LayerPtr d = layers::Dense(3);
    GradientTape tape;
    Tensor loss = ops::sum(ops::mul((*d)(f(img)), wave({2, 3}, 0.5, 0.1)));
    Tensor g = tape.gradient(loss, d->trainable_weights())[0];
    ASSERT_TRUE(g.defined());
    EXPECT_GT(ops::max(ops::abs(g)).item<double>(), 0);
  };
  check([](const Tensor& x) { return (*layers::Flatten())((*layers::MaxPool2D())(x)); }, "max_pool");
  check([](const Tensor& x) { return (*layers::Flatten())((*layers::AveragePool2D())(x)); }, "avg_pool");
  check([](const Tensor& x) { return (*layers::GlobalAveragePool2D())(x); }, "gap");
  check([](const Tensor& x) { return (*layers::GlobalMaxPool2D())(x); }, "gmp");
  check([](const Tensor& x) { return (*layers::Reshape({-1}))((*layers::Dropout(0.3))(x, true)); }, "dropout");
  check(
      [](const Tensor& x) {
        Tensor f = (*layers::Flatten())(x);
        return (*layers::Concatenate())(std::vector<Tensor>{(*layers::Add())(std::vector<Tensor>{f, f})[0], f})[0];
      },
      "merge");
  // Input gradients too (the tape watches x).
  LayerPtr c = layers::Conv2D(2, {3, 3});
  GradientTape tape;
  tape.watch(img);
  Tensor gx = tape.gradient(ops::sum((*c)(img)), std::vector<Tensor>{img})[0];
  ASSERT_TRUE(gx.defined());
  EXPECT_EQ(gx.shape(), img.shape());
}

}  // namespace
}  // namespace kiln::train
