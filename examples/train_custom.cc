// A user-defined model trained with kiln's Keras-style API, using only public headers:
// a custom layer (a residual MLP block), a functional model around it, a cosine
// learning-rate schedule, callbacks, and a GradientTape-written training step.
//
//   build/default/examples/train_custom [samples]   (Fashion-MNIST from Debian's package)
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "kiln/kiln.h"
#include "kiln/train.h"

using namespace kiln;
using namespace kiln::train;

// y = x + W2 relu(W1 x + b1) + b2: a layer with its own weights.
class ResidualBlock : public UnaryLayer {
 public:
  explicit ResidualBlock(int64_t hidden, std::string name = "") : UnaryLayer(std::move(name)), hidden_(hidden) {}
  std::string type() const override { return "ResidualBlock"; }

 protected:
  void build(const std::vector<Shape>& in) override {
    int64_t d = in[0].dim(in[0].rank() - 1);
    w1_ = add_weight("w1", {d, hidden_}, initializers::he_normal());
    b1_ = add_weight("b1", {hidden_}, initializers::zeros());
    w2_ = add_weight("w2", {hidden_, d}, initializers::glorot_uniform(), true, regularizers::l2(1e-5));
    b2_ = add_weight("b2", {d}, initializers::zeros());
  }
  Tensor forward(const Tensor& x, bool) override {
    Tensor h = ops::relu(ops::matmul(x, w1_.value()) + b1_.value());
    return x + ops::matmul(h, w2_.value()) + b2_.value();
  }

 private:
  int64_t hidden_;
  Variable w1_, b1_, w2_, b2_;
};

int main(int argc, char** argv) {
  try {
    const int64_t n = argc > 1 ? std::atoll(argv[1]) : 6000;
    set_seed(1);
    data::FashionMnist ds = data::load_fashion_mnist();
    auto prep = [n](const Tensor& images) {
      int64_t m = std::min(n, images.dim(0));
      return ops::reshape(ops::cast(ops::slice(images, {0, 0, 0}, {m, 28, 28}), DType::kF32) * (1.0 / 255), {m, 784});
    };
    auto labels = [n](const Tensor& l) { return ops::cast(ops::slice(l, {0}, {std::min(n, l.dim(0))}), DType::kI32); };
    Tensor x = prep(ds.train_images), y = labels(ds.train_labels);
    Tensor tx = prep(ds.test_images), ty = labels(ds.test_labels);

    // Functional model: input -> dense -> residual block -> dropout -> logits.
    auto in = Input({784}, DType::kF32, "pixels");
    auto h = layers::Dense(128, "relu")(in);
    h = LayerPtr(std::make_shared<ResidualBlock>(64))(h);
    h = layers::Dropout(0.1, 7)(h);
    auto out = layers::Dense(10, "linear", "logits")(h);
    auto model = Model::functional({in}, {out}, "residual_mlp");
    model->summary(std::cout);

    const int epochs = 3;
    const int64_t steps = epochs * ((x.dim(0) + 63) / 64);
    model->compile({optimizers::AdamW({schedules::CosineDecay(2e-3, steps, 0.0, steps / 10)}),
                    {losses::SparseCategoricalCrossentropy(/*from_logits=*/true)},
                    {"accuracy"}});
    History hist = model->fit(x, y, {.epochs = epochs,
                                     .batch_size = 64,
                                     .validation_split = 0.1,
                                     .callbacks = {callbacks::EarlyStopping("val_loss", 0, 2)},
                                     .verbose = 2});

    // The same step written by hand with a GradientTape, as a custom loop would.
    Tensor xb = ops::slice(x, {0, 0}, {64, 784}), yb = ops::slice(y, {0}, {64});
    GradientTape tape;
    Tensor loss = (*losses::SparseCategoricalCrossentropy(true))(yb, (*model)(xb, true));
    std::vector<Tensor> grads = tape.gradient(loss, model->trainable_weights());
    model->optimizer()->apply_gradients(grads, model->trainable_weights());

    Logs test = model->evaluate(tx, ty, {256});
    std::printf("epochs run %zu, test accuracy %.4f\n", hist.at("loss").size(), test["accuracy"]);
    return test["accuracy"] > 0.75 ? 0 : 1;
  } catch (const kiln::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
