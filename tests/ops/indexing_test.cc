// Indexing ops: NumPy fixture table (scripts/fixtures/gen_shape.py), hand-computed
// cases for every dtype, the gather/scatter_add adjoint identity, top_k order rules, errors.
#include <cmath>
#include <limits>

#include "kiln/core/device.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/shape.h"

#include "op_table.h"
#include "shape_test_util.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;
using V = std::vector<Tensor>;

std::vector<OpCase> indexing_cases() {
  auto g = [](int64_t axis, int64_t bd) {
    return OpFn([axis, bd](const V& in) { return V{gather(in[0], in[1], axis, bd)}; });
  };
  auto sa = [](int64_t axis) {
    return OpFn([axis](const V& in) { return V{scatter_add(in[0], in[1], in[2], axis)}; });
  };
  auto tk = [](int64_t k, bool sorted) {
    return OpFn([k, sorted](const V& in) {
      TopK t = top_k(in[0], k, sorted);
      return V{t.values, t.indices};
    });
  };
  std::vector<OpCase> c = {
      {"gather_axis1", g(1, 0)},
      {"gather_axis0", g(0, 0)},
      {"gather_empty", g(-1, 0)},
      {"gather_batch", g(1, 1)},
      {"gather_nd_k2", [](const V& in) { return V{gather_nd(in[0], in[1])}; }},
      {"gather_nd_k1", [](const V& in) { return V{gather_nd(in[0], in[1])}; }},
      {"gather_nd_full", [](const V& in) { return V{gather_nd(in[0], in[1])}; }},
      {"scatter_add_dup0", sa(0)},
      {"scatter_add_dup1", sa(-2)},
      {"top_k_sorted", tk(4, true)},
      {"top_k_unsorted", tk(4, false)},
      {"top_k_3d", tk(3, true)},
  };
  for (auto& k : c) k.dtypes = kMoveDtypes;
  c.push_back({"one_hot_last", [](const V& in) { return V{one_hot(in[0], 4, 5, -1)}; }, {DType::kF32}});
  c.push_back({"one_hot_axis0", [](const V& in) { return V{one_hot(in[0], 4, 1, 0, DType::kF32, 0)}; }, {DType::kF32}});
  return c;
}

class IndexOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(IndexOps, MatchesNumpy) { run_op_case("shape", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, IndexOps, ::testing::ValuesIn(indexing_cases()),
                         [](const auto& info) { return info.param.name; });
KILN_CUDA_OP_TABLE(IndexOps, "shape", indexing_cases());

// ---- every dtype, hand-computed ------------------------------------------------------

class IndexEveryDtype : public ::testing::TestWithParam<DType> {};

TEST_P(IndexEveryDtype, GatherAndGatherNd) {
  DType dt = GetParam();
  Tensor p = seq({3, 4}, dt);  // [[0 1 2 3] [4 5 6 7] [8 9 10 11]]
  Tensor g1 = gather(p, make<int32_t>({3, 0, 3}, {3}), 1);
  EXPECT_EQ(g1.dtype(), dt);
  EXPECT_EQ(g1.shape(), Shape({3, 3}));
  EXPECT_EQ(g1.to_vector<double>(), pick(p, {3, 0, 3, 7, 4, 7, 11, 8, 11}));
  Tensor g0 = gather(p, make<int64_t>({2, 2, 0, 1}, {2, 2}), 0);
  EXPECT_EQ(g0.shape(), Shape({2, 2, 4}));
  EXPECT_EQ(g0.to_vector<double>(), pick(p, {8, 9, 10, 11, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7}));
  Tensor gb = gather(p, make<int32_t>({1, 0, 3}, {3, 1}), 1, 1);  // row b picks p[b, idx[b]]
  EXPECT_EQ(gb.shape(), Shape({3, 1}));
  EXPECT_EQ(gb.to_vector<double>(), pick(p, {1, 4, 11}));
  Tensor nd = gather_nd(p, make<int32_t>({2, 1, 0, 3}, {2, 2}));
  EXPECT_EQ(nd.to_vector<double>(), pick(p, {9, 3}));
  Tensor nd1 = gather_nd(p, make<int8_t>({1}, {1, 1}));  // i8 indices are widened
  EXPECT_EQ(nd1.shape(), Shape({1, 4}));
  EXPECT_EQ(nd1.to_vector<double>(), pick(p, {4, 5, 6, 7}));
}

TEST_P(IndexEveryDtype, OneHotOutputs) {
  DType dt = GetParam();
  Tensor o = one_hot(make<int64_t>({2, -1, 0, 7}, {4}), 3, 1, 0, dt);
  EXPECT_EQ(o.dtype(), dt);
  EXPECT_EQ(o.shape(), Shape({4, 3}));
  EXPECT_EQ(o.to_vector<double>(), (std::vector<double>{0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0}));
}

TEST_P(IndexEveryDtype, ScatterAddAndTopK) {
  DType dt = GetParam();
  Tensor x = seq({4}, dt);
  Tensor idx = make<int32_t>({1, 3, 1}, {3});
  if (dt == DType::kBool) {
    EXPECT_KILN_ERROR(scatter_add(x, idx, seq({3}, dt)), kInvalidArgument, "numeric");
    EXPECT_KILN_ERROR(top_k(x, 1), kInvalidArgument, "numeric");
    return;
  }
  Tensor u = Tensor::from_vector<double>({10, 20, 30}, {3}).to(dt);
  Tensor s = scatter_add(x, idx, u);
  EXPECT_EQ(s.dtype(), dt);
  EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{0, 1 + 10 + 30, 2, 3 + 20}));
  Tensor v = Tensor::from_vector<double>({3, 7, 7, 1, 9, 3}, {2, 3}).to(dt);
  TopK t = top_k(v, 2);
  EXPECT_EQ(t.values.dtype(), dt);
  EXPECT_EQ(t.indices.dtype(), DType::kI64);
  EXPECT_EQ(t.values.to_vector<double>(), (std::vector<double>{7, 7, 9, 3}));
  EXPECT_EQ(t.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 1, 2}));
}

INSTANTIATE_TEST_SUITE_P(All, IndexEveryDtype, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- semantics ------------------------------------------------------------------------

double indexing_dot(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// <gather(x, i), u> == <x, scatter_add(0, i, u)> for every axis, with duplicates.
TEST(IndexSemantics, ScatterAddIsTheAdjointOfGather) {
  Tensor x = rand_tensor({4, 5, 6}, DType::kF64, -1, 1, 11);
  Tensor idx = make<int64_t>({0, 2, 2, 1, 0, 2}, {2, 3});
  for (int64_t axis = 0; axis < 3; ++axis) {
    SCOPED_TRACE("axis " + std::to_string(axis));
    Tensor g = gather(x, idx, axis);
    Tensor u = rand_tensor(g.shape(), DType::kF64, -1, 1, 12 + axis);
    Tensor s = scatter_add(Tensor::zeros(x.shape(), DType::kF64), idx, u, axis);
    EXPECT_NEAR(indexing_dot(g, u), indexing_dot(x, s), 1e-12);
  }
  // bf16 accumulates duplicates in f32: 256 + 1 + 1 stays exact there (not in bf16 steps).
  Tensor b = scatter_add(Tensor::zeros({1}, DType::kBF16), make<int32_t>({0, 0, 0}, {3}),
                         make<float>({256, 1, 1}, {3}));
  EXPECT_EQ(b.dtype(), DType::kBF16);
  EXPECT_EQ(b.to_vector<float>()[0], 258.0f);
}

TEST(IndexSemantics, LargeGatherAndScatter) {
  Tensor p = rand_tensor({300, 257}, DType::kF32, -1, 1, 2);
  std::vector<int32_t> iv;
  for (int i = 0; i < 1000; ++i) iv.push_back((i * 37) % 300);
  Tensor idx = make<int32_t>(iv, {1000});
  Tensor g = gather(p, idx, 0);
  std::vector<float> pv = p.to_vector<float>(), gv = g.to_vector<float>();
  bool ok = true;
  for (int i = 0; i < 1000; ++i)
    for (int j = 0; j < 257; ++j) ok &= gv[i * 257 + j] == pv[iv[i] * 257 + j];
  EXPECT_TRUE(ok);
  Tensor s = scatter_add(Tensor::zeros({300, 257}), idx, Tensor::zeros({1000, 257}) + 1.0);
  std::vector<float> sv = s.to_vector<float>();
  std::vector<int> count(300, 0);
  for (int32_t i : iv) ++count[i];
  ok = true;
  for (int r = 0; r < 300; ++r) ok &= sv[r * 257 + 100] == static_cast<float>(count[r]);
  EXPECT_TRUE(ok);
}

TEST(IndexSemantics, TopKOrderTiesAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Tensor x = make<float>({1, nan, inf, 5, nan, 5, -inf}, {7});
  TopK t = top_k(x, 5);
  EXPECT_EQ(t.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 2, 3, 5}));
  std::vector<float> v = t.values.to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]));
  EXPECT_EQ(v[2], inf);
  TopK u = top_k(x, 3, false);  // same set, position order
  EXPECT_EQ(u.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 4}));
  TopK z = top_k(make<int32_t>({4, 4, 4}, {1, 3}), 0);
  EXPECT_EQ(z.values.shape(), Shape({1, 0}));
  TopK all = top_k(make<int32_t>({2, 9, 2, 9, -1}, {5}), 5);
  EXPECT_EQ(all.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 0, 2, 4}));
  // Long rows exercise the partial-sort and selection paths.
  Tensor big = rand_tensor({3, 1000}, DType::kF32, 0, 50, 4).to(DType::kI32);
  for (int64_t k : {int64_t{5}, int64_t{100}, int64_t{600}}) {
    TopK b = top_k(big, k);
    std::vector<int32_t> bv = big.to_vector<int32_t>(), vv = b.values.to_vector<int32_t>();
    std::vector<int64_t> iv = b.indices.to_vector<int64_t>();
    bool ok = true;
    for (int r = 0; r < 3; ++r)
      for (int64_t j = 0; j < k; ++j) {
        ok &= vv[r * k + j] == bv[r * 1000 + iv[r * k + j]];
        const int64_t a = r * k + j - 1, b = r * k + j;  // consecutive outputs: descending, ties by index
        if (j) ok &= vv[a] > vv[b] || (vv[a] == vv[b] && iv[a] < iv[b]);
      }
    EXPECT_TRUE(ok) << "k = " << k;
  }
}

TEST(IndexSemantics, OneHotAxesAndEmpty) {
  Tensor o = one_hot(make<int32_t>({1, 0}, {2}), 2, 1, 0, DType::kI64, 0);
  EXPECT_EQ(o.shape(), Shape({2, 2}));
  EXPECT_EQ(o.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(one_hot(make<int32_t>({}, {0, 3}), 4).shape(), Shape({0, 3, 4}));
  EXPECT_EQ(one_hot(make<int32_t>({1}, {1}), 0).shape(), Shape({1, 0}));
  Tensor h = one_hot(make<uint8_t>({2}, {1}), 3, 0.5, 0.25, DType::kF16);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{0.25f, 0.25f, 0.5f}));
}

// ---- errors -----------------------------------------------------------------------------

TEST(IndexErrors, OutOfRangeIndices) {
  Tensor p = Tensor::zeros({3, 5});
  EXPECT_KILN_ERROR(gather(p, make<int32_t>({0, 5}, {2}), 1), kOutOfRange,
                    "indices[1] = 5 is out of range [0, 5) for axis 1");
  EXPECT_KILN_ERROR(gather(p, make<int64_t>({0, 1, -1, 2}, {2, 2}), 0), kOutOfRange, "indices[1, 0] = -1");
  EXPECT_KILN_ERROR(gather_nd(p, make<int32_t>({2, 5}, {1, 2})), kOutOfRange,
                    "indices[0, 1] = 5 is out of range [0, 5) for dimension 1");
  EXPECT_KILN_ERROR(scatter_add(p, make<int32_t>({3}, {1}), Tensor::zeros({1, 5})), kOutOfRange,
                    "indices[0] = 3 is out of range [0, 3)");
  EXPECT_KILN_ERROR(gather(Tensor::zeros({0, 2}), make<int32_t>({0}, {1})), kOutOfRange, "[0, 0)");
}

TEST(IndexErrors, BadShapesAndDtypes) {
  Tensor p = Tensor::zeros({3, 5});
  EXPECT_KILN_ERROR(gather(p, make<float>({0}, {1})), kInvalidArgument, "indices must be integers, got f32");
  EXPECT_KILN_ERROR(gather(p, make<int32_t>({0}, {1}), 2), kOutOfRange, "gather axis");
  EXPECT_KILN_ERROR(gather(Tensor::zeros({}), make<int32_t>({0}, {1})), kInvalidArgument, "rank >= 1");
  EXPECT_KILN_ERROR(gather(p, make<int32_t>({0, 0}, {2, 1}), 1, 1), kInvalidArgument,
                    "batch dimension 0 differs: params [3, 5] vs indices [2, 1]");
  EXPECT_KILN_ERROR(gather(p, make<int32_t>({0, 0, 0}, {3, 1}), 0, 1), kInvalidArgument, "must be >= batch_dims");
  EXPECT_KILN_ERROR(gather(p, make<int32_t>({0}, {1}), 0, 2), kInvalidArgument, "batch_dims 2 is outside");
  EXPECT_KILN_ERROR(gather_nd(p, make<int32_t>({0, 0, 0}, {1, 3})), kInvalidArgument, "address 3 dimensions");
  EXPECT_KILN_ERROR(gather_nd(p, make<int32_t>({0}, {})), kInvalidArgument, "rank >= 1");
  EXPECT_KILN_ERROR(scatter_add(p, make<int32_t>({0, 1}, {2}), Tensor::zeros({2, 4})), kInvalidArgument,
                    "updates must have shape [2, 5]");
  EXPECT_KILN_ERROR(one_hot(make<float>({0}, {1}), 3), kInvalidArgument, "integers");
  EXPECT_KILN_ERROR(one_hot(make<int32_t>({0}, {1}), -1), kInvalidArgument, "depth must be >= 0");
  EXPECT_KILN_ERROR(one_hot(make<int32_t>({0}, {1}), 3, 1, 0, DType::kF32, 2), kOutOfRange, "one_hot axis");
  EXPECT_KILN_ERROR(top_k(p, 6), kInvalidArgument, "k must be in [0, 5]");
  EXPECT_KILN_ERROR(top_k(p, -1), kInvalidArgument, "got -1");
  EXPECT_KILN_ERROR(top_k(Tensor::zeros({}), 1), kInvalidArgument, "rank >= 1");
  EXPECT_KILN_ERROR(gather(p, Tensor()), kInvalidArgument, "undefined");
}

// index_copy: rows replaced (a repeated index: the last row), any dtype, in place into
// x's own buffer, errors.
TEST(IndexCopy, ReplacesRowsCopyingOrInPlace) {
  const Tensor x = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  const Tensor rows = Tensor::from_vector<float>({10, 11, 20, 21, 30, 31}, {3, 2});
  const Tensor got = index_copy(x, Tensor::from_vector<int32_t>({3, 0, 3}, {3}), rows);
  EXPECT_EQ(got.to_vector<float>(), (std::vector<float>{20, 21, 2, 3, 4, 5, 30, 31}));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));  // x unchanged
  const Tensor h = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {3, 2}).to(DType::kF16);
  const Tensor same = index_copy(h, Tensor::from_vector<int64_t>({1}, {1}), Tensor::from_vector<float>({9, 8}, {1, 2}), true);
  EXPECT_TRUE(same.is_same(h));
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{0, 1, 9, 8, 4, 5}));  // rows cast to f16, written into h
  const Tensor b = index_copy(Tensor::from_vector<bool>({false, false, false}, {3}), Tensor::from_vector<int32_t>({2}, {1}),
                              Tensor::from_vector<bool>({true}, {1}));
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{false, false, true}));
  // Nothing to copy: x itself (a copy of it).
  EXPECT_EQ(index_copy(x, Tensor::from_vector<int32_t>({}, {0}), Tensor::zeros({0, 2})).to_vector<float>(), x.to_vector<float>());
}

TEST(IndexCopy, BadInputsAreTypedErrors) {
  const Tensor x = Tensor::zeros({4, 2});
  const Tensor one = Tensor::zeros({1, 2});
  EXPECT_KILN_ERROR(index_copy(x, Tensor::from_vector<int32_t>({4}, {1}), one), kOutOfRange, "index_copy");
  EXPECT_KILN_ERROR(index_copy(x, Tensor::from_vector<int32_t>({-1}, {1}), one), kOutOfRange, "index_copy");
  EXPECT_KILN_ERROR(index_copy(x, Tensor::from_vector<int32_t>({1}, {1}), Tensor::zeros({1, 3})), kInvalidArgument,
                    "rows must be f32 [1, 2]");
  EXPECT_KILN_ERROR(index_copy(x, Tensor::from_vector<int32_t>({1, 2}, {1, 2}), one), kInvalidArgument, "rank 1");
  EXPECT_KILN_ERROR(index_copy(Tensor::scalar<float>(1), Tensor::from_vector<int32_t>({0}, {1}), one), kInvalidArgument,
                    "rank >= 1");
  EXPECT_KILN_ERROR(index_copy(x, Tensor::from_vector<float>({1}, {1}), one), kInvalidArgument, "index_copy");
}

TEST(IndexCopy, OnCudaMatchesTheCpu) {
  Backend* be = find_backend(DeviceType::kCUDA);
  if (!be) GTEST_SKIP() << "no CUDA backend: " << backend_unavailable_reason(DeviceType::kCUDA);
  if (be->device_count() == 0) GTEST_SKIP() << "no CUDA device: " << be->no_device_reason();
  const Device cuda{DeviceType::kCUDA, 0};
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kU8}) {
    const Tensor x = (arange(24.0) + 0.0).to(dt).reshape({8, 3});
    const Tensor rows = (arange(9.0) + 100.0).to(dt).reshape({3, 3});
    const Tensor idx = Tensor::from_vector<int32_t>({6, 1, 4}, {3});
    const Tensor want = index_copy(x, idx, rows);
    EXPECT_TRUE(array_equal(index_copy(x.to(cuda), idx.to(cuda), rows.to(cuda)).to(Device::cpu()), want)) << dtype_name(dt);
    Tensor on = x.to(cuda);
    index_copy(on, idx.to(cuda), rows.to(cuda), true);
    EXPECT_TRUE(array_equal(on.to(Device::cpu()), want)) << dtype_name(dt) << " in place";
  }
}

}  // namespace
}  // namespace kiln::testing
