// Finite-difference cases for the shape-op vjps (reshape and its views, transpose,
// broadcast_to, concat, stack, split, strided_slice, pad, tile), including cases that
// differentiate the vjps themselves (second order), and direct vjp checks for
// needs() and dtypes.
#include "gradcheck.h"
#include "kiln/autodiff/tape.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"

namespace kiln::testing {
namespace {

// Second-order helper with this file's weight seed (see gradcheck.h).
Tensor shape_inner_grad(const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  return inner_gradient(x, f, 99);
}

using In = const std::vector<Tensor>&;
using ops::kSliceMax;
using ops::kSliceMin;

KILN_GRAD_CASES({
    {"reshape", {"reshape"}, {rnd({2, 3, 4}, 1)}, [](In x) { return ops::reshape(ops::square(x[0]), {4, -1}); }},
    {"reshape/expand_dims_squeeze", {"reshape"}, {rnd({3, 1, 2}, 2)},
     [](In x) { return ops::mul(ops::expand_dims(ops::squeeze(x[0]), 0), x[0]); }},  // [1,3,2] * [3,1,2]
    {"reshape/second_order", {"reshape"}, {rnd({2, 6}, 3)},
     [](In x) { return shape_inner_grad(x[0], [](const Tensor& t) { return ops::reshape(t, {3, 4}); }); }},

    {"transpose/perm", {"transpose"}, {rnd({2, 3, 4}, 4)}, [](In x) { return ops::transpose(x[0], {2, 0, 1}); }},
    {"transpose/reverse", {"transpose"}, {rnd({2, 3, 4}, 5)}, [](In x) { return ops::transpose(x[0]); }},
    {"transpose/negative_perm", {"transpose"}, {rnd({2, 3, 4, 2}, 6)},
     [](In x) { return ops::transpose(x[0], {-1, 1, 0, -2}); }},
    {"transpose/second_order", {"transpose"}, {rnd({3, 4}, 7)},
     [](In x) { return shape_inner_grad(x[0], [](const Tensor& t) { return ops::transpose(t); }); }},

    {"broadcast_to/inner_ones", {"broadcast_to"}, {rnd({3, 1}, 8)},
     [](In x) { return ops::broadcast_to(x[0], {2, 3, 4}); }},
    {"broadcast_to/scalar", {"broadcast_to"}, {rnd({}, 9)}, [](In x) { return ops::broadcast_to(x[0], {2, 3}); }},
    {"broadcast_to/same", {"broadcast_to"}, {rnd({2, 3}, 10)}, [](In x) { return ops::broadcast_to(x[0], {2, 3}); }},
    {"broadcast_to/second_order", {"broadcast_to"}, {rnd({1, 3}, 11)},
     [](In x) { return shape_inner_grad(x[0], [](const Tensor& t) { return ops::broadcast_to(t, {2, 2, 3}); }); }},

    {"concat/axis1", {"concat"}, {rnd({2, 1, 3}, 12), rnd({2, 4, 3}, 13), rnd({2, 2, 3}, 14)},
     [](In x) { return ops::concat({x[0], x[1], x[2]}, 1); }},
    {"concat/negative_axis_empty_part", {"concat"}, {rnd({2, 3}, 15), rnd({2, 0}, 16), rnd({2, 2}, 17)},
     [](In x) { return ops::concat({x[0], x[1], x[2]}, -1); }},
    {"concat/same_input_twice", {"concat"}, {rnd({2, 2}, 18)},
     [](In x) { return ops::concat({x[0], ops::square(x[0])}, 0); }},

    {"stack/axis0", {"stack"}, {rnd({2, 3}, 19), rnd({2, 3}, 20), rnd({2, 3}, 21)},
     [](In x) { return ops::stack({x[0], x[1], x[2]}, 0); }},
    {"stack/axis1", {"stack"}, {rnd({2, 3}, 22), rnd({2, 3}, 23)}, [](In x) { return ops::stack({x[0], x[1]}, 1); }},
    {"stack/last_axis", {"stack"}, {rnd({3}, 24), rnd({3}, 25)}, [](In x) { return ops::stack({x[0], x[1]}, -1); }},

    // Part 1 is unused: it reaches the vjp as zeros.
    {"split/unused_part", {"split"}, {rnd({2, 6}, 26)},
     [](In x) {
       auto p = ops::split(x[0], int64_t{3}, 1);
       return ops::mul(p[0], p[2]);
     }},
    {"split/sizes_axis0", {"split"}, {rnd({6, 2}, 27)},
     [](In x) {
       auto p = ops::split(x[0], std::vector<int64_t>{1, -1, 2}, 0);
       return ops::concat({ops::square(p[2]), p[0], ops::mul(p[1], ops::scalar(3.0, DType::kF64))}, 0);
     }},
    {"split/negative_axis", {"split"}, {rnd({2, 3, 4}, 28)},
     [](In x) {
       auto p = ops::split(x[0], std::vector<int64_t>{3, 1}, -1);
       return ops::mul(p[0], p[1]);
     }},

    {"strided_slice/block", {"strided_slice"}, {rnd({4, 5}, 29)},
     [](In x) { return ops::slice(x[0], {1, 2}, {2, -1}); }},
    {"strided_slice/strides", {"strided_slice"}, {rnd({7, 6}, 30)},
     [](In x) { return ops::strided_slice(x[0], {1, 0}, {7, 6}, {2, 3}); }},
    {"strided_slice/negative_strides", {"strided_slice"}, {rnd({5, 4}, 31)},
     [](In x) { return ops::strided_slice(x[0], {kSliceMax, 3}, {kSliceMin, 0}, {-1, -2}); }},
    {"strided_slice/mixed_partial_rank", {"strided_slice"}, {rnd({6, 3, 2}, 32)},
     [](In x) { return ops::strided_slice(x[0], {-2}, {0}, {-2}); }},
    {"strided_slice/empty", {"strided_slice"}, {rnd({4, 3}, 33)},
     [](In x) { return ops::strided_slice(x[0], {3, 0}, {1, 3}); }},
    {"strided_slice/second_order", {"strided_slice"}, {rnd({6, 5}, 34)},
     [](In x) {
       return shape_inner_grad(x[0], [](const Tensor& t) { return ops::strided_slice(t, {5, 0}, {0, 5}, {-2, 2}); });
     }},

    {"pad/constant_value", {"pad"}, {rnd({2, 3}, 35)},
     [](In x) { return ops::pad(x[0], {{1, 2}, {0, 3}}, "constant", 2.5); }},
    {"pad/reflect", {"pad"}, {rnd({4, 3}, 36)}, [](In x) { return ops::pad(x[0], {{3, 2}, {2, 1}}, "reflect"); }},
    {"pad/edge", {"pad"}, {rnd({2, 3}, 37)}, [](In x) { return ops::pad(x[0], {{2, 3}, {0, 4}}, "edge"); }},
    {"pad/second_order_reflect", {"pad"}, {rnd({5}, 38)},
     [](In x) { return shape_inner_grad(x[0], [](const Tensor& t) { return ops::pad(t, {{4, 3}}, "reflect"); }); }},

    {"tile/both_dims", {"tile"}, {rnd({2, 3}, 39)}, [](In x) { return ops::tile(x[0], {2, 3}); }},
    {"tile/short_reps", {"tile"}, {rnd({2, 3}, 40)}, [](In x) { return ops::tile(x[0], {2}); }},
    {"tile/long_reps", {"tile", "reshape"}, {rnd({3}, 41)}, [](In x) { return ops::tile(x[0], {2, 1, 2}); }},
    {"tile/zero_reps", {"tile"}, {rnd({2, 3}, 42)}, [](In x) { return ops::tile(x[0], {1, 0}); }},
    {"tile/second_order", {"tile"}, {rnd({2, 2}, 43)},
     [](In x) { return shape_inner_grad(x[0], [](const Tensor& t) { return ops::tile(t, {3, 2}); }); }},
});

VjpContext ctx(std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> cot,
               const Attrs& attrs, std::span<const uint8_t> needs) {
  return VjpContext{in, out, cot, attrs, needs};
}

TEST(ShapeGrad, ConcatHonoursNeedsAndKeepsDtype) {
  const OpDef& d = OpRegistry::global().get("concat");
  std::vector<Tensor> in = {rand_tensor({2, 1}, DType::kF32), rand_tensor({2, 3}, DType::kF32)};
  Attrs attrs{{"axis", int64_t{1}}};
  std::vector<Tensor> out = {ops::concat(in, 1)};
  std::vector<Tensor> cot = {rand_tensor({2, 4}, DType::kF32, -1, 1, 5)};
  std::vector<uint8_t> needs = {0, 1};
  std::vector<Tensor> g = d.vjp(ctx(in, out, cot, attrs, needs));
  ASSERT_EQ(g.size(), 2u);
  EXPECT_FALSE(g[0].defined());
  ASSERT_TRUE(g[1].defined());
  EXPECT_EQ(g[1].dtype(), DType::kF32);
  EXPECT_EQ(g[1].shape(), Shape({2, 3}));
  EXPECT_CLOSE(g[1], ops::slice(cot[0], {0, 1}, {2, 3}), 0, 0);
}

TEST(ShapeGrad, StridedSliceScatterKeepsDtypeAndShape) {
  const OpDef& d = OpRegistry::global().get("strided_slice");
  std::vector<Tensor> in = {rand_tensor({5}, DType::kF32)};
  Attrs attrs{{"begin", std::vector<int64_t>{4}}, {"size", std::vector<int64_t>{3}},
              {"strides", std::vector<int64_t>{-2}}};
  std::vector<Tensor> out = {ops::strided_slice(in[0], {4}, {kSliceMin}, {-2})};  // x[4], x[2], x[0]
  std::vector<Tensor> cot = {make<float>({1, 2, 3}, {3})};
  std::vector<Tensor> g = d.vjp(ctx(in, out, cot, attrs, {}));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].dtype(), DType::kF32);
  EXPECT_CLOSE(g[0], make<float>({3, 0, 2, 0, 1}, {5}), 0, 0);
}

// Reflect padding copies interior cells several times; each copy adds its cotangent.
TEST(ShapeGrad, ReflectPadAccumulatesCopies) {
  Tensor x = f64({1, 2, 3}, {3});
  GradientTape tape;
  tape.watch(x);
  Tensor y = ops::pad(x, {{2, 2}}, "reflect");  // [3 2 1 2 3 2 1]
  Tensor g = tape.gradient(y, {x}, f64({1, 10, 100, 1000, 10000, 100000, 1000000}, {7}))[0];
  EXPECT_CLOSE(g, f64({100 + 1000000, 10 + 1000 + 100000, 1 + 10000}, {3}), 0, 0);
}

TEST(ShapeGrad, SplitGradientWithOnePartUsed) {
  Tensor x = f64({1, 2, 3, 4}, {4});
  GradientTape tape;
  tape.watch(x);
  auto parts = ops::split(x, std::vector<int64_t>{1, 3});
  Tensor g = tape.gradient(ops::sum(ops::square(parts[1])), {x})[0];
  EXPECT_CLOSE(g, f64({0, 4, 6, 8}, {4}), 0, 0);
}

}  // namespace
}  // namespace kiln::testing
