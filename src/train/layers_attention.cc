// MultiHeadAttention (keras.layers.MultiHeadAttention for [batch, seq, features] inputs).
#include <cmath>
#include <limits>

#include "kiln/core/random.h"
#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "layer_util.h"

namespace kiln::train::layers {

namespace {

using detail::layer_error;

class MultiHeadAttentionLayer final : public Layer {
 public:
  MultiHeadAttentionLayer(int64_t heads, int64_t key_dim, MultiHeadAttentionOptions opts, std::string name)
      : Layer(std::move(name)), heads_(heads), key_dim_(key_dim), opts_(opts) {
    KILN_CHECK_ARG(heads > 0 && key_dim > 0, "MultiHeadAttention: num_heads and key_dim must be positive, got ", heads,
                   " and ", key_dim);
    KILN_CHECK_ARG(opts.value_dim == -1 || opts.value_dim > 0,
                   "MultiHeadAttention: value_dim must be positive (or -1 for "
                   "key_dim), got ",
                   opts.value_dim);
    KILN_CHECK_ARG(opts.output_dim == -1 || opts.output_dim > 0,
                   "MultiHeadAttention: output_dim must be positive (or -1 for "
                   "the query's), got ",
                   opts.output_dim);
    KILN_CHECK_ARG(opts.dropout >= 0 && opts.dropout < 1, "MultiHeadAttention: dropout must be in [0, 1), got ",
                   opts.dropout);
    value_dim_ = opts.value_dim > 0 ? opts.value_dim : key_dim;
  }
  std::string type() const override { return "MultiHeadAttention"; }

 protected:
  int num_inputs() const override { return -1; }

  void build(const std::vector<Shape>& shapes) override {
    check_count(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i)
      if (shapes[i].rank() != 3)
        layer_error(*this, kRoles[i], " must be [batch, seq, features], got shape ", shapes[i].str());
    dq_ = shapes[0][2];
    dv_ = shapes[1][2];
    dk_ = shapes.size() == 3 ? shapes[2][2] : dv_;
    out_dim_ = opts_.output_dim > 0 ? opts_.output_dim : dq_;
    // EinsumDense-shaped kernels, in Keras' order and with Keras' names.
    auto init = initializers::glorot_uniform();
    auto zeros = initializers::zeros();
    q_kernel_ = add_weight("query/kernel", {dq_, heads_, key_dim_}, init);
    if (opts_.use_bias) q_bias_ = add_weight("query/bias", {heads_, key_dim_}, zeros);
    k_kernel_ = add_weight("key/kernel", {dk_, heads_, key_dim_}, init);
    if (opts_.use_bias) k_bias_ = add_weight("key/bias", {heads_, key_dim_}, zeros);
    v_kernel_ = add_weight("value/kernel", {dv_, heads_, value_dim_}, init);
    if (opts_.use_bias) v_bias_ = add_weight("value/bias", {heads_, value_dim_}, zeros);
    o_kernel_ = add_weight("attention_output/kernel", {heads_, value_dim_, out_dim_}, init);
    if (opts_.use_bias) o_bias_ = add_weight("attention_output/bias", {out_dim_}, zeros);
  }

  std::vector<Tensor> call(const std::vector<Tensor>& in, bool training) override {
    check_count(in.size());
    const Tensor& query = in[0];
    const Tensor& value = in[1];
    const Tensor& key = in.size() == 3 ? in[2] : in[1];
    check_input(0, query, dq_);
    check_input(1, value, dv_);
    check_input(2, key, dk_);
    const int64_t batch = query.dim(0), tq = query.dim(1), tv = value.dim(1);
    if (value.dim(0) != batch || key.dim(0) != batch || key.dim(1) != tv)
      layer_error(*this, "query ", query.desc(), ", value ", value.desc(), " and key ", key.desc(),
                  " must share the batch size, and key and value the sequence length");

    Tensor q = project(query, q_kernel_, q_bias_, key_dim_);    // [B, H, Tq, kd]
    Tensor k = project(key, k_kernel_, k_bias_, key_dim_);      // [B, H, Tv, kd]
    Tensor v = project(value, v_kernel_, v_bias_, value_dim_);  // [B, H, Tv, vd]

    Tensor o;
    if (training && opts_.dropout > 0) {
      // Dropout acts on the attention probabilities, which the fused kernel never forms.
      Tensor scores = ops::matmul(q, k, false, true) * (1.0 / std::sqrt(static_cast<double>(key_dim_)));
      if (opts_.causal) scores = ops::add(scores, causal_mask(tq, tv, scores.dtype()));
      Tensor probs = ops::dropout(ops::softmax(scores, -1), opts_.dropout, kiln::draw_seed(), true);
      o = ops::matmul(probs, v);
    } else {
      o = ops::scaled_dot_product_attention(q, k, v, Tensor(), opts_.causal);
    }
    // [B, H, Tq, vd] -> [B*Tq, H*vd] @ [H*vd, out] -> [B, Tq, out]
    Tensor flat = ops::reshape(ops::transpose(o, {0, 2, 1, 3}), {batch * tq, heads_ * value_dim_});
    Tensor y = ops::matmul(flat, ops::reshape(o_kernel_.value(), {heads_ * value_dim_, out_dim_}));
    if (o_bias_.defined()) y = ops::add(y, o_bias_.value());
    return {ops::reshape(y, {batch, tq, out_dim_})};
  }

 private:
  static constexpr const char* kRoles[3] = {"query", "value", "key"};

  void check_count(size_t n) const {
    if (n != 2 && n != 3) layer_error(*this, "takes {query, value} or {query, value, key}, got ", n, " inputs");
  }
  void check_input(int role, const Tensor& x, int64_t features) const {
    if (x.rank() != 3 || x.dim(2) != features)
      layer_error(*this, "was built for ", kRoles[role], " [batch, seq, ", features, "], got ", x.desc());
  }

  // x [B, T, D] with kernel [D, H, d] (+ bias [H, d]) -> [B, H, T, d].
  Tensor project(const Tensor& x, const Variable& kernel, const Variable& bias, int64_t d) const {
    const int64_t b = x.dim(0), t = x.dim(1), in = x.dim(2);
    Tensor y = ops::matmul(ops::reshape(x, {b * t, in}), ops::reshape(kernel.value(), {in, heads_ * d}));
    if (bias.defined()) y = ops::add(y, ops::reshape(bias.value(), {heads_ * d}));
    return ops::transpose(ops::reshape(y, {b, t, heads_, d}), {0, 2, 1, 3});
  }

  // Additive mask [Tq, Tk]: -inf where key j > query i (top-left aligned, as the fused kernel).
  static Tensor causal_mask(int64_t tq, int64_t tk, DType dt) {
    std::vector<float> m(static_cast<size_t>(tq * tk), 0.0f);
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = i + 1; j < tk; ++j) m[static_cast<size_t>(i * tk + j)] = -std::numeric_limits<float>::infinity();
    return Tensor::from_vector<float>(m, {tq, tk}).to(dt);
  }

  int64_t heads_, key_dim_, value_dim_ = 0;
  MultiHeadAttentionOptions opts_;
  int64_t dq_ = 0, dk_ = 0, dv_ = 0, out_dim_ = 0;
  Variable q_kernel_, q_bias_, k_kernel_, k_bias_, v_kernel_, v_bias_, o_kernel_, o_bias_;
};

}  // namespace

LayerPtr MultiHeadAttention(int64_t num_heads, int64_t key_dim, MultiHeadAttentionOptions opts, std::string name) {
  return std::make_shared<MultiHeadAttentionLayer>(num_heads, key_dim, opts, std::move(name));
}

}  // namespace kiln::train::layers
