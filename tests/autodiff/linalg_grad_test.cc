// Finite-difference cases for the matmul vjp (transpose flags, batch broadcasting on
// either side, 1-D operands, einsum's lowering, second order), needs()/op-count
// checks, and f32 tape gradients against f64 ones for a few ops.
#include <functional>
#include <map>

#include "gradcheck.h"
#include "kiln/autodiff/tape.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"

namespace kiln::testing {
namespace {

using In = const std::vector<Tensor>&;

Tensor mm(In x, bool ta = false, bool tb = false) { return ops::matmul(x[0], x[1], ta, tb); }

KILN_GRAD_CASES({
    {"matmul/2d", {"matmul"}, {rnd({3, 4}, 1), rnd({4, 5}, 2)}, [](In x) { return mm(x); }},
    {"matmul/2d_ta", {"matmul"}, {rnd({4, 3}, 3), rnd({4, 5}, 4)}, [](In x) { return mm(x, true, false); }},
    {"matmul/2d_tb", {"matmul"}, {rnd({3, 4}, 5), rnd({5, 4}, 6)}, [](In x) { return mm(x, false, true); }},
    {"matmul/2d_ta_tb", {"matmul"}, {rnd({4, 3}, 7), rnd({5, 4}, 8)}, [](In x) { return mm(x, true, true); }},
    {"matmul/3d_batched", {"matmul"}, {rnd({2, 3, 4}, 9), rnd({2, 4, 5}, 10)}, [](In x) { return mm(x); }},
    {"matmul/3d_ta_tb", {"matmul"}, {rnd({2, 4, 3}, 11), rnd({2, 5, 4}, 12)}, [](In x) { return mm(x, true, true); }},
    // Shared weight (the folded path for b's gradient), with and without transposes.
    {"matmul/3d_times_2d", {"matmul"}, {rnd({2, 3, 4}, 13), rnd({4, 5}, 14)}, [](In x) { return mm(x); }},
    {"matmul/3d_times_2d_tb", {"matmul"}, {rnd({2, 3, 4}, 15), rnd({5, 4}, 16)},
     [](In x) { return mm(x, false, true); }},
    {"matmul/3d_times_2d_ta", {"matmul"}, {rnd({2, 4, 3}, 17), rnd({4, 5}, 18)},
     [](In x) { return mm(x, true, false); }},
    {"matmul/4d_times_size1_batch", {"matmul"}, {rnd({2, 2, 3, 4}, 19), rnd({1, 4, 2}, 20)},
     [](In x) { return mm(x); }},
    {"matmul/2d_times_3d", {"matmul"}, {rnd({3, 4}, 21), rnd({2, 4, 5}, 22)}, [](In x) { return mm(x); }},
    {"matmul/2d_times_3d_ta_tb", {"matmul"}, {rnd({4, 3}, 23), rnd({2, 5, 4}, 24)},
     [](In x) { return mm(x, true, true); }},
    {"matmul/batch_broadcast_both", {"matmul"}, {rnd({2, 1, 3, 4}, 25), rnd({1, 3, 4, 2}, 26)},
     [](In x) { return mm(x); }},
    {"matmul/1d_vector_matrix", {"matmul"}, {rnd({4}, 27), rnd({4, 3}, 28)}, [](In x) { return mm(x); }},
    {"matmul/1d_matrix_vector", {"matmul"}, {rnd({3, 4}, 29), rnd({4}, 30)}, [](In x) { return mm(x); }},
    {"matmul/1d_dot", {"matmul"}, {rnd({4}, 31), rnd({4}, 32)}, [](In x) { return mm(x); }},
    {"matmul/1d_batched_matrix", {"matmul"}, {rnd({2, 3, 4}, 33), rnd({4}, 34)}, [](In x) { return mm(x); }},
    {"einsum/attention_scores", {"matmul"}, {rnd({2, 3, 4}, 35), rnd({2, 5, 4}, 36)},
     [](In x) { return ops::einsum("bqd,bkd->bqk", {x[0], x[1]}); }},
    {"einsum/contract_and_sum", {"matmul"}, {rnd({2, 3, 4}, 37), rnd({4, 3}, 38)},
     [](In x) { return ops::einsum("bij,jk->ik", {x[0], x[1]}); }},
    // d/dA sum((AB)^2 w): nonlinear in A and B through the vjp.
    {"matmul/second_order", {"matmul"}, {rnd({2, 3, 4}, 39), rnd({4, 2}, 40)},
     [](In x) {
       GradientTape tape;
       tape.watch(x[0]);
       tape.watch(x[1]);
       Tensor y = ops::matmul(x[0], x[1]);
       auto g = tape.gradient(ops::sum(ops::mul(ops::square(y), rnd(y.shape(), 41))), {x[0], x[1]});
       return ops::add(ops::sum(g[0]), ops::sum(ops::mul(g[1], g[1])));
     }},
});

std::vector<Tensor> matmul_vjp(const Tensor& a, const Tensor& b, bool ta, bool tb, std::vector<uint8_t> needs,
                               OpCounter& counter) {
  const OpDef& d = OpRegistry::global().get("matmul");
  Attrs attrs{{"transpose_a", ta}, {"transpose_b", tb}};
  std::vector<Tensor> in{a, b};
  std::vector<Tensor> out = call_op(d, in, attrs);
  std::vector<Tensor> cot{rnd(out[0].shape(), 50)};
  counter.counts.clear();
  return d.vjp(VjpContext{in, out, cot, attrs, needs});
}

TEST(VjpMatmul, OneMatmulPerNeededInput) {
  Tensor a = rnd({3, 4}, 51), b = rnd({4, 5}, 52);
  OpCounter c;
  auto only_a = matmul_vjp(a, b, false, false, {1, 0}, c);
  EXPECT_EQ(c.counts["matmul"], 1);
  ASSERT_TRUE(only_a[0].defined());
  EXPECT_EQ(only_a[0].shape(), a.shape());
  EXPECT_FALSE(only_a[1].defined());
  auto only_b = matmul_vjp(a, b, false, false, {0, 1}, c);
  EXPECT_EQ(c.counts["matmul"], 1);
  EXPECT_FALSE(only_b[0].defined());
  EXPECT_EQ(only_b[1].shape(), b.shape());
  auto both = matmul_vjp(a, b, false, false, {}, c);
  EXPECT_EQ(c.counts["matmul"], 2);
  EXPECT_EQ(c.counts["transpose"], 0) << "transposes must be matmul flags, not copies";
}

TEST(VjpMatmul, SharedWeightGradientIsOneMatmulWithoutBatchSum) {
  Tensor x = rnd({4, 3, 6}, 53), w = rnd({6, 5}, 54);
  for (bool tb : {false, true}) {
    SCOPED_TRACE(tb);
    OpCounter c;
    auto g = matmul_vjp(x, tb ? ops::transpose(w) : w, false, tb, {0, 1}, c);
    EXPECT_EQ(c.counts["matmul"], 1);
    EXPECT_EQ(c.counts["sum"], 0);
    EXPECT_EQ(g[1].shape(), tb ? Shape({5, 6}) : Shape({6, 5}));
  }
}

// ---- f32 tape gradients agree with f64 ---------------------------------------------

std::vector<Tensor> grads_in(DType dt, const std::vector<Tensor>& xs64, const std::function<Tensor(In)>& f) {
  std::vector<Tensor> xs;
  for (const Tensor& x : xs64) xs.push_back(x.to(dt));
  GradientTape tape;
  for (const Tensor& x : xs) tape.watch(x);
  Tensor y = f(xs);
  EXPECT_EQ(y.dtype(), dt);
  return tape.gradient(y, xs);
}

TEST(VjpF32, GradientsMatchF64) {
  struct Case {
    const char* name;
    std::vector<Tensor> in;
    std::function<Tensor(In)> f;
  };
  std::vector<Case> cases = {
      {"mlp", {rnd({8, 6}, 60), rnd({6, 4}, 61), rnd({4}, 62)},
       [](In x) { return ops::mean(ops::gelu(ops::add(ops::matmul(x[0], x[1]), x[2]), true)); }},
      {"batched_matmul_logsumexp", {rnd({2, 5, 3}, 63), rnd({3, 4}, 64)},
       [](In x) { return ops::sum(ops::logsumexp(ops::matmul(x[0], x[1]), {-1})); }},
      {"var_softplus_pow", {rnd({4, 5}, 65, 0.5, 2), rnd({5}, 66)},
       [](In x) { return ops::sum(ops::mul(ops::var(ops::softplus(x[1]), {}), ops::pow(x[0], x[1]))); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto g64 = grads_in(DType::kF64, c.in, c.f);
    auto g32 = grads_in(DType::kF32, c.in, c.f);
    ASSERT_EQ(g32.size(), g64.size());
    for (size_t i = 0; i < g32.size(); ++i) {
      ASSERT_TRUE(g32[i].defined());
      EXPECT_EQ(g32[i].dtype(), DType::kF32);
      EXPECT_CLOSE(g32[i].to(DType::kF64), g64[i], 1e-4, 1e-5);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
