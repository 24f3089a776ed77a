// Finite-difference cases for the reduction vjps (axes, negative axes, keepdims,
// ddof, zeros in prod, second order) and direct checks of the tie convention of
// max/min, needs() on integer inputs and the op count of sum/mean.
#include <functional>
#include <map>

#include "gradcheck.h"
#include "kiln/autodiff/tape.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"

namespace kiln::testing {
namespace {

// Second-order helper with this file's weight seed (see gradcheck.h).
Tensor reduce_inner_grad(const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  return inner_gradient(x, f, 98);
}

using In = const std::vector<Tensor>&;

// Rows with no zero, one zero and two zeros: prod is a polynomial, so central
// differences are exact up to rounding even at the zeros.
Tensor with_zeros() { return f64({0.5, -1.2, 0.8, 1.5, 0.9, 0, -1.1, 0.7, 0, 1.3, 0, -0.6}, {3, 4}); }

KILN_GRAD_CASES({
    {"sum/all", {"sum"}, {rnd({2, 3, 4}, 1)}, [](In x) { return ops::sum(x[0]); }},
    {"sum/axis1", {"sum"}, {rnd({2, 3, 4}, 2)}, [](In x) { return ops::sum(x[0], {1}); }},
    {"sum/axes02_keepdims", {"sum"}, {rnd({2, 3, 4}, 3)}, [](In x) { return ops::sum(x[0], {0, 2}, true); }},
    {"sum/negative_axis", {"sum"}, {rnd({2, 3, 4}, 4)}, [](In x) { return ops::sum(x[0], {-1}); }},
    {"sum/size1_axis", {"sum"}, {rnd({2, 1, 3}, 5)}, [](In x) { return ops::sum(x[0], {1}); }},
    {"sum/scalar_input", {"sum"}, {rnd({}, 6)}, [](In x) { return ops::sum(x[0]); }},

    {"mean/all", {"mean"}, {rnd({3, 4}, 7)}, [](In x) { return ops::mean(x[0]); }},
    {"mean/axis0_keepdims", {"mean"}, {rnd({3, 4}, 8)}, [](In x) { return ops::mean(x[0], {0}, true); }},
    {"mean/axes_neg", {"mean"}, {rnd({2, 3, 4}, 9)}, [](In x) { return ops::mean(x[0], {-1, 0}); }},

    {"max/all", {"max"}, {rnd({3, 4}, 10)}, [](In x) { return ops::max(x[0]); }},
    {"max/axis1", {"max"}, {rnd({3, 4}, 11)}, [](In x) { return ops::max(x[0], {1}); }},
    {"max/axes01_keepdims", {"max"}, {rnd({2, 3, 4}, 12)}, [](In x) { return ops::max(x[0], {0, 1}, true); }},
    {"min/all", {"min"}, {rnd({3, 4}, 13)}, [](In x) { return ops::min(x[0]); }},
    {"min/axis0", {"min"}, {rnd({3, 4}, 14)}, [](In x) { return ops::min(x[0], {0}); }},
    {"min/negative_axis_keepdims", {"min"}, {rnd({2, 3, 4}, 15)}, [](In x) { return ops::min(x[0], {-2}, true); }},

    {"prod/all", {"prod"}, {rnd_away({2, 3}, 16, 0.5, 1.5)}, [](In x) { return ops::prod(x[0]); }},
    {"prod/axis1_zeros", {"prod"}, {with_zeros()}, [](In x) { return ops::prod(x[0], {1}); }},
    {"prod/axis0_zeros_keepdims", {"prod"}, {with_zeros()}, [](In x) { return ops::prod(x[0], {0}, true); }},

    {"var/axis1", {"var"}, {rnd({3, 5}, 17)}, [](In x) { return ops::var(x[0], {1}); }},
    {"var/all_ddof1_keepdims", {"var"}, {rnd({3, 4}, 18)}, [](In x) { return ops::var(x[0], {}, true, 1); }},
    {"var/axes02_ddof2", {"var"}, {rnd({3, 2, 4}, 19)}, [](In x) { return ops::var(x[0], {0, 2}, false, 2); }},
    {"std/axis0_ddof1", {"std"}, {rnd({4, 3}, 20)}, [](In x) { return ops::std(x[0], {0}, false, 1); }},
    {"std/all", {"std"}, {rnd({3, 4}, 21)}, [](In x) { return ops::std(x[0]); }},
    {"std/negative_axis_keepdims", {"std"}, {rnd({2, 3, 4}, 22)}, [](In x) { return ops::std(x[0], {-1}, true); }},

    {"logsumexp/axis1", {"logsumexp"}, {rnd({3, 4}, 23, -3, 3)}, [](In x) { return ops::logsumexp(x[0], {1}); }},
    {"logsumexp/all_keepdims", {"logsumexp"}, {rnd({2, 3}, 24, -3, 3)},
     [](In x) { return ops::logsumexp(x[0], {}, true); }},
    {"logsumexp/large_values", {"logsumexp"}, {rnd({2, 4}, 25, 200, 205)},
     [](In x) { return ops::logsumexp(x[0], {-1}); }},

    {"second_order/sum_mean", {"sum", "mean"}, {rnd({3, 4}, 26)},
     [](In x) {
       return reduce_inner_grad(x[0], [](const Tensor& t) { return ops::add(ops::sum(t, {0}), ops::mean(t, {0})); });
     }},
    {"second_order/prod", {"prod"}, {with_zeros()},
     [](In x) { return reduce_inner_grad(x[0], [](const Tensor& t) { return ops::prod(t, {1}); }); }},
    {"second_order/var_std", {"var", "std"}, {rnd({3, 4}, 27)},
     [](In x) {
       return reduce_inner_grad(x[0], [](const Tensor& t) { return ops::add(ops::var(t, {1}), ops::std(t, {1}, false, 1)); });
     }},
    {"second_order/logsumexp", {"logsumexp"}, {rnd({3, 4}, 28)},
     [](In x) { return reduce_inner_grad(x[0], [](const Tensor& t) { return ops::logsumexp(t, {0}); }); }},
    {"second_order/max_min", {"max", "min"}, {rnd({3, 4}, 29)},
     [](In x) {
       return reduce_inner_grad(x[0], [](const Tensor& t) { return ops::mul(ops::max(t, {1}), ops::min(t, {1})); });
     }},
});

// By value: EXPECT_CLOSE binds a reference.
Tensor grad1(const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  GradientTape tape;
  tape.watch(x);
  return tape.gradient(f(x), {x})[0];
}

TEST(VjpReduce, MaxMinShareTheGradientAmongTies) {
  Tensor x = f64({1, 3, 3, 2, 2, 2}, {2, 3});
  const double t = 1.0 / 3;
  EXPECT_CLOSE(grad1(x, [](const Tensor& v) { return ops::max(v, {1}); }), f64({0, 0.5, 0.5, t, t, t}, {2, 3}),
               1e-15, 0);
  EXPECT_CLOSE(grad1(x, [](const Tensor& v) { return ops::min(v, {1}, true); }), f64({1, 0, 0, t, t, t}, {2, 3}),
               1e-15, 0);
  EXPECT_CLOSE(grad1(x, [](const Tensor& v) { return ops::max(v); }), f64({0, 0.5, 0.5, 0, 0, 0}, {2, 3}), 1e-15,
               0);
}

TEST(VjpReduce, ProdWithZerosHandComputed) {
  // Row [2, 0, 3]: only the zero gets a gradient (2 * 3); row [0, 5, 0]: all zero.
  Tensor x = f64({2, 0, 3, 0, 5, 0}, {2, 3});
  EXPECT_CLOSE(grad1(x, [](const Tensor& v) { return ops::prod(v, {1}); }), f64({0, 6, 0, 0, 0, 0}, {2, 3}), 0, 0);
  Tensor y = f64({2, -1, 4}, {3});
  EXPECT_CLOSE(grad1(y, [](const Tensor& v) { return ops::prod(v); }), f64({-4, 8, -2}, {3}), 0, 0);
}

TEST(VjpReduce, IntegerInputsGetNoGradient) {
  Tensor x = make<int32_t>({1, 2, 3, 4}, {2, 2});
  for (const char* op : {"sum", "mean", "prod", "max", "min"}) {
    SCOPED_TRACE(op);
    const OpDef& d = OpRegistry::global().get(op);
    Attrs attrs{{"axes", std::vector<int64_t>{1}}, {"keepdims", false}};
    std::vector<Tensor> in{x};
    std::vector<Tensor> out = call_op(d, in, attrs);
    std::vector<Tensor> cot{ops::ones_like(out[0], DType::kF32)};
    auto g = d.vjp(VjpContext{in, out, cot, attrs, {}});
    ASSERT_EQ(g.size(), 1u);
    EXPECT_FALSE(g[0].defined());
  }
}

// The loss reductions of every step: one broadcast (mean: plus one scale of the small
// reduced tensor), no other copies.
TEST(VjpReduce, SumAndMeanVjpsBroadcastOnce) {
  Tensor x = rnd({4, 5}, 30);
  for (const char* op : {"sum", "mean"}) {
    SCOPED_TRACE(op);
    const OpDef& d = OpRegistry::global().get(op);
    Attrs attrs{{"axes", std::vector<int64_t>{0}}, {"keepdims", false}};
    std::vector<Tensor> in{x};
    std::vector<Tensor> out = call_op(d, in, attrs);
    std::vector<Tensor> cot{rnd(out[0].shape(), 31)};
    std::vector<Tensor> g;
    OpCounter c;
    g = d.vjp(VjpContext{in, out, cot, attrs, {}});
    const bool is_mean = std::string(op) == "mean";
    int others = 0;
    for (const auto& [name, n] : c.counts)
      if (name != "broadcast_to" && name != "mul" && name != "reshape") others += n;  // reshape: a view
    EXPECT_EQ(c.counts["broadcast_to"], 1);
    EXPECT_EQ(c.counts["mul"], is_mean ? 1 : 0);
    EXPECT_EQ(others, 0);
    ASSERT_EQ(g[0].shape(), x.shape());
    // Each column j receives cot[j] (divided by 4 for the mean).
    std::vector<double> gv = g[0].to_vector<double>(), cv = cot[0].to_vector<double>();
    const double scale = is_mean ? 0.25 : 1.0;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 5; ++j) EXPECT_DOUBLE_EQ(gv[i * 5 + j], cv[j] * scale);
  }
}

}  // namespace
}  // namespace kiln::testing
