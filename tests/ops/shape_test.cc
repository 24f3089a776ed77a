// Shape ops: NumPy fixture table (scripts/fixtures/gen_shape.py), hand-computed cases
// for every dtype, large/odd layouts against naive byte-level references, errors.
#include <cstring>
#include <limits>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/shape.h"

#include "op_table.h"
#include "shape_test_util.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;
using V = std::vector<Tensor>;

OpFn one(std::function<Tensor(const Tensor&)> f) {
  return [f](const V& in) { return V{f(in[0])}; };
}

std::vector<OpCase> shape_cases() {
  auto tr = [](std::vector<int64_t> perm) { return one([perm](const Tensor& x) { return transpose(x, perm); }); };
  auto split_fn = [](std::vector<int64_t> sizes, int64_t axis) {
    return OpFn([sizes, axis](const V& in) { return split(in[0], sizes, axis); });
  };
  const int64_t lo = kSliceMin, hi = kSliceMax;
  std::vector<OpCase> c = {
      {"transpose_2d", tr({1, 0})},
      {"transpose_2d_tall", tr({})},
      {"transpose_3d_021", tr({0, 2, 1})},
      {"transpose_3d_201", tr({2, 0, 1})},
      {"transpose_3d_102", tr({1, 0, 2})},
      {"transpose_3d_rev", tr({})},
      {"transpose_4d_3102", tr({3, 1, 0, 2})},
      {"transpose_4d_0231", tr({0, -2, -1, 1})},
      {"transpose_4d_1032", tr({1, 0, 3, 2})},
      {"transpose_empty", tr({1, 0})},
      {"concat_axis1", [](const V& in) { return V{concat(in, 1)}; }},
      {"concat_axis0", [](const V& in) { return V{concat(in, 0)}; }},
      {"concat_axis2", [](const V& in) { return V{concat(in, -1)}; }},
      {"concat_empty", [](const V& in) { return V{concat(in, 1)}; }},
      {"stack_axis0", [](const V& in) { return V{stack(in, 0)}; }},
      {"stack_axis1", [](const V& in) { return V{stack(in, 1)}; }},
      {"stack_axis2", [](const V& in) { return V{stack(in, -1)}; }},
      {"split_axis0", split_fn({1, -1, 2}, 0)},
      {"split_axis1", [](const V& in) { return split(in[0], int64_t{2}, 1); }},
      {"split_axis2", split_fn({2, 0, 3}, -1)},
      {"slice_basic", one([](const Tensor& x) { return slice(x, {1, 0, 2}, {2, -1, 5}); })},
      {"strided_rev", one([=](const Tensor& x) { return strided_slice(x, {hi, 1, hi}, {lo, 5, lo}, {-1, 2, -3}); })},
      {"strided_neg_idx",
       one([](const Tensor& x) { return strided_slice(x, {-2, -100, 5}, {0, 100, -8}, {-1, 1, -2}); })},
      {"strided_partial", one([=](const Tensor& x) { return strided_slice(x, {1}, {hi}, {2}); })},
      {"strided_empty", one([=](const Tensor& x) { return strided_slice(x, {3, lo, 1}, {1, hi, 2}); })},
      {"pad_constant", one([](const Tensor& x) { return pad(x, {{1, 2}, {0, 3}}, "constant", 7); })},
      {"pad_reflect", one([](const Tensor& x) { return pad(x, {{2, 2}, {3, 1}}, "reflect"); })},
      {"pad_edge", one([](const Tensor& x) { return pad(x, {{0, 2}, {4, 1}}, "edge"); })},
      {"pad_3d", one([](const Tensor& x) { return pad(x, {{0, 0}, {1, 1}, {0, 0}}); })},
      {"pad_empty_dim", one([](const Tensor& x) { return pad(x, {{1, 1}, {1, 0}}, "constant", 3); })},
      {"tile_2d", one([](const Tensor& x) { return tile(x, {2, 3}); })},
      {"tile_rank_up", one([](const Tensor& x) { return tile(x, {2, 1, 2}); })},
      {"broadcast_to_3d", one([](const Tensor& x) { return broadcast_to(x, {2, 3, 4}); })},
      {"broadcast_to_rows", one([](const Tensor& x) { return broadcast_to(x, {4, 5}); })},
      {"broadcast_to_scalar", one([](const Tensor& x) { return broadcast_to(x, {2, 3}); })},
  };
  for (auto& k : c) k.dtypes = kMoveDtypes;
  return c;
}

class ShapeOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(ShapeOps, MatchesNumpy) { run_op_case("shape", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, ShapeOps, ::testing::ValuesIn(shape_cases()),
                         [](const auto& info) { return info.param.name; });
KILN_CUDA_OP_TABLE(ShapeOps, "shape", shape_cases());

// ---- every dtype, hand-computed ------------------------------------------------------

class ShapeEveryDtype : public ::testing::TestWithParam<DType> {};

TEST_P(ShapeEveryDtype, TransposeConcatStackSplit) {
  DType dt = GetParam();
  Tensor x = seq({2, 3}, dt);  // [[0 1 2] [3 4 5]]
  expect_picks(transpose(x), x, {3, 2}, {0, 3, 1, 4, 2, 5});
  Tensor y = seq({2, 3, 2}, dt);
  expect_picks(transpose(y, {1, 2, 0}), y, {3, 2, 2}, {0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11});
  Tensor c = concat({x, x}, 1);
  expect_picks(c, x, {2, 6}, {0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
  expect_picks(stack({x, x}, 2), x, {2, 3, 2}, {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5});
  std::vector<Tensor> parts = split(x, std::vector<int64_t>{2, 1}, 1);
  ASSERT_EQ(parts.size(), 2u);
  expect_picks(parts[0], x, {2, 2}, {0, 1, 3, 4});
  expect_picks(parts[1], x, {2, 1}, {2, 5});
}

TEST_P(ShapeEveryDtype, SlicePadTileBroadcast) {
  DType dt = GetParam();
  Tensor x = seq({3, 4}, dt);  // rows 0..3, 4..7, 8..11
  expect_picks(slice(x, {1, 1}, {2, 2}), x, {2, 2}, {5, 6, 9, 10});
  expect_picks(strided_slice(x, {kSliceMax, 3}, {kSliceMin, 0}, {-2, -2}), x, {2, 2}, {11, 9, 3, 1});
  expect_picks(pad(x, {{0, 0}, {1, 0}}, "edge"), x, {3, 5}, {0, 0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 8, 9, 10, 11});
  expect_picks(pad(x, {{1, 0}, {0, 0}}, "reflect"), x, {4, 4}, {4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor pc = pad(seq({1, 2}, dt), {{0, 1}, {1, 0}}, "constant", 1);
  EXPECT_EQ(pc.dtype(), dt);
  std::vector<double> s12 = seq({1, 2}, dt).to_vector<double>();
  EXPECT_EQ(pc.to_vector<double>(), (std::vector<double>{1, s12[0], s12[1], 1, 1, 1}));
  Tensor r = seq({2}, dt);
  expect_picks(tile(r, {2, 2}), r, {2, 4}, {0, 1, 0, 1, 0, 1, 0, 1});
  expect_picks(broadcast_to(seq({2, 1}, dt), {2, 3}), seq({2, 1}, dt), {2, 3}, {0, 0, 0, 1, 1, 1});
}

TEST_P(ShapeEveryDtype, ViewsShareTheBuffer) {
  DType dt = GetParam();
  Tensor x = seq({2, 1, 3}, dt);
  Tensor r = reshape(x, {3, -1});
  EXPECT_EQ(r.shape(), Shape({3, 2}));
  EXPECT_EQ(r.raw_data(), x.raw_data());
  Tensor s = squeeze(x);
  EXPECT_EQ(s.shape(), Shape({2, 3}));
  EXPECT_EQ(s.raw_data(), x.raw_data());
  Tensor e = expand_dims(s, -1);
  EXPECT_EQ(e.shape(), Shape({2, 3, 1}));
  EXPECT_EQ(e.to_vector<double>(), x.to_vector<double>());
  EXPECT_EQ(expand_dims(s, 0).shape(), Shape({1, 2, 3}));
  EXPECT_EQ(squeeze(seq({1, 2, 1}, dt), {-1}).shape(), Shape({1, 2}));
}

INSTANTIATE_TEST_SUITE_P(All, ShapeEveryDtype, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- larger and odd layouts against naive references ----------------------------------

bool bytes_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

Tensor naive_transpose(const Tensor& x, const std::vector<int>& perm) {
  Shape os = x.shape();
  for (int i = 0; i < x.rank(); ++i) os[i] = x.dim(perm[i]);
  Tensor out = Tensor::empty(os, x.dtype());
  auto is = x.shape().strides();
  const size_t e = x.itemsize();
  for (int64_t f = 0; f < out.numel(); ++f) {
    int64_t rem = f, src = 0;
    for (int k = x.rank() - 1; k >= 0; --k) {
      src += rem % os[k] * is[perm[k]];
      rem /= os[k];
    }
    std::memcpy(static_cast<char*>(out.raw_data()) + f * e, static_cast<const char*>(x.raw_data()) + src * e, e);
  }
  return out;
}

TEST(ShapeLayouts, TransposeLargeTilesAllElementSizes) {
  struct C {
    Shape s;
    std::vector<int> perm;
  };
  const std::vector<C> cs = {
      {{3, 200, 300}, {0, 2, 1}}, {{301, 259}, {1, 0}},     {{64, 50, 3}, {1, 0, 2}},  // 12-byte runs: generic path
      {{100, 7, 2}, {1, 0, 2}},   {{2, 3, 4, 5, 6}, {4, 2, 0, 3, 1}}, {{1, 70, 1, 90}, {3, 2, 0, 1}},
      {{33, 65, 2}, {2, 1, 0}},
  };
  for (DType dt : {DType::kU8, DType::kBool, DType::kBF16, DType::kF32, DType::kI64}) {
    for (const C& c : cs) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + c.s.str());
      Tensor x = rand_tensor(c.s, dt, 0, dt == DType::kBool ? 2 : 100, 7);
      std::vector<int64_t> p(c.perm.begin(), c.perm.end());
      EXPECT_TRUE(bytes_equal(transpose(x, p), naive_transpose(x, c.perm)));
    }
  }
}

// Python-slice reference: per dimension the list of source indices.
std::vector<int64_t> py_indices(int64_t b, int64_t e, int64_t st, int64_t n) {
  auto adj = [&](int64_t i) {
    if (i < 0) i = std::max<int64_t>(i + n, st < 0 ? -1 : 0);
    else if (i >= n) i = st < 0 ? n - 1 : n;
    return i;
  };
  std::vector<int64_t> v;
  for (int64_t i = adj(b), end = adj(e); st > 0 ? i < end : i > end; i += st) v.push_back(i);
  return v;
}

Tensor gather_by_maps(const Tensor& x, const std::vector<std::vector<int64_t>>& maps, const char* fill = nullptr) {
  Shape os;
  for (auto& m : maps) os.push_back(static_cast<int64_t>(m.size()));
  Tensor out = Tensor::empty(os, x.dtype());
  auto is = x.shape().strides();
  const size_t e = x.itemsize();
  for (int64_t f = 0; f < out.numel(); ++f) {
    int64_t rem = f, src = 0;
    bool filled = false;
    for (int k = x.rank() - 1; k >= 0; --k) {
      int64_t m = maps[k][rem % os[k]];
      rem /= os[k];
      filled |= m < 0;
      src += m * is[k];
    }
    std::memcpy(static_cast<char*>(out.raw_data()) + f * e,
                filled ? fill : static_cast<const char*>(x.raw_data()) + src * e, e);
  }
  return out;
}

TEST(ShapeLayouts, StridedSlicesMatchPythonSemantics) {
  const std::vector<std::vector<int64_t>> bounds = {
      {0, 9, 1}, {8, -10, -1}, {kSliceMax, kSliceMin, -3}, {-3, 100, 2}, {2, 2, 1}, {7, 1, -2}, {-100, 5, 4},
      {1, 8, 1}};
  const Shape s{9, 6, 9};
  for (DType dt : {DType::kBool, DType::kI8, DType::kF16, DType::kF32, DType::kF64}) {
    Tensor x = rand_tensor(s, dt, 0, dt == DType::kBool ? 2 : 100, 3);
    for (size_t a = 0; a < bounds.size(); ++a)
      for (size_t c = 0; c < bounds.size(); ++c) {
        const auto &ba = bounds[a], &bc = bounds[c];
        SCOPED_TRACE(std::string(dtype_name(dt)) + " case " + std::to_string(a) + "," + std::to_string(c));
        Tensor got = strided_slice(x, {ba[0], 1, bc[0]}, {ba[1], 5, bc[1]}, {ba[2], 1, bc[2]});
        Tensor want = gather_by_maps(
            x, {py_indices(ba[0], ba[1], ba[2], 9), py_indices(1, 5, 1, 6), py_indices(bc[0], bc[1], bc[2], 9)});
        EXPECT_TRUE(bytes_equal(got, want)) << got.str() << "\nvs\n" << want.str();
      }
  }
}

TEST(ShapeLayouts, PadTileBroadcastLargeRows) {
  for (DType dt : {DType::kU8, DType::kBF16, DType::kF32, DType::kI64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor x = rand_tensor({5, 40000}, dt, 0, 100, 5);
    std::vector<int64_t> rows = {-1, 0, 1, 2, 3, 4, -1}, cols = {-1, -1};
    for (int64_t i = 0; i < 40000; ++i) cols.push_back(i);
    cols.push_back(-1);
    Tensor fill = ops::scalar(9, dt);
    EXPECT_TRUE(bytes_equal(pad(x, {{1, 1}, {2, 1}}, "constant", 9),
                            gather_by_maps(x, {rows, cols}, static_cast<const char*>(fill.raw_data()))));
    std::vector<int64_t> r2, c2;
    for (int i = 0; i < 10; ++i) r2.push_back(i % 5);
    for (int i = 0; i < 80000; ++i) c2.push_back(i % 40000);
    EXPECT_TRUE(bytes_equal(tile(x, {2, 2}), gather_by_maps(x, {r2, c2})));
    Tensor col = strided_slice(x, {0, 7}, {5, 8});  // [5, 1]
    Tensor b = broadcast_to(col, {3, 5, 7000});
    EXPECT_EQ(b.shape(), Shape({3, 5, 7000}));
    std::vector<double> bv = b.to_vector<double>(), cv = col.to_vector<double>();
    bool ok = true;
    for (int64_t i = 0; i < b.numel(); ++i) ok &= bv[i] == cv[(i / 7000) % 5];
    EXPECT_TRUE(ok);
    // concat and split round-trip with many rows and several parts.
    Tensor y = rand_tensor({3000, 7}, dt, 0, 100, 6);
    std::vector<Tensor> parts = split(y, std::vector<int64_t>{1, 4, 2}, 1);
    EXPECT_TRUE(bytes_equal(concat(parts, 1), y));
    EXPECT_TRUE(bytes_equal(parts[1], strided_slice(y, {0, 1}, {3000, 5})));
  }
}

// ---- dtype rules and tapes --------------------------------------------------------------

TEST(ShapeRules, ConcatPromotesDtypes) {
  Tensor a = make<int32_t>({1, 2}, {2});
  Tensor b = make<float>({0.5f}, {1});
  Tensor c = concat({a, b});
  EXPECT_EQ(c.dtype(), DType::kF32);
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1, 2, 0.5f}));
  EXPECT_EQ(stack({make<bool>({true}, {1}), make<uint8_t>({7}, {1})}).dtype(), DType::kU8);
}

TEST(ShapeRules, ReshapeIsRecordedOnTapes) {
  struct Rec : OpObserver {
    std::vector<std::string> ops;
    void on_op(const OpDef& op, std::span<const Tensor>, std::span<const Tensor> out, const Attrs&) override {
      ops.push_back(op.name + out[0].shape().str());
    }
  } rec;
  Tensor x = Tensor::zeros({2, 3});
  OpObserver* prev = set_op_observer(&rec);
  (void)reshape(x, {-1});
  (void)squeeze(expand_dims(x, 1));
  (void)transpose(x);
  set_op_observer(prev);
  EXPECT_EQ(rec.ops, (std::vector<std::string>{"reshape[6]", "reshape[2, 1, 3]", "reshape[2, 3]", "transpose[3, 2]"}));
}

// ---- errors -----------------------------------------------------------------------------

TEST(ShapeErrors, ReshapeTransposeSqueeze) {
  Tensor x = Tensor::zeros({2, 3});
  EXPECT_KILN_ERROR(reshape(x, {-1, -1}), kInvalidArgument, "at most one dimension may be -1");
  EXPECT_KILN_ERROR(reshape(x, {4, 2}), kInvalidArgument, "cannot reshape [2, 3] (6 elements) to [4, 2]");
  EXPECT_KILN_ERROR(reshape(x, {4, -1}), kInvalidArgument, "cannot reshape");
  EXPECT_KILN_ERROR(reshape(x, {-2, 3}), kInvalidArgument, ">= 0 or -1");
  EXPECT_KILN_ERROR(reshape(Tensor(), {1}), kInvalidArgument, "undefined");
  EXPECT_KILN_ERROR(transpose(x, {0, 0}), kInvalidArgument, "not a permutation");
  EXPECT_KILN_ERROR(transpose(x, {0}), kInvalidArgument, "has 1 entries but the input has rank 2");
  EXPECT_KILN_ERROR(transpose(x, {0, 2}), kOutOfRange, "perm");
  EXPECT_KILN_ERROR(squeeze(x, {1}), kInvalidArgument, "dimension 1 of [2, 3] has size 3, expected 1");
  EXPECT_KILN_ERROR(squeeze(x, {5}), kOutOfRange, "axis");
  EXPECT_KILN_ERROR(expand_dims(x, 3), kOutOfRange, "expand_dims");
  EXPECT_KILN_ERROR(reshape(x, {1, 1, 1, 1, 1, 1, 1, 1, 6}), kInvalidArgument, "maximum rank");
}

TEST(ShapeErrors, JoinAndSplit) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({2, 4});
  EXPECT_KILN_ERROR(concat({a, b}, 0), kInvalidArgument, "input 1 has shape [2, 4] but input 0 has [2, 3]");
  EXPECT_KILN_ERROR(concat({a, Tensor::zeros({6})}, 0), kInvalidArgument, "shapes must match");
  EXPECT_KILN_ERROR(concat({}, 0), kInvalidArgument, "at least one input");
  EXPECT_KILN_ERROR(concat({a, b}, 2), kOutOfRange, "concat axis");
  EXPECT_KILN_ERROR(concat({Tensor::zeros({})}, 0), kInvalidArgument, "rank >= 1");
  EXPECT_KILN_ERROR(stack({a, b}), kInvalidArgument, "all inputs must have one shape");
  EXPECT_KILN_ERROR(stack({a}, 3), kOutOfRange, "stack axis");
  EXPECT_KILN_ERROR(split(b, int64_t{3}, 1), kInvalidArgument, "not divisible into 3 equal parts");
  EXPECT_KILN_ERROR(split(b, int64_t{0}, 1), kInvalidArgument, "must be >= 1");
  EXPECT_KILN_ERROR(split(b, std::vector<int64_t>{1, 2}, 1), kInvalidArgument, "add up to 3 but dimension 1");
  EXPECT_KILN_ERROR(split(b, std::vector<int64_t>{-1, -1}, 1), kInvalidArgument, "at most one -1");
  EXPECT_KILN_ERROR(split(b, std::vector<int64_t>{5, -1}, 1), kInvalidArgument, "exceed dimension 1");
  EXPECT_KILN_ERROR(split(b, int64_t{2}, -3), kOutOfRange, "split axis");
}

TEST(ShapeErrors, SlicePadTileBroadcast) {
  Tensor x = Tensor::zeros({3, 4});
  EXPECT_KILN_ERROR(slice(x, {0}, {1}), kInvalidArgument, "need 2 entries");
  EXPECT_KILN_ERROR(slice(x, {4, 0}, {-1, -1}), kOutOfRange, "begin[0] = 4 is outside [0, 3]");
  EXPECT_KILN_ERROR(slice(x, {1, 1}, {1, 4}), kOutOfRange, "size[1] = 4 with begin 1");
  EXPECT_KILN_ERROR(slice(x, {1, 1}, {1, -2}), kOutOfRange, "size[1] = -2");
  EXPECT_KILN_ERROR(strided_slice(x, {0, 0}, {1, 1}, {1, 0}), kInvalidArgument, "stride of dimension 1 is 0");
  EXPECT_KILN_ERROR(strided_slice(x, {0, 0}, {1}), kInvalidArgument, "one length");
  EXPECT_KILN_ERROR(strided_slice(x, {0, 0, 0}, {1, 1, 1}), kInvalidArgument, "rank 2");
  EXPECT_KILN_ERROR(pad(x, {{1, 1}}), kInvalidArgument, "one (before, after) pair per dimension");
  EXPECT_KILN_ERROR(pad(x, {{-1, 0}, {0, 0}}), kInvalidArgument, "paddings must be >= 0");
  EXPECT_KILN_ERROR(pad(x, {{0, 0}, {0, 0}}, "wrap"), kInvalidArgument, "mode must be");
  EXPECT_KILN_ERROR(pad(x, {{3, 0}, {0, 0}}, "reflect"), kInvalidArgument, "must be <= 2");
  EXPECT_KILN_ERROR(pad(Tensor::zeros({0, 2}), {{1, 0}, {0, 0}}, "edge"), kInvalidArgument, "nonempty");
  EXPECT_KILN_ERROR(tile(x, {1, -1}), kInvalidArgument, "reps must be >= 0");
  EXPECT_KILN_ERROR(broadcast_to(x, {4, 4}), kInvalidArgument, "cannot broadcast shape [3, 4] to [4, 4]");
  EXPECT_KILN_ERROR(broadcast_to(x, {4}), kInvalidArgument, "cannot broadcast");
  EXPECT_KILN_ERROR(broadcast_to(x, {3, -4}), kInvalidArgument, "negative dimension");
}

}  // namespace
}  // namespace kiln::testing
