// Embedding: integer ids -> rows of a trainable table.
#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "layer_util.h"

namespace kiln::train::layers {

namespace {

class EmbeddingLayer final : public UnaryLayer {
 public:
  EmbeddingLayer(int64_t input_dim, int64_t output_dim, Initializer init, std::string name)
      : UnaryLayer(std::move(name)), input_dim_(input_dim), output_dim_(output_dim), init_(std::move(init)) {
    KILN_CHECK_ARG(input_dim > 0 && output_dim > 0, "Embedding: input_dim and output_dim must be positive, got ",
                   input_dim, " and ", output_dim);
  }
  std::string type() const override { return "Embedding"; }

 protected:
  void build(const std::vector<Shape>&) override {
    table_ = add_weight("embeddings", {input_dim_, output_dim_}, init_);
  }

  Tensor forward(const Tensor& x, bool) override {
    Tensor ids = x;
    if (ids.dtype() != DType::kI32 && ids.dtype() != DType::kI64) {
      // Keras casts other ids to int32; a float id must be integral to mean a row.
      if (is_floating(ids.dtype()) && !array_equal(ids, ops::floor(ids)))
        detail::layer_error(*this, "ids must be integers, got non-integral values in ", x.desc());
      ids = ops::cast(ids, DType::kI64);
    }
    try {
      return ops::embedding(table_.value(), ids);
    } catch (const OutOfRangeError& e) {
      throw OutOfRangeError(detail::layer_label(*this) + ": " + e.what());
    }
  }

 private:
  int64_t input_dim_, output_dim_;
  Initializer init_;
  Variable table_;
};

}  // namespace

LayerPtr Embedding(int64_t input_dim, int64_t output_dim, Initializer init, std::string name) {
  return std::make_shared<EmbeddingLayer>(input_dim, output_dim, std::move(init), std::move(name));
}

}  // namespace kiln::train::layers
