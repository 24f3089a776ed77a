// Finite-difference cases for the nn vjps (softmax, convolution, pooling,
// normalisation, dropout, embedding, attention), plus a few direct checks of
// properties the table cannot express (second derivatives, masked rows).
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "kiln/autodiff/tape.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/nn_grad.h"
#include "kiln/ops/reduce.h"

namespace kiln::testing {
namespace {

using In = const std::vector<Tensor>&;
using ops::Conv2dOptions;
using ops::Padding;

Conv2dOptions conv_opts(std::vector<int64_t> strides, Padding padding, std::vector<int64_t> dilations = {1, 1},
                        int64_t groups = 1, std::string fmt = "NHWC") {
  Conv2dOptions o;
  o.strides = std::move(strides);
  o.padding = std::move(padding);
  o.dilations = std::move(dilations);
  o.groups = groups;
  o.data_format = std::move(fmt);
  return o;
}

const double kInf = std::numeric_limits<double>::infinity();

// ---- softmax -----------------------------------------------------------------------------

KILN_GRAD_CASES({
    {"softmax/last", {"softmax"}, {rnd({2, 5}, 101, -2, 2)}, [](In x) { return ops::softmax(x[0]); }},
    {"softmax/axis0", {"softmax"}, {rnd({3, 2, 2}, 102, -2, 2)}, [](In x) { return ops::softmax(x[0], 0); }},
    {"log_softmax/last", {"log_softmax"}, {rnd({2, 5}, 103, -2, 2)}, [](In x) { return ops::log_softmax(x[0]); }},
    {"log_softmax/axis1", {"log_softmax"}, {rnd({2, 3, 2}, 104, -2, 2)},
     [](In x) { return ops::log_softmax(x[0], 1); }},
});

// ---- convolution ---------------------------------------------------------------------------

KILN_GRAD_CASES({
    {"conv2d/nhwc_valid_bias", {"conv2d"}, {rnd({1, 4, 4, 2}, 111), rnd({2, 2, 2, 3}, 112), rnd({3}, 113)},
     [](In x) { return ops::conv2d(x[0], x[1], {}, x[2]); }},
    {"conv2d/nhwc_same_stride2", {"conv2d"}, {rnd({2, 5, 5, 2}, 114), rnd({3, 3, 2, 2}, 115)},
     [](In x) { return ops::conv2d(x[0], x[1], conv_opts({2, 2}, "same")); }},
    {"conv2d/nhwc_depthwise_same", {"conv2d"}, {rnd({1, 4, 4, 3}, 116), rnd({3, 3, 1, 6}, 117), rnd({6}, 118)},
     [](In x) { return ops::conv2d(x[0], x[1], conv_opts({1, 1}, "same", {1, 1}, 3), x[2]); }},
    {"conv2d/nchw_groups_dilation_explicit", {"conv2d"}, {rnd({1, 4, 5, 5}, 119), rnd({4, 2, 2, 2}, 120)},
     [](In x) { return ops::conv2d(x[0], x[1], conv_opts({1, 2}, {1, 0, 0, 1}, {2, 1}, 2, "NCHW")); }},
    {"conv2d/nchw_same_bias", {"conv2d"}, {rnd({2, 2, 4, 3}, 121), rnd({3, 2, 3, 2}, 122), rnd({3}, 123)},
     [](In x) { return ops::conv2d(x[0], x[1], conv_opts({2, 1}, "same", {1, 1}, 1, "NCHW"), x[2]); }},
    // The backward ops are bilinear; their vjps are conv2d and each other.
    {"conv2d_backward_data/nhwc_same_stride2",
     {"conv2d_backward_data"},
     {rnd({2, 3, 3, 2}, 124), rnd({3, 3, 3, 2}, 125)},
     [](In x) { return ops::conv2d_backward_data(x[0], x[1], Shape{2, 5, 5, 3}, conv_opts({2, 2}, "same")); }},
    {"conv2d_backward_data/nchw_groups",
     {"conv2d_backward_data"},
     {rnd({1, 4, 3, 3}, 126), rnd({4, 1, 2, 2}, 127)},
     [](In x) {
       return ops::conv2d_backward_data(x[0], x[1], Shape{1, 2, 4, 4}, conv_opts({1, 1}, "valid", {1, 1}, 2, "NCHW"));
     }},
    {"conv2d_backward_filter/nhwc_same_stride2",
     {"conv2d_backward_filter"},
     {rnd({2, 5, 5, 3}, 128), rnd({2, 3, 3, 2}, 129)},
     [](In x) { return ops::conv2d_backward_filter(x[0], x[1], Shape{3, 3, 3, 2}, conv_opts({2, 2}, "same")); }},
    {"conv2d_backward_filter/nchw_dilation_groups",
     {"conv2d_backward_filter"},
     {rnd({1, 4, 5, 5}, 130), rnd({1, 2, 3, 3}, 131)},
     [](In x) {
       return ops::conv2d_backward_filter(x[0], x[1], Shape{2, 2, 2, 2}, conv_opts({1, 1}, "valid", {2, 2}, 2, "NCHW"));
     }},
});

// ---- pooling -------------------------------------------------------------------------------

// Random inputs have distinct values far apart relative to eps, so max pooling is
// differentiable at them.
KILN_GRAD_CASES({
    {"max_pool2d/nhwc_valid_2x2", {"max_pool2d"}, {rnd({2, 4, 4, 2}, 141)},
     [](In x) { return ops::max_pool2d(x[0], {2, 2}, {2, 2}); }},
    {"max_pool2d/nhwc_same_3x3_s2", {"max_pool2d"}, {rnd({1, 5, 6, 2}, 142)},
     [](In x) { return ops::max_pool2d(x[0], {3, 3}, {2, 2}, "same"); }},
    {"max_pool2d/nchw_explicit_s1", {"max_pool2d"}, {rnd({1, 2, 4, 5}, 143)},
     [](In x) { return ops::max_pool2d(x[0], {2, 3}, {1, 2}, Padding{1, 0, 1, 1}, "NCHW"); }},
    {"avg_pool2d/nhwc_same_3x3_s2", {"avg_pool2d"}, {rnd({1, 5, 6, 2}, 144)},
     [](In x) { return ops::avg_pool2d(x[0], {3, 3}, {2, 2}, "same"); }},
    {"avg_pool2d/nchw_valid_s1", {"avg_pool2d"}, {rnd({2, 2, 4, 4}, 145)},
     [](In x) { return ops::avg_pool2d(x[0], {2, 2}, {1, 1}, "valid", "NCHW"); }},
    {"avg_pool2d_backward/nhwc_same",
     {"avg_pool2d_backward"},
     {rnd({1, 3, 3, 2}, 146)},
     [](In x) { return ops::avg_pool2d_backward(x[0], Shape{1, 5, 6, 2}, {3, 3}, {2, 2}, "same"); }},
    {"avg_pool2d_backward/nchw_explicit",
     {"avg_pool2d_backward"},
     {rnd({1, 2, 4, 2}, 147)},
     [](In x) {
       return ops::avg_pool2d_backward(x[0], Shape{1, 2, 4, 4}, {2, 2}, {1, 2}, Padding{1, 0, 0, 1}, "NCHW");
     }},
    {"global_avg_pool2d/nhwc", {"global_avg_pool2d"}, {rnd({2, 3, 2, 3}, 148)},
     [](In x) { return ops::global_avg_pool2d(x[0]); }},
    {"global_avg_pool2d/nchw_keepdims", {"global_avg_pool2d"}, {rnd({2, 3, 2, 2}, 149)},
     [](In x) { return ops::global_avg_pool2d(x[0], "NCHW", true); }},
    {"global_max_pool2d/nhwc", {"global_max_pool2d"}, {rnd({2, 3, 2, 3}, 150)},
     [](In x) { return ops::global_max_pool2d(x[0]); }},
    {"global_max_pool2d/nchw_keepdims", {"global_max_pool2d"}, {rnd({2, 3, 2, 2}, 151)},
     [](In x) { return ops::global_max_pool2d(x[0], "NCHW", true); }},
});

// ---- normalisation -------------------------------------------------------------------------

KILN_GRAD_CASES({
    {"batch_norm_training/nhwc_y", {"batch_norm_training"},
     {rnd({2, 3, 3, 2}, 161), rnd({2}, 162, 0.5, 1.5), rnd({2}, 163)},
     [](In x) { return ops::batch_norm_training(x[0], x[1], x[2], 1e-3).y; }},
    // Cotangents on all three outputs (mean and var broadcast along the last axis).
    {"batch_norm_training/nhwc_y_mean_var", {"batch_norm_training"},
     {rnd({2, 2, 3, 3}, 164), rnd({3}, 165, 0.5, 1.5), rnd({3}, 166)},
     [](In x) {
       auto r = ops::batch_norm_training(x[0], x[1], x[2], 1e-3);
       return ops::add(ops::add(r.y, ops::mul(r.mean, ops::scalar(2.0, DType::kF64))),
                       ops::mul(r.var, ops::scalar(3.0, DType::kF64)));
     }},
    {"batch_norm_training/nchw_var_only", {"batch_norm_training"}, {rnd({3, 2, 2, 2}, 167)},
     [](In x) { return ops::batch_norm_training(x[0], Tensor(), Tensor(), 1e-5, 1).var; }},
    {"batch_norm_training/nchw", {"batch_norm_training"},
     {rnd({2, 3, 2, 2}, 168), rnd({3}, 169, 0.5, 1.5), rnd({3}, 170)},
     [](In x) { return ops::batch_norm_training(x[0], x[1], x[2], 1e-5, 1).y; }},
    {"batch_norm_inference/nhwc", {"batch_norm_inference"},
     {rnd({2, 2, 2, 3}, 171), rnd({3}, 172), rnd({3}, 173, 0.5, 1.5), rnd({3}, 174), rnd({3}, 175)},
     [](In x) { return ops::batch_norm_inference(x[0], x[1], x[2], x[3], x[4], 1e-3); }},
    {"batch_norm_inference/nchw", {"batch_norm_inference"},
     {rnd({2, 3, 2, 2}, 176), rnd({3}, 177), rnd({3}, 178, 0.5, 1.5), rnd({3}, 179), rnd({3}, 180)},
     [](In x) { return ops::batch_norm_inference(x[0], x[1], x[2], x[3], x[4], 1e-3, 1); }},
    {"layer_norm/last", {"layer_norm"}, {rnd({3, 5}, 181), rnd({5}, 182, 0.5, 1.5), rnd({5}, 183)},
     [](In x) { return ops::layer_norm(x[0], x[1], x[2], 1e-3); }},
    {"layer_norm/trailing2", {"layer_norm"}, {rnd({2, 3, 4}, 184), rnd({3, 4}, 185, 0.5, 1.5), rnd({3, 4}, 186)},
     [](In x) { return ops::layer_norm(x[0], x[1], x[2], 1e-5, 1); }},
    {"layer_norm/all_axes", {"layer_norm"}, {rnd({2, 3}, 187), rnd({2, 3}, 188, 0.5, 1.5), rnd({2, 3}, 189)},
     [](In x) { return ops::layer_norm(x[0], x[1], x[2], 1e-5, 0); }},
    {"rms_norm/2d", {"rms_norm"}, {rnd({3, 5}, 190), rnd({5}, 191, 0.5, 1.5)},
     [](In x) { return ops::rms_norm(x[0], x[1], 1e-3); }},
    {"rms_norm/1d_no_gamma", {"rms_norm"}, {rnd({6}, 192)}, [](In x) { return ops::rms_norm(x[0], Tensor()); }},
});

// ---- dropout, embedding --------------------------------------------------------------------

Tensor ids_with_duplicates() { return make<int64_t>({0, 3, 3, 1, 0, 3}, {2, 3}); }

KILN_GRAD_CASES({
    {"dropout/rate0.3", {"dropout"}, {rnd({4, 5}, 201)}, [](In x) { return ops::dropout(x[0], 0.3, 77); }},
    {"embedding/duplicate_ids", {"embedding"}, {rnd({5, 3}, 202), ids_with_duplicates()},
     [](In x) { return ops::embedding(x[0], x[1]); }},
});

// ---- attention -----------------------------------------------------------------------------

Tensor bool_mask() {  // [3, 5]: every row keeps at least one key
  return make<bool>({true, false, true, true, false, false, true, true, false, true, true, true, false, false, false},
                    {3, 5});
}
Tensor float_mask_with_empty_row() {  // [3, 4]; row 1 is entirely -inf
  return make<double>({0.1, -0.3, 0.2, -kInf, -kInf, -kInf, -kInf, -kInf, 0.5, -kInf, 0.0, 0.25}, {3, 4});
}

KILN_GRAD_CASES({
    {"attention/plain", {"scaled_dot_product_attention"},
     {rnd({2, 3, 4}, 211), rnd({2, 5, 4}, 212), rnd({2, 5, 3}, 213)},
     [](In x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2]); }},
    {"attention/causal_scale", {"scaled_dot_product_attention"},
     {rnd({1, 4, 3}, 214), rnd({1, 4, 3}, 215), rnd({1, 4, 2}, 216)},
     [](In x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), true, 0.7); }},
    {"attention/causal_lq_gt_lk", {"scaled_dot_product_attention"},
     {rnd({5, 3}, 217), rnd({3, 3}, 218), rnd({3, 2}, 219)},
     [](In x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), true); }},
    {"attention/bool_mask_and_causal", {"scaled_dot_product_attention"},
     {rnd({2, 3, 2}, 220), rnd({2, 5, 2}, 221), rnd({2, 5, 3}, 222), bool_mask()},
     [](In x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], x[3], true); }},
    {"attention/float_mask", {"scaled_dot_product_attention"},
     {rnd({2, 3, 2}, 223), rnd({2, 4, 2}, 224), rnd({2, 4, 2}, 225), rnd({3, 4}, 226)},
     [](In x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); }},
    // A row with every key masked out is zero; -inf entries get no gradient.
    {"attention/float_mask_empty_row", {"scaled_dot_product_attention"},
     {rnd({3, 2}, 227), rnd({4, 2}, 228), rnd({4, 3}, 229), float_mask_with_empty_row()},
     [](In x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); }, {0, 1, 2}},
    // Multi-query: k and v have a head dim of 1 that broadcasts against q's 2 heads.
    {"attention/broadcast_heads", {"scaled_dot_product_attention"},
     {rnd({2, 2, 3, 4}, 230), rnd({2, 1, 4, 4}, 231), rnd({2, 1, 4, 3}, 232), rnd({1, 4}, 233)},
     [](In x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); }},
});

// ---- second derivatives through the conv backward ops ----------------------------------------

// d/dx of sum(conv2d(x, w)^2) is 2 * conv2d_backward_data(conv2d(x, w), w); its
// gradient (taken by the outer tape of the check) runs through the vjps of
// conv2d_backward_data and conv2d.
KILN_GRAD_CASES({
    {"conv2d/second_derivative",
     {"conv2d_backward_data"},
     {rnd({1, 4, 4, 2}, 241), rnd({3, 3, 2, 2}, 242)},
     [](In x) {
       GradientTape t;
       t.watch(x[0]);
       t.watch(x[1]);
       Tensor y = ops::conv2d(x[0], x[1], conv_opts({2, 2}, "same"));
       return t.gradient(ops::sum(ops::square(y)), {x[0]})[0];
     }},
    {"softmax/second_derivative",
     {"softmax"},
     {rnd({2, 4}, 243, -2, 2)},
     [](In x) {
       GradientTape t;
       t.watch(x[0]);
       Tensor y = ops::softmax(x[0]);
       return t.gradient(ops::sum(ops::square(y)), {x[0]})[0];
     }},
});

// ---- direct checks -----------------------------------------------------------------------------

// Calls an op's vjp directly with only input `i` needing a gradient: that one must
// come back with the input's shape and dtype, every other one undefined.
void expect_needs_respected(const std::string& op, const std::vector<Tensor>& in, const Attrs& attrs) {
  SCOPED_TRACE(op);
  const OpDef& d = OpRegistry::global().get(op);
  ASSERT_NE(d.vjp, nullptr);
  std::vector<Tensor> out = call_op(d, in, attrs);
  std::vector<Tensor> cot;
  for (const Tensor& o : out) cot.push_back(rand_tensor(o.shape(), o.dtype(), -1, 1, 5));
  for (size_t i = 0; i < in.size(); ++i) {
    if (!is_differentiable_dtype(in[i].dtype())) continue;
    SCOPED_TRACE("input " + std::to_string(i));
    std::vector<uint8_t> needs(in.size(), 0);
    needs[i] = 1;
    VjpContext ctx{in, out, cot, attrs, needs};
    std::vector<Tensor> g = d.vjp(ctx);
    ASSERT_EQ(g.size(), in.size());
    for (size_t j = 0; j < in.size(); ++j) {
      if (j != i) {
        EXPECT_FALSE(g[j].defined()) << "input " << j << " got a gradient it did not need";
        continue;
      }
      ASSERT_TRUE(g[j].defined());
      EXPECT_EQ(g[j].shape(), in[j].shape());
      EXPECT_EQ(g[j].dtype(), in[j].dtype());
    }
  }
}

TEST(NnGrad, VjpsComputeOnlyWhatIsNeeded) {
  using V = std::vector<int64_t>;
  const DType f = DType::kF32;
  Attrs conv{{"strides", V{2, 2}}, {"padding", std::string("same")}, {"data_format", std::string("NHWC")}};
  Tensor x = rand_tensor({2, 5, 5, 3}, f, -1, 1, 1), w = rand_tensor({3, 3, 3, 4}, f, -1, 1, 2);
  Tensor dy = rand_tensor({2, 3, 3, 4}, f, -1, 1, 3), c4 = rand_tensor({4}, f, -1, 1, 4);
  expect_needs_respected("conv2d", {x, w, c4}, conv);
  Attrs bd = conv;
  bd.set("input_shape", V{2, 5, 5, 3});
  expect_needs_respected("conv2d_backward_data", {dy, w}, bd);
  Attrs bf = conv;
  bf.set("filter_shape", V{3, 3, 3, 4});
  expect_needs_respected("conv2d_backward_filter", {x, dy}, bf);
  Tensor h = rand_tensor({2, 3, 3, 4}, f, -1, 1, 6), pos = rand_tensor({4}, f, 0.5, 1.5, 7);
  expect_needs_respected("batch_norm_training", {h, pos, c4}, {{"eps", 1e-5}, {"axis", int64_t{-1}}});
  expect_needs_respected("batch_norm_inference", {h, c4, pos, pos, c4}, {{"eps", 1e-5}, {"axis", int64_t{-1}}});
  expect_needs_respected("layer_norm", {h, pos, c4}, {{"eps", 1e-5}, {"begin_axis", int64_t{-1}}});
  expect_needs_respected("rms_norm", {h, pos}, {{"eps", 1e-5}});
  Tensor q = rand_tensor({2, 3, 4}, f, -1, 1, 8), k = rand_tensor({2, 5, 4}, f, -1, 1, 9);
  Tensor v = rand_tensor({2, 5, 2}, f, -1, 1, 10), m = rand_tensor({3, 5}, f, -1, 1, 11);
  expect_needs_respected("scaled_dot_product_attention", {q, k, v, m}, {{"causal", true}});
  expect_needs_respected("embedding", {rand_tensor({6, 3}, f, -1, 1, 12), make<int64_t>({1, 5, 1}, {3})}, {});

  // 16-bit inputs with f32 parameters (allowed by the ops): gradients still come
  // back in each input's own dtype.
  Tensor h16 = h.to(DType::kF16), hb = h.to(DType::kBF16);
  expect_needs_respected("batch_norm_training", {h16, pos, c4}, {{"eps", 1e-5}, {"axis", int64_t{-1}}});
  expect_needs_respected("batch_norm_inference", {hb, c4, pos, pos, c4}, {{"eps", 1e-5}, {"axis", int64_t{-1}}});
  expect_needs_respected("layer_norm", {hb, pos, c4}, {{"eps", 1e-5}, {"begin_axis", int64_t{-1}}});
  expect_needs_respected("rms_norm", {h16, pos}, {{"eps", 1e-5}});
  expect_needs_respected("scaled_dot_product_attention",
                         {q.to(DType::kF16), k.to(DType::kF16), v.to(DType::kF16), m}, {{"causal", false}});
  expect_needs_respected("conv2d", {x.to(DType::kBF16), w.to(DType::kBF16), c4.to(DType::kBF16)}, conv);
}

TEST(NnGrad, ConvGradientsKeepF32AndShape) {
  Tensor x = rand_tensor({2, 6, 6, 4}, DType::kF32, -1, 1, 304), w = rand_tensor({3, 3, 4, 8}, DType::kF32, -1, 1, 305);
  Tensor b = rand_tensor({8}, DType::kF32, -1, 1, 306);
  GradientTape tape;
  tape.watch(x);
  tape.watch(w);
  tape.watch(b);
  Tensor y = ops::conv2d(x, w, conv_opts({1, 1}, "same"), b);
  Tensor dy = rand_tensor(y.shape(), DType::kF32, -1, 1, 307);
  auto g = tape.gradient(y, {x, w, b}, dy);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g[i].dtype(), DType::kF32);
  // Against the same computation in f64.
  GradientTape t2;
  Tensor x64 = x.to(DType::kF64), w64 = w.to(DType::kF64), b64 = b.to(DType::kF64);
  t2.watch(x64);
  t2.watch(w64);
  t2.watch(b64);
  Tensor y64 = ops::conv2d(x64, w64, conv_opts({1, 1}, "same"), b64);
  auto g64 = t2.gradient(y64, {x64, w64, b64}, dy.to(DType::kF64));
  for (int i = 0; i < 3; ++i) EXPECT_CLOSE(g[i].to(DType::kF64), g64[i], 1e-4, 1e-4);
  // The bias gradient is dy summed over N, H, W (by hand).
  std::vector<float> d = dy.to_vector<float>();
  std::vector<double> db(8, 0.0);
  for (size_t i = 0; i < d.size(); ++i) db[i % 8] += d[i];
  EXPECT_CLOSE(g[2].to(DType::kF64), make<double>(db, {8}), 1e-5, 1e-5);
}

TEST(NnGrad, DropoutGradientIsTheForwardMaskAndScale) {
  // dx = dy / (1 - rate) where the forward kept x, 0 where it dropped it (x never 0).
  Tensor x = rnd_away({50, 40}, 308, 0.5, 1.0);
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::dropout(x, 0.25, 1234);
  Tensor dy = rnd({50, 40}, 309);
  Tensor dx = tape.gradient(y, {x}, dy)[0];
  std::vector<double> yv = y.to_vector<double>(), dyv = dy.to_vector<double>(), dxv = dx.to_vector<double>();
  int dropped = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    const double want = yv[i] == 0 ? 0.0 : dyv[i] / 0.75;
    dropped += yv[i] == 0;
    ASSERT_NEAR(dxv[i], want, 1e-12) << "element " << i;
  }
  EXPECT_GT(dropped, 300);  // ~500 expected
  EXPECT_LT(dropped, 700);
}

TEST(NnGrad, EmbeddingGradientAccumulatesDuplicateIds) {
  Tensor table = rnd({4, 2}, 310);
  Tensor ids = make<int32_t>({2, 0, 2, 2}, {4});
  GradientTape tape;
  tape.watch(table);
  Tensor y = ops::embedding(table, ids);
  Tensor dy = make<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  auto g = tape.gradient(y, {table, ids}, dy);
  EXPECT_CLOSE(g[0], make<double>({3, 4, 0, 0, 1 + 5 + 7, 2 + 6 + 8, 0, 0}, {4, 2}), 0, 0);
  EXPECT_FALSE(g[1].defined());  // integer ids get none
}

TEST(NnGrad, AttentionFullyMaskedRowGetsNoGradient) {
  // Query 1 may attend to nothing: its output row is 0, so it gets a zero gradient
  // and contributes nothing to dk, dv. The same attention without that query row
  // must give the same dk, dv.
  Tensor q = rnd({3, 2}, 311), k = rnd({3, 2}, 312), v = rnd({3, 2}, 313), dy = rnd({3, 2}, 314);
  Tensor mask = make<bool>({true, true, false, false, false, false, true, false, true}, {3, 3});
  GradientTape tape;
  tape.watch(q);
  tape.watch(k);
  tape.watch(v);
  Tensor out = ops::scaled_dot_product_attention(q, k, v, mask);
  auto g = tape.gradient(out, {q, k, v}, dy);
  std::vector<double> dq = g[0].to_vector<double>();
  EXPECT_EQ(dq[2], 0.0);
  EXPECT_EQ(dq[3], 0.0);
  for (const Tensor& t : g)
    for (double e : t.to_vector<double>()) ASSERT_TRUE(std::isfinite(e));

  auto rows02 = [](const Tensor& t, int64_t cols) {
    std::vector<double> a = t.to_vector<double>(), r;
    for (int64_t i : {0, 2})
      for (int64_t j = 0; j < cols; ++j) r.push_back(a[i * cols + j]);
    return Tensor::from_vector<double>(r, Shape{2, cols});
  };
  Tensor q2 = rows02(q, 2), dy2 = rows02(dy, 2), mask2 = make<bool>({true, true, false, true, false, true}, {2, 3});
  GradientTape t2;
  t2.watch(q2);
  t2.watch(k);
  t2.watch(v);
  auto h = t2.gradient(ops::scaled_dot_product_attention(q2, k, v, mask2), {q2, k, v}, dy2);
  EXPECT_CLOSE(rows02(g[0], 2), h[0], 1e-12, 1e-12);
  EXPECT_CLOSE(g[1], h[1], 1e-12, 1e-12);
  EXPECT_CLOSE(g[2], h[2], 1e-12, 1e-12);
}

}  // namespace
}  // namespace kiln::testing
