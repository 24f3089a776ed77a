// Finite-difference cases for the elementwise vjps (first and second order), plus
// direct checks of what finite differences cannot see: kink/tie conventions, casts
// through f16/bf16, needs() skipping and op counts on the hot path.
#include <cmath>
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

namespace kiln::testing {
namespace {

// Second-order helper with this file's weight seed (see gradcheck.h).
Tensor elementwise_inner_grad(const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  return inner_gradient(x, f, 99);
}

using In = const std::vector<Tensor>&;

// Values on both sides of relu6's kinks (0 and 6) and clip(-0.5, 0.5)'s bounds, none near them.
Tensor around_kinks() { return f64({-2, -0.7, -0.3, 0.1, 0.45, 0.6, 2.5, 5.5, 6.5, 8}, {10}); }

KILN_GRAD_CASES({
    {"add/broadcast", {"add"}, {rnd({2, 3}, 1), rnd({3}, 2)}, [](In x) { return ops::add(x[0], x[1]); }},
    {"add/bias_rows", {"add"}, {rnd({4, 3}, 3), rnd({1, 3}, 4)}, [](In x) { return ops::add(x[0], x[1]); }},
    {"sub/broadcast", {"sub"}, {rnd({2, 1}, 3), rnd({1, 4}, 4)}, [](In x) { return ops::sub(x[0], x[1]); }},
    {"mul/broadcast", {"mul"}, {rnd({2, 3, 4}, 5), rnd({3, 1}, 6)}, [](In x) { return ops::mul(x[0], x[1]); }},
    {"mul/scalar", {"mul"}, {rnd({2, 3}, 5), rnd({}, 6)}, [](In x) { return ops::mul(x[0], x[1]); }},
    {"div", {"div"}, {rnd({2, 3}, 7), rnd_away({2, 3}, 8, 0.5, 2)}, [](In x) { return ops::div(x[0], x[1]); }},
    {"div/broadcast", {"div"}, {rnd({3, 1}, 7), rnd_away({4}, 8, 0.5, 2)}, [](In x) { return ops::div(x[0], x[1]); }},
    {"pow/broadcast", {"pow"}, {rnd({2, 3}, 20, 0.5, 2), rnd({3}, 21, -2, 2)},
     [](In x) { return ops::pow(x[0], x[1]); }},
    {"pow/scalar_exponent", {"pow"}, {rnd({5}, 22, 0.3, 3), f64({2.5}, {})},
     [](In x) { return ops::pow(x[0], x[1]); }},
    {"maximum/broadcast", {"maximum"}, {rnd({2, 3}, 23), rnd({3}, 24)}, [](In x) { return ops::maximum(x[0], x[1]); }},
    {"minimum/broadcast", {"minimum"}, {rnd({2, 1}, 25), rnd({2, 4}, 26)},
     [](In x) { return ops::minimum(x[0], x[1]); }},
    // Input 0 only builds the (non-differentiable) condition.
    {"where/broadcast", {"where"}, {rnd({2, 3}, 27), rnd({2, 3}, 28), rnd({3}, 29)},
     [](In x) { return ops::where(ops::greater(x[0], ops::scalar(0, DType::kF64)), x[1], x[2]); },
     {1, 2}},
    {"where/cond_broadcast", {"where"}, {rnd({3, 1}, 30), rnd({1, 4}, 31), rnd({3, 4}, 32)},
     [](In x) { return ops::where(ops::less(x[0], ops::scalar(0, DType::kF64)), x[1], x[2]); },
     {1, 2}},
    // f64 -> f32 -> f64 round trip around x^2 (exact in central differences but for the
    // f32 rounding, ~1e-7 / eps): larger eps, looser tolerance.
    {"cast/f32_round_trip", {"cast", "mul"}, {rnd({6}, 33, 0.5, 2)},
     [](In x) {
       Tensor h = ops::cast(x[0], DType::kF32);
       return ops::cast(ops::mul(h, h), DType::kF64);
     },
     {}, 1e-3, 1e-3, 1e-4},

    {"neg", {"neg"}, {rnd({5}, 9)}, [](In x) { return ops::neg(x[0]); }},
    {"abs", {"abs"}, {rnd_away({7}, 34)}, [](In x) { return ops::abs(x[0]); }},
    {"exp", {"exp"}, {rnd({5}, 10)}, [](In x) { return ops::exp(x[0]); }},
    {"log", {"log"}, {rnd({5}, 11, 0.5, 2)}, [](In x) { return ops::log(x[0]); }},
    {"log1p", {"log1p"}, {rnd({6}, 35, -0.5, 2)}, [](In x) { return ops::log1p(x[0]); }},
    {"square", {"square"}, {rnd({4}, 14)}, [](In x) { return ops::square(x[0]); }},
    {"sqrt", {"sqrt"}, {rnd({6}, 36, 0.3, 3)}, [](In x) { return ops::sqrt(x[0]); }},
    {"rsqrt", {"rsqrt"}, {rnd({6}, 37, 0.3, 3)}, [](In x) { return ops::rsqrt(x[0]); }},
    {"reciprocal", {"reciprocal"}, {rnd_away({6}, 38, 0.4, 2)}, [](In x) { return ops::reciprocal(x[0]); }},
    {"sin", {"sin"}, {rnd({6}, 39, -3, 3)}, [](In x) { return ops::sin(x[0]); }},
    {"cos", {"cos"}, {rnd({6}, 40, -3, 3)}, [](In x) { return ops::cos(x[0]); }},
    {"tanh", {"tanh"}, {rnd({5}, 12)}, [](In x) { return ops::tanh(x[0]); }},
    {"sigmoid", {"sigmoid"}, {rnd({6}, 41, -4, 4)}, [](In x) { return ops::sigmoid(x[0]); }},
    {"relu", {"relu"}, {rnd_away({7}, 13)}, [](In x) { return ops::relu(x[0]); }},
    // d/dg only (d/dy is zero away from 0, where y is kept).
    {"relu_grad", {"relu_grad"}, {rnd({7}, 14), rnd_away({7}, 15)}, [](In x) { return ops::relu_grad(x[0], x[1]); }},
    {"relu6", {"relu6"}, {around_kinks()}, [](In x) { return ops::relu6(x[0]); }},
    {"leaky_relu/0.2", {"leaky_relu"}, {rnd_away({7}, 42)}, [](In x) { return ops::leaky_relu(x[0], 0.2); }},
    {"leaky_relu/0.01", {"leaky_relu"}, {rnd_away({7}, 43)}, [](In x) { return ops::leaky_relu(x[0], 0.01); }},
    {"elu/1", {"elu"}, {rnd_away({7}, 44, 0.2, 2)}, [](In x) { return ops::elu(x[0], 1.0); }},
    {"elu/0.7", {"elu"}, {rnd_away({7}, 45, 0.2, 2)}, [](In x) { return ops::elu(x[0], 0.7); }},
    {"gelu/exact", {"gelu"}, {rnd({8}, 46, -4, 4)}, [](In x) { return ops::gelu(x[0], false); }},
    {"gelu/tanh_approximation", {"gelu"}, {rnd({8}, 47, -4, 4)}, [](In x) { return ops::gelu(x[0], true); }},
    {"silu", {"silu"}, {rnd({8}, 48, -4, 4)}, [](In x) { return ops::silu(x[0]); }},
    {"softplus", {"softplus"}, {rnd({8}, 49, -5, 5)}, [](In x) { return ops::softplus(x[0]); }},
    {"erf", {"erf"}, {rnd({8}, 50, -2, 2)}, [](In x) { return ops::erf(x[0]); }},
    {"clip", {"clip"}, {around_kinks()}, [](In x) { return ops::clip(x[0], -0.5, 0.5); }},

    // Second order: the vjps differentiated again.
    {"second_order/mul_div", {"mul", "div"}, {rnd_away({5}, 51, 0.5, 2)},
     [](In x) { return elementwise_inner_grad(x[0], [](const Tensor& t) { return ops::div(ops::mul(t, t), ops::add(t, t)); }); }},
    {"second_order/pow", {"pow"}, {rnd({4}, 52, 0.5, 2), rnd({4}, 53, -1, 2)},
     [](In x) {
       GradientTape tape;
       tape.watch(x[0]);
       tape.watch(x[1]);
       auto g = tape.gradient(ops::pow(x[0], x[1]), {x[0], x[1]});
       return ops::add(ops::mul(g[0], x[0]), g[1]);
     }},
    {"second_order/transcendental", {"exp", "log", "log1p", "sqrt", "rsqrt", "reciprocal"}, {rnd({5}, 54, 0.5, 2)},
     [](In x) {
       return elementwise_inner_grad(x[0], [](const Tensor& t) {
         Tensor a = ops::add(ops::exp(t), ops::log(t));
         Tensor b = ops::add(ops::log1p(t), ops::sqrt(t));
         return ops::add(ops::add(a, b), ops::add(ops::rsqrt(t), ops::reciprocal(t)));
       });
     }},
    {"second_order/trig_activations", {"sin", "cos", "tanh", "sigmoid", "erf", "softplus", "silu"},
     {rnd({6}, 55, -2, 2)},
     [](In x) {
       return elementwise_inner_grad(x[0], [](const Tensor& t) {
         Tensor a = ops::add(ops::sin(t), ops::cos(t));
         Tensor b = ops::add(ops::tanh(t), ops::sigmoid(t));
         Tensor c = ops::add(ops::erf(t), ops::softplus(t));
         return ops::add(ops::add(a, b), ops::add(c, ops::silu(t)));
       });
     }},
    {"second_order/gelu", {"gelu"}, {rnd({6}, 56, -3, 3)},
     [](In x) {
       return elementwise_inner_grad(x[0], [](const Tensor& t) { return ops::add(ops::gelu(t, false), ops::gelu(t, true)); });
     }},
    {"second_order/abs_relu", {"abs", "relu", "relu_grad"}, {around_kinks()},
     [](In x) {
       return elementwise_inner_grad(x[0], [](const Tensor& t) { return ops::add(ops::abs(t), ops::relu(t)); });
     }},
    {"second_order/leaky_relu", {"leaky_relu"}, {around_kinks()},
     [](In x) { return elementwise_inner_grad(x[0], [](const Tensor& t) { return ops::leaky_relu(t, 0.1); }); }},
    {"second_order/elu", {"elu"}, {around_kinks()},
     [](In x) { return elementwise_inner_grad(x[0], [](const Tensor& t) { return ops::elu(t, 0.5); }); }},
    {"second_order/relu6_clip", {"relu6", "clip"}, {around_kinks()},
     [](In x) {
       return elementwise_inner_grad(x[0], [](const Tensor& t) { return ops::add(ops::relu6(t), ops::clip(t, -0.5, 0.5)); });
     }},
    {"second_order/maximum_minimum_where", {"maximum", "minimum", "where"}, {around_kinks()},
     [](In x) {
       return elementwise_inner_grad(x[0], [](const Tensor& t) {
         Tensor m = ops::add(ops::maximum(ops::mul(t, t), ops::neg(t)), ops::minimum(t, ops::sin(t)));
         return ops::where(ops::greater(t, ops::scalar(1, DType::kF64)), m, ops::exp(t));
       });
     }},
});

// ---- conventions at kinks and ties -------------------------------------------------

std::vector<Tensor> grads(const std::vector<Tensor>& xs, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const Tensor& w = {}) {
  GradientTape tape;
  for (const Tensor& x : xs) tape.watch(x);
  return tape.gradient(f(xs), xs, w, UnconnectedGradients::kZero);
}

TEST(VjpElementwise, MaximumMinimumTiesGoToFirstInput) {
  Tensor a = f64({1, 2, 3}, {3}), b = f64({1, 5, 0}, {3});
  auto gmax = grads({a, b}, [](In x) { return ops::maximum(x[0], x[1]); });
  EXPECT_CLOSE(gmax[0], f64({1, 0, 1}, {3}), 0, 0);
  EXPECT_CLOSE(gmax[1], f64({0, 1, 0}, {3}), 0, 0);
  auto gmin = grads({a, b}, [](In x) { return ops::minimum(x[0], x[1]); });
  EXPECT_CLOSE(gmin[0], f64({1, 1, 0}, {3}), 0, 0);
  EXPECT_CLOSE(gmin[1], f64({0, 0, 1}, {3}), 0, 0);
}

// The gradient of f at x (by value: EXPECT_CLOSE binds a reference).
Tensor grad_at(const Tensor& x, const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  return grads({x}, f)[0];
}

TEST(VjpElementwise, KinkConventionsAndInclusiveClipBounds) {
  Tensor x = f64({0, -1, 0.5, 6, -0.5}, {5});
  EXPECT_CLOSE(grad_at(x, [](In t) { return ops::abs(t[0]); }), f64({0, -1, 1, 1, -1}, {5}), 0, 0);
  EXPECT_CLOSE(grad_at(x, [](In t) { return ops::relu(t[0]); }), f64({0, 0, 1, 1, 0}, {5}), 0, 0);
  EXPECT_CLOSE(grad_at(x, [](In t) { return ops::relu6(t[0]); }), f64({0, 0, 1, 0, 0}, {5}), 0, 0);
  EXPECT_CLOSE(grad_at(x, [](In t) { return ops::leaky_relu(t[0], 0.25); }), f64({0.25, 0.25, 1, 1, 0.25}, {5}),
               0, 0);
  EXPECT_CLOSE(grad_at(x, [](In t) { return ops::clip(t[0], -0.5, 0.5); }), f64({1, 0, 1, 0, 1}, {5}), 0, 0);
  // elu'(0) from the exponential side: alpha * e^0.
  EXPECT_CLOSE(grad_at(f64({0}, {1}), [](In t) { return ops::elu(t[0], 0.5); }), f64({0.5}, {1}), 0, 0);
}

TEST(VjpElementwise, PowExponentGradientIsZeroForNonPositiveBase) {
  // d/db a^b = a^b log a: 0 where a <= 0 (TensorFlow's convention); d/da is still b a^(b-1).
  Tensor a = f64({-2, 0, 3}, {3}), b = f64({2, 3, 2}, {3});
  auto g = grads({a, b}, [](In x) { return ops::pow(x[0], x[1]); });
  EXPECT_CLOSE(g[0], f64({-4, 0, 6}, {3}), 1e-12, 0);
  EXPECT_CLOSE(g[1], f64({0, 0, 9 * std::log(3.0)}, {3}), 1e-12, 0);
}

// ---- casts (finite differences through rounding are meaningless) -------------------

TEST(VjpElementwise, CastThroughHalfRoundsTheCotangent) {
  // d/dx cast(cast(x, f16)^2, f32) = 2x, computed in f16: the values are exact there.
  Tensor x = make<float>({1.5f, -2, 0.25f}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor h = ops::cast(x, DType::kF16);
  Tensor y = ops::cast(ops::mul(h, h), DType::kF32);
  auto g = tape.gradient(y, {x}, make<float>({1, 2, -1}, {3}));
  ASSERT_EQ(g[0].dtype(), DType::kF32);
  EXPECT_CLOSE(g[0], make<float>({3, -8, -0.5f}, {3}), 0, 0);

  // The cotangent of a cast is cast back: 1 + 2^-12 is a quarter f16 ulp above 1 and
  // rounds to 1; 3 + 2^-9 is representable (the f16 ulp in [2, 4) is 2^-9) and survives.
  Tensor z = make<float>({0.5f, 3}, {2});
  GradientTape tape2;
  tape2.watch(z);
  Tensor r = ops::cast(ops::cast(z, DType::kF16), DType::kF32);
  auto gz = tape2.gradient(r, {z}, make<float>({1 + std::ldexp(1.0f, -12), 3 + std::ldexp(1.0f, -9)}, {2}));
  EXPECT_CLOSE(gz[0], make<float>({1, 3 + std::ldexp(1.0f, -9)}, {2}), 0, 0);
}

TEST(VjpElementwise, CastFromBfloat16GivesBfloat16Gradient) {
  Tensor x = Tensor::from_vector<float>({1, -2, 0.5f}, {3}).to(DType::kBF16);
  GradientTape tape;
  tape.watch(x);
  Tensor f = ops::cast(x, DType::kF32);
  Tensor y = ops::cast(ops::mul(ops::mul(f, f), ops::scalar(3, DType::kF32)), DType::kF64);  // 3 x^2
  auto g = tape.gradient(y, {x});
  ASSERT_EQ(g[0].dtype(), DType::kBF16);
  EXPECT_CLOSE(g[0].to(DType::kF32), make<float>({6, -12, 3}, {3}), 0, 0);
  // bf16 has 8 significant bits: 1 + 2^-9 rounds to 1 on the way back.
  GradientTape tape2;
  tape2.watch(x);
  Tensor y2 = ops::cast(x, DType::kF32);
  auto g2 = tape2.gradient(y2, {x}, make<float>({1 + std::ldexp(1.0f, -9), 2, 4}, {3}));
  EXPECT_CLOSE(g2[0].to(DType::kF32), make<float>({1, 2, 4}, {3}), 0, 0);
}

TEST(VjpElementwise, CastFromIntegerGetsNoGradient) {
  const OpDef& d = OpRegistry::global().get("cast");
  Tensor x = make<int32_t>({1, 2}, {2});
  Attrs attrs{{"dtype", DType::kF32}};
  std::vector<Tensor> in{x}, out{ops::cast(x, DType::kF32)}, cot{ops::ones_like(out[0])};
  VjpContext ctx{in, out, cot, attrs, {}};
  auto g = d.vjp(ctx);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(g[0].defined());
}

// ---- needs() and op counts ---------------------------------------------------------

// Runs `op`'s vjp with ones as the cotangent and the given needs mask.
std::vector<Tensor> run_vjp(const std::string& op, std::vector<Tensor> in, const Attrs& attrs,
                            std::vector<uint8_t> needs) {
  const OpDef& d = OpRegistry::global().get(op);
  std::vector<Tensor> out = call_op(d, in, attrs);
  std::vector<Tensor> cot;
  for (const Tensor& o : out) cot.push_back(ops::ones_like(o));
  return d.vjp(VjpContext{in, out, cot, attrs, needs});
}

TEST(VjpElementwise, BinaryOpsSkipInputsThatNeedNoGradient) {
  Tensor a = rnd({2, 3}, 60, 0.5, 2), b = rnd({3}, 61, 0.5, 2);
  for (const char* op : {"add", "sub", "mul", "div", "pow", "maximum", "minimum"}) {
    SCOPED_TRACE(op);
    auto only_a = run_vjp(op, {a, b}, {}, {1, 0});
    ASSERT_EQ(only_a.size(), 2u);
    ASSERT_TRUE(only_a[0].defined());
    EXPECT_EQ(only_a[0].shape(), a.shape());
    EXPECT_EQ(only_a[0].dtype(), DType::kF64);
    EXPECT_FALSE(only_a[1].defined());
    auto only_b = run_vjp(op, {a, b}, {}, {0, 1});
    EXPECT_FALSE(only_b[0].defined());
    ASSERT_TRUE(only_b[1].defined());
    EXPECT_EQ(only_b[1].shape(), b.shape());
  }
  Tensor cond = ops::greater(a, ops::scalar(1, DType::kF64));
  auto w = run_vjp("where", {cond, a, b}, {}, {0, 0, 1});
  EXPECT_FALSE(w[0].defined());
  EXPECT_FALSE(w[1].defined());
  ASSERT_TRUE(w[2].defined());
  EXPECT_EQ(w[2].shape(), b.shape());
}

// The hot path of a training step: these vjps must stay a handful of ops.
TEST(VjpElementwise, HotPathVjpsRunFewOps) {
  Tensor x = rnd({4, 3}, 62), bias = rnd({3}, 63);
  {
    std::vector<Tensor> in{x}, out{ops::relu(x)}, cot{ops::ones_like(x)};
    Attrs none;
    OpCounter c;
    auto r = OpRegistry::global().get("relu").vjp(VjpContext{in, out, cot, none, {}});
    EXPECT_LE(c.total, 2) << "relu vjp";
    EXPECT_EQ(r[0].shape(), x.shape());
  }
  {
    // add with a broadcast bias: the activation's gradient is the cotangent itself and
    // the bias's one reduction (plus a free reshape).
    std::vector<Tensor> in{x, bias}, out{ops::add(x, bias)}, cot{ops::ones_like(x)};
    Attrs none;
    OpCounter c;
    auto r = OpRegistry::global().get("add").vjp(VjpContext{in, out, cot, none, {}});
    EXPECT_EQ(c.counts["sum"], 1);
    EXPECT_LE(c.total, 2) << "add vjp";
    EXPECT_EQ(r[0].id(), cot[0].id()) << "the same-shape input should get the cotangent without a copy";
    EXPECT_EQ(r[1].shape(), bias.shape());
  }
}

}  // namespace
}  // namespace kiln::testing
