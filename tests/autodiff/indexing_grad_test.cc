// Finite-difference cases for the indexing vjps (gather with axis / batch_dims,
// gather_nd, scatter_add, top_k), second-order cases through the vjps, and direct
// checks: repeated indices accumulate, index inputs get no gradient, needs(), dtypes.
#include "gradcheck.h"
#include "kiln/autodiff/tape.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/shape.h"

namespace kiln::testing {
namespace {

// Second-order helper with this file's weight seed (see gradcheck.h).
Tensor indexing_inner_grad(const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  return inner_gradient(x, f, 98);
}

using In = const std::vector<Tensor>&;

Tensor i32(std::vector<int32_t> v, Shape s) { return Tensor::from_vector<int32_t>(v, s); }
Tensor i64(std::vector<int64_t> v, Shape s) { return Tensor::from_vector<int64_t>(v, s); }
KILN_GRAD_CASES({
    {"gather/axis0_repeats", {"gather"}, {rnd({4, 3}, 101), i32({0, 2, 0, 3, 2, 0}, {6})},
     [](In x) { return ops::gather(x[0], x[1]); }},
    {"gather/axis1_2d_indices", {"gather"}, {rnd({2, 5, 3}, 102), i64({4, 0, 4, 1, 1, 2}, {2, 3})},
     [](In x) { return ops::gather(x[0], x[1], 1); }},
    {"gather/negative_axis", {"gather"}, {rnd({3, 4}, 103), i32({3, 3, 0}, {3})},
     [](In x) { return ops::gather(x[0], x[1], -1); }},
    {"gather/scalar_index", {"gather"}, {rnd({3, 4}, 104), i32({2}, {})},
     [](In x) { return ops::gather(x[0], x[1], 0); }},
    {"gather/batch_dims1", {"gather"}, {rnd({2, 4, 3}, 105), i32({0, 3, 3, 1, 2, 2, 0, 0}, {2, 4})},
     [](In x) { return ops::gather(x[0], x[1], 1, 1); }},
    {"gather/batch_dims1_axis2", {"gather"}, {rnd({2, 3, 4}, 106), i32({3, 0, 3, 1, 1, 2}, {2, 3})},
     [](In x) { return ops::gather(x[0], x[1], 2, 1); }},
    {"gather/batch_dims_negative", {"gather"},
     {rnd({2, 3, 5}, 107), i64({4, 4, 0, 1, 2, 3, 0, 1, 2, 4, 4, 4}, {2, 3, 2})},
     [](In x) { return ops::gather(x[0], x[1], 2, -1); }},
    {"gather/second_order", {"gather"}, {rnd({4, 2}, 108)},
     [](In x) { return indexing_inner_grad(x[0], [](const Tensor& t) { return ops::gather(t, i32({1, 1, 3, 0}, {4})); }); }},
    {"gather/second_order_batch", {"gather"}, {rnd({2, 3}, 109)},
     [](In x) {
       return indexing_inner_grad(x[0], [](const Tensor& t) { return ops::gather(t, i32({2, 2, 0, 1}, {2, 2}), 1, 1); });
     }},

    {"gather_nd/elements_repeats", {"gather_nd"}, {rnd({3, 4}, 110), i32({0, 1, 2, 3, 0, 1, 1, 0}, {4, 2})},
     [](In x) { return ops::gather_nd(x[0], x[1]); }},
    {"gather_nd/slices", {"gather_nd"}, {rnd({3, 2, 4}, 111), i64({2, 0, 2, 1, 2}, {5, 1})},
     [](In x) { return ops::gather_nd(x[0], x[1]); }},
    {"gather_nd/batched_indices", {"gather_nd"}, {rnd({3, 4, 2}, 112), i32({0, 3, 2, 1, 2, 1, 0, 0}, {2, 2, 2})},
     [](In x) { return ops::gather_nd(x[0], x[1]); }},
    {"gather_nd/second_order", {"gather_nd"}, {rnd({2, 3}, 113)},
     [](In x) {
       return indexing_inner_grad(x[0], [](const Tensor& t) { return ops::gather_nd(t, i32({1, 2, 0, 0, 1, 2}, {3, 2})); });
     }},

    {"index_copy/rows", {"index_copy"}, {rnd({5, 3}, 130), i32({4, 0, 2}, {3}), rnd({3, 3}, 131)},
     [](In x) { return ops::index_copy(x[0], x[1], x[2]); }},
    // Nonlinear in both inputs, so the second-order check reaches index_copy's vjp.
    {"index_copy/nonlinear", {"index_copy"}, {rnd({4, 2}, 132), i64({3, 1}, {2}), rnd({2, 2}, 133)},
     [](In x) { return ops::square(ops::index_copy(ops::square(x[0]), x[1], ops::mul(x[2], x[2]))); }},
    {"scatter_add/axis0_repeats", {"scatter_add"}, {rnd({4, 2}, 114), i32({1, 3, 1}, {3}), rnd({3, 2}, 115)},
     [](In x) { return ops::scatter_add(x[0], x[1], x[2]); }},
    {"scatter_add/axis1", {"scatter_add"}, {rnd({2, 3, 2}, 116), i64({2, 0, 2, 2}, {2, 2}), rnd({2, 2, 2, 2}, 117)},
     [](In x) { return ops::scatter_add(x[0], x[1], x[2], 1); }},
    // Nonlinear in both inputs, so the second-order check reaches scatter_add's vjp.
    {"scatter_add/nonlinear", {"scatter_add"}, {rnd({3}, 118), i32({0, 2, 0, 0}, {4}), rnd({4}, 119)},
     [](In x) { return ops::square(ops::scatter_add(ops::square(x[0]), x[1], ops::mul(x[2], x[2]))); }},
    {"scatter_add/second_order", {"scatter_add"}, {rnd({4}, 120)},
     [](In x) {
       return indexing_inner_grad(x[0], [](const Tensor& t) {
         return ops::scatter_add(ops::zeros({3}, DType::kF64), i32({2, 0, 2, 1}, {4}), t);
       });
     }},

    // Values are distinct random numbers, so the selection is stable under eps.
    {"top_k/sorted", {"top_k"}, {rnd({2, 6}, 121)}, [](In x) { return ops::top_k(x[0], 3).values; }},
    {"top_k/unsorted_rank3", {"top_k"}, {rnd({2, 2, 5}, 122)},
     [](In x) { return ops::top_k(x[0], 2, /*sorted=*/false).values; }},
    {"top_k/all", {"top_k"}, {rnd({4}, 123)}, [](In x) { return ops::top_k(x[0], 4).values; }},
    {"top_k/second_order", {"top_k"}, {rnd({3, 4}, 124)},
     [](In x) { return indexing_inner_grad(x[0], [](const Tensor& t) { return ops::top_k(t, 2).values; }); }},
});

TEST(IndexingGrad, RepeatedGatherIndicesAccumulate) {
  Tensor x = f64({1, 2, 3}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::gather(x, i32({0, 0, 2, 0}, {4}));
  Tensor g = tape.gradient(y, {x}, f64({1, 10, 100, 1000}, {4}))[0];
  EXPECT_CLOSE(g, f64({1011, 0, 100}, {3}), 0, 0);
}

TEST(IndexingGrad, RepeatedGatherNdIndicesAccumulate) {
  Tensor x = f64({1, 2, 3, 4}, {2, 2});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::gather_nd(x, i64({1, 0, 1, 0, 0, 1}, {3, 2}));
  Tensor g = tape.gradient(y, {x}, f64({1, 10, 100}, {3}))[0];
  EXPECT_CLOSE(g, f64({0, 100, 11, 0}, {2, 2}), 0, 0);
}

TEST(IndexingGrad, BatchedGatherRepeatsAccumulatePerBatch) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::gather(x, i32({1, 1, 2, 2}, {2, 2}), 1, 1);  // [[x01, x01], [x12, x12]]
  Tensor g = tape.gradient(y, {x}, f64({1, 10, 100, 1000}, {2, 2}))[0];
  EXPECT_CLOSE(g, f64({0, 11, 0, 0, 0, 1100}, {2, 3}), 0, 0);
}

TEST(IndexingGrad, TopKSendsGradientToSelectedPositions) {
  Tensor x = f64({0.5, 3, -1, 2}, {4});
  GradientTape tape;
  tape.watch(x);
  ops::TopK t = ops::top_k(x, 2);  // values 3, 2 at 1, 3
  Tensor g = tape.gradient(t.values, {x}, f64({10, 100}, {2}))[0];
  EXPECT_CLOSE(g, f64({0, 10, 0, 100}, {4}), 0, 0);
}

TEST(IndexingGrad, IndexInputsGetNoGradient) {
  const OpDef& d = OpRegistry::global().get("gather");
  std::vector<Tensor> in = {rand_tensor({3, 2}, DType::kF32), i32({2, 0}, {2})};
  Attrs attrs{{"axis", int64_t{0}}, {"batch_dims", int64_t{0}}};
  std::vector<Tensor> out = {ops::gather(in[0], in[1])};
  std::vector<Tensor> cot = {make<float>({1, 2, 3, 4}, {2, 2})};
  std::vector<uint8_t> all = {1, 0}, none = {0, 0};
  std::vector<Tensor> g = d.vjp(VjpContext{in, out, cot, attrs, all});
  ASSERT_EQ(g.size(), 2u);
  ASSERT_TRUE(g[0].defined());
  EXPECT_FALSE(g[1].defined());
  EXPECT_EQ(g[0].dtype(), DType::kF32);
  EXPECT_CLOSE(g[0], make<float>({3, 4, 0, 0, 1, 2}, {3, 2}), 0, 0);
  g = d.vjp(VjpContext{in, out, cot, attrs, none});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_FALSE(g[0].defined());
  EXPECT_FALSE(g[1].defined());
}

TEST(IndexingGrad, ScatterAddHonoursNeeds) {
  const OpDef& d = OpRegistry::global().get("scatter_add");
  std::vector<Tensor> in = {rand_tensor({3}, DType::kF32), i32({2, 2}, {2}), rand_tensor({2}, DType::kF32)};
  Attrs attrs{{"axis", int64_t{0}}};
  std::vector<Tensor> out = {ops::scatter_add(in[0], in[1], in[2])};
  std::vector<Tensor> cot = {make<float>({1, 2, 3}, {3})};
  std::vector<uint8_t> needs = {0, 0, 1};
  std::vector<Tensor> g = d.vjp(VjpContext{in, out, cot, attrs, needs});
  ASSERT_EQ(g.size(), 3u);
  EXPECT_FALSE(g[0].defined());
  EXPECT_FALSE(g[1].defined());
  ASSERT_TRUE(g[2].defined());
  EXPECT_CLOSE(g[2], make<float>({3, 3}, {2}), 0, 0);
}

// Half-precision gradients come back in the input's dtype and shape.
TEST(IndexingGrad, TopKVjpKeepsHalfDtype) {
  const OpDef& d = OpRegistry::global().get("top_k");
  Tensor x = make<float>({1, 4, 2, 3}, {2, 2}).to(DType::kBF16);
  ops::TopK t = ops::top_k(x, 1);
  std::vector<Tensor> in = {x}, out = {t.values, t.indices};
  std::vector<Tensor> cot = {make<float>({5, 7}, {2, 1}).to(DType::kBF16), ops::zeros_like(t.indices)};
  Attrs attrs{{"k", int64_t{1}}, {"sorted", true}};
  std::vector<Tensor> g = d.vjp(VjpContext{in, out, cot, attrs, {}});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].dtype(), DType::kBF16);
  EXPECT_CLOSE(g[0].to(DType::kF32), make<float>({0, 5, 0, 7}, {2, 2}), 0, 0);
}

TEST(IndexingGrad, OneHotStopsGradients) {
  EXPECT_EQ(OpRegistry::global().get("one_hot").differentiable, Differentiable::kNo);
  EXPECT_EQ(OpRegistry::global().get("one_hot").vjp, nullptr);
}

}  // namespace
}  // namespace kiln::testing
