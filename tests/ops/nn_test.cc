// softmax / log_softmax, scaled dot-product attention, dropout and embedding:
// NumPy references, properties, determinism, and typed errors.
#include <cmath>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/parallel.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/random.h"
#include "kiln/ops/shape.h"
#include "op_table.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;


OpFn sm(int64_t axis, bool log) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{log ? log_softmax(in[0], axis) : softmax(in[0], axis)};
  };
}

std::vector<OpCase> softmax_cases() {
  std::vector<OpCase> v;
  for (bool log : {false, true}) {
    std::string p = log ? "log_softmax" : "softmax";
    v.push_back({p + "_last", sm(-1, log), kFloatDtypes, 5});
    v.push_back({p + "_middle", sm(1, log), kFloatDtypes, 5});
    v.push_back({p + "_axis0", sm(0, log), kFloatDtypes, 5});
    v.push_back({p + "_large", sm(-1, log), kFloatDtypes, 5});
  }
  return v;
}

class SoftmaxOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(SoftmaxOps, MatchesNumpy) { run_op_case("nn", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, SoftmaxOps, ::testing::ValuesIn(softmax_cases()),
                         [](const auto& i) { return i.param.name; });
KILN_CUDA_OP_TABLE(SoftmaxOps, "nn", softmax_cases());

OpFn attn(bool causal, std::optional<double> scale = std::nullopt) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{
        scaled_dot_product_attention(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), causal, scale)};
  };
}

std::vector<OpCase> attention_cases() {
  return {
      {"attn_basic", attn(false), kFloatDtypes, 10},
      {"attn_causal", attn(true), kFloatDtypes, 10},
      {"attn_causal_lq_gt_lk", attn(true), kFloatDtypes, 10},
      {"attn_bool_mask", attn(false), kFloatDtypes, 10},
      {"attn_float_mask_causal", attn(true), kFloatDtypes, 10},
      {"attn_broadcast_kv", attn(false), kFloatDtypes, 10},
      {"attn_causal_tiles", attn(true), kFloatDtypes, 10},
      {"attn_scale_3d", attn(false, 0.5), kFloatDtypes, 10},
  };
}

class AttentionOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(AttentionOps, MatchesNumpy) { run_op_case("nn", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, AttentionOps, ::testing::ValuesIn(attention_cases()),
                         [](const auto& i) { return i.param.name; });
KILN_CUDA_OP_TABLE(AttentionOps, "nn", attention_cases());

// ---- softmax properties -------------------------------------------------------------------

TEST(Softmax, RowsSumToOneWithoutOverflow) {
  Tensor x = rand_tensor({7, 513}, DType::kF32, -5000, 5000, 4);
  std::vector<float> y = softmax(x).to_vector<float>();
  for (int r = 0; r < 7; ++r) {
    double s = 0;
    for (int i = 0; i < 513; ++i) {
      ASSERT_TRUE(std::isfinite(y[r * 513 + i]));
      s += y[r * 513 + i];
    }
    EXPECT_NEAR(s, 1, 1e-5);
  }
  std::vector<float> ls = log_softmax(x).to_vector<float>();
  for (float v : ls) ASSERT_TRUE(std::isfinite(v) && v <= 0);
}

TEST(Softmax, IntegerInputComputesInF32) {
  Tensor y = softmax(make<int32_t>({0, 0, 0, 0}, {4}));
  EXPECT_EQ(y.dtype(), DType::kF32);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(4, 0.25f));
}

TEST(SoftmaxErrors, TypedErrors) {
  EXPECT_KILN_ERROR(softmax(Tensor::zeros({2, 3}), 2), kOutOfRange, "softmax axis 2 is out of range for rank 2");
  EXPECT_KILN_ERROR(log_softmax(Tensor::zeros({2, 3}), -3), kOutOfRange, "log_softmax axis -3");
  EXPECT_KILN_ERROR(softmax(Tensor::scalar<float>(1)), kInvalidArgument, "rank >= 1");
}

// ---- attention beyond the fixtures ---------------------------------------------------------

TEST(Attention, F32FusedKernelMatchesF64OnLargeShapes) {
  // Several query tiles, GQA-style broadcast of k/v over heads, causal and masked.
  Tensor q = rand_tensor({2, 4, 200, 64}, DType::kF64, -1, 1, 41);
  Tensor k = rand_tensor({2, 1, 300, 64}, DType::kF64, -1, 1, 42);
  Tensor v = rand_tensor({2, 1, 300, 32}, DType::kF64, -1, 1, 43);
  Tensor mask = rand_tensor({200, 300}, DType::kF64, -2, 0, 44);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Tensor ref = scaled_dot_product_attention(q, k, v, mask, causal);
    EXPECT_EQ(ref.shape(), (Shape{2, 4, 200, 32}));
    Tensor got = scaled_dot_product_attention(q.to(DType::kF32), k.to(DType::kF32), v.to(DType::kF32),
                                              mask.to(DType::kF32), causal);
    EXPECT_CLOSE(got, ref, 1e-4, 1e-5);
  }
}

TEST(Attention, ComposesLikeSoftmaxOfScores) {
  // Lq = 1 decoding step: the result is softmax(q k^T / sqrt(d)) v, computed by hand.
  Tensor q = rand_tensor({1, 4}, DType::kF64, -1, 1, 51), k = rand_tensor({3, 4}, DType::kF64, -1, 1, 52);
  Tensor v = rand_tensor({3, 2}, DType::kF64, -1, 1, 53);
  std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  std::vector<double> s(3);
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 4; ++i) s[j] += qv[i] * kv[j * 4 + i] / 2.0;
  }
  Tensor p = softmax(Tensor::from_vector<double>(s, {3}));
  std::vector<double> pv = p.to_vector<double>(), want(2);
  for (int j = 0; j < 3; ++j)
    for (int c = 0; c < 2; ++c) want[c] += pv[j] * vv[j * 2 + c];
  EXPECT_CLOSE(scaled_dot_product_attention(q, k, v), Tensor::from_vector<double>(want, {1, 2}), 1e-12, 1e-14);
}

TEST(Attention, FullyMaskedRowIsZeroAndIntegerMaskIsBool) {
  Tensor q = rand_tensor({2, 4}, DType::kF32, -1, 1, 61), k = rand_tensor({3, 4}, DType::kF32, -1, 1, 62);
  Tensor v = rand_tensor({3, 5}, DType::kF32, -1, 1, 63);
  Tensor m = make<int32_t>({1, 0, 1, 0, 0, 0}, {2, 3});
  std::vector<float> y = scaled_dot_product_attention(q, k, v, m).to_vector<float>();
  for (int c = 0; c < 5; ++c) EXPECT_EQ(y[5 + c], 0.f);
  Tensor mb = make<bool>({true, false, true, false, false, false}, {2, 3});
  EXPECT_TRUE(array_equal(scaled_dot_product_attention(q, k, v, mb), scaled_dot_product_attention(q, k, v, m)));
}

TEST(AttentionErrors, TypedErrors) {
  Tensor q = Tensor::zeros({2, 5, 8}), k = Tensor::zeros({2, 7, 8}), v = Tensor::zeros({2, 7, 6});
  EXPECT_KILN_ERROR(scaled_dot_product_attention(Tensor::zeros({8}), k, v), kInvalidArgument,
                    "q must have rank >= 2");
  EXPECT_KILN_ERROR(scaled_dot_product_attention(q, Tensor::zeros({2, 7, 4}), v), kInvalidArgument,
                    "q and k must have the same last dim");
  EXPECT_KILN_ERROR(scaled_dot_product_attention(q, k, Tensor::zeros({2, 6, 6})), kInvalidArgument,
                    "k and v must have the same key length");
  EXPECT_KILN_ERROR(scaled_dot_product_attention(q, Tensor::zeros({3, 7, 8}), Tensor::zeros({3, 7, 6})),
                    kInvalidArgument, "broadcast");
  EXPECT_KILN_ERROR(scaled_dot_product_attention(q, k, v, Tensor::zeros({5, 6})), kInvalidArgument,
                    "does not broadcast to the scores' shape [2, 5, 7]");
  EXPECT_KILN_ERROR(scaled_dot_product_attention(q, k, v, Tensor(), false, NAN), kInvalidArgument,
                    "scale must be finite");
}

// ---- dropout --------------------------------------------------------------------------------

TEST(Dropout, InvertedScalingAndRate) {
  const double rate = 0.3;
  Tensor x = rand_tensor({1000, 100}, DType::kF32, 0.5, 1.5, 71);
  Tensor y = dropout(x, rate, 1234);
  std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  int64_t dropped = 0;
  const float scale = static_cast<float>(1.0 / (1.0 - rate));
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0) {
      ++dropped;
    } else {
      ASSERT_EQ(yv[i], xv[i] * scale) << "at " << i;
    }
  }
  // 100000 Bernoulli(0.3) draws: sd ~ 0.00145.
  EXPECT_NEAR(static_cast<double>(dropped) / xv.size(), rate, 0.008);
}

TEST(Dropout, MaskIsPhiloxOfTheSeed) {
  const double rate = 0.5;
  const uint64_t seed = 0xdeadbeefcafe1234ull;  // above 2^63: stored bitwise
  Tensor x = Tensor::from_vector<float>(std::vector<float>(1001, 1.f), {7, 11, 13});
  std::vector<float> y = dropout(x, rate, seed).to_vector<float>();
  for (int64_t i = 0; i < 1001; ++i) {
    bool keep = uint_to_unit_float(Philox::block(seed, 0, static_cast<uint64_t>(i / 4))[i % 4]) >= rate;
    ASSERT_EQ(y[i], keep ? 2.f : 0.f) << "element " << i;
  }
}

TEST(Dropout, DeterministicAcrossThreadCountsAndDtypes) {
  Tensor x = rand_tensor({512, 1024}, DType::kF32, -1, 1, 81);
  int saved = num_threads();
  set_num_threads(1);
  Tensor a = dropout(x, 0.25, 99);
  set_num_threads(4);
  Tensor b = dropout(x, 0.25, 99);
  set_num_threads(saved);
  EXPECT_TRUE(array_equal(a, b));
  EXPECT_FALSE(array_equal(a, dropout(x, 0.25, 100)));
  // Same mask for other dtypes.
  std::vector<float> af = a.to_vector<float>();
  std::vector<double> d = dropout(x.to(DType::kF64), 0.25, 99).to_vector<double>();
  std::vector<float> h = dropout(x.to(DType::kBF16), 0.25, 99).to_vector<float>();
  for (size_t i = 0; i < af.size(); ++i) {
    ASSERT_EQ(af[i] == 0, d[i] == 0) << i;
    ASSERT_EQ(af[i] == 0, h[i] == 0) << i;
  }
}

TEST(Dropout, RateZeroOrInferenceIsIdentity) {
  Tensor x = rand_tensor({3, 4}, DType::kF32, -1, 1, 91);
  EXPECT_TRUE(dropout(x, 0.0, 1).is_same(x));
  EXPECT_TRUE(dropout(x, 0.9, 1, false).is_same(x));
}

TEST(DropoutErrors, RateMustBeInHalfOpenUnitInterval) {
  Tensor x = Tensor::zeros({4});
  EXPECT_KILN_ERROR(dropout(x, 1.0, 1), kInvalidArgument, "dropout: rate must be in [0, 1), got 1");
  EXPECT_KILN_ERROR(dropout(x, -0.1, 1), kInvalidArgument, "rate must be in [0, 1)");
  EXPECT_KILN_ERROR(dropout(x, NAN, 1), kInvalidArgument, "rate must be in [0, 1)");
  EXPECT_KILN_ERROR(dropout(x, 1.5, 1, false), kInvalidArgument, "rate must be in [0, 1)");
}

// ---- embedding ------------------------------------------------------------------------------

TEST(Embedding, GathersRows) {
  Tensor table = make<float>({0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32}, {4, 3});
  Tensor ids = make<int64_t>({3, 0, 1, 3}, {2, 2});
  Tensor y = embedding(table, ids);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{30, 31, 32, 0, 1, 2, 10, 11, 12, 30, 31, 32}));
  Tensor t3 = make<int32_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  Tensor y3 = embedding(t3, make<int32_t>({1}, {1}));
  EXPECT_EQ(y3.shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(y3.to_vector<int32_t>(), (std::vector<int32_t>{5, 6, 7, 8}));
  Tensor s = embedding(table.to(DType::kBF16), make<int32_t>({2}, {}));
  EXPECT_EQ(s.shape(), Shape{3});
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{20, 21, 22}));
}

TEST(EmbeddingErrors, OutOfRangeIdsAndBadDtypes) {
  Tensor table = Tensor::zeros({5, 3});
  EXPECT_KILN_ERROR(embedding(table, make<int64_t>({0, 5}, {2})), kOutOfRange,
                    "id 5 (at flat position 1 of ids [2]) is out of range for a table of 5 rows");
  EXPECT_KILN_ERROR(embedding(table, make<int32_t>({-1}, {1})), kOutOfRange, "id -1");
  EXPECT_KILN_ERROR(embedding(table, make<float>({0}, {1})), kInvalidArgument, "ids must be i32 or i64, got f32");
  EXPECT_KILN_ERROR(embedding(Tensor::scalar<float>(1), make<int32_t>({0}, {1})), kInvalidArgument,
                    "table must have rank >= 1");
}

// ---- registry flags ---------------------------------------------------------------------------

TEST(NnOps, AreRegisteredDifferentiableWithCpuKernels) {
  for (const char* name : {"softmax", "log_softmax", "conv2d", "conv2d_backward_data", "conv2d_backward_filter",
                           "max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d",
                           "batch_norm_inference", "batch_norm_training", "layer_norm", "rms_norm", "dropout",
                           "embedding", "scaled_dot_product_attention"}) {
    SCOPED_TRACE(name);
    const OpDef& d = OpRegistry::global().get(name);
    EXPECT_EQ(d.differentiable, Differentiable::kYes);
    EXPECT_FALSE(d.doc.empty());
    for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16})
      EXPECT_NE(d.kernel(DeviceType::kCPU, t), nullptr) << dtype_name(t);
  }
}

// ---- paged_attention ------------------------------------------------------------------

// Two sequences over a pool of 6 blocks of 3 positions (non-contiguous block tables,
// grouped-query heads), five queries at various positions, against a float64 loop;
// window > 0: each query sees its last `window` positions only; softcap > 0: scores capped.
struct PagedCase {
  Tensor q, k, v, tables, seqs, pos;
  std::vector<double> want;  // [T, H, d]
};
PagedCase paged_case(DType q_dtype, DType kv_dtype, int64_t window = 0, double softcap = 0) {
  const int64_t T = 5, H = 4, d = 8, N = 6, B = 3, hkv = 2;
  PagedCase c;
  c.q = random_normal({T, H, d}, 0, 1, DType::kF32, 11).to(q_dtype);
  c.k = random_normal({N, B, hkv, d}, 0, 1, DType::kF32, 12).to(kv_dtype);
  c.v = random_normal({N, B, hkv, d}, 0, 1, DType::kF32, 13).to(kv_dtype);
  const std::vector<int32_t> tables = {4, 1, 5, 0, 2, 0}, seqs = {0, 0, 1, 1, 0}, pos = {7, 8, 0, 4, 2};
  c.tables = Tensor::from_vector(tables, {2, 3});
  c.seqs = Tensor::from_vector(seqs, {T});
  c.pos = Tensor::from_vector(pos, {T});
  const std::vector<float> q = c.q.to_vector<float>(), k = c.k.to_vector<float>(), v = c.v.to_vector<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / (H / hkv), n = pos[static_cast<size_t>(t)] + 1, lo = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      std::vector<double> sc(static_cast<size_t>(n));
      double mx = -1e300, sum = 0;
      auto at = [&](int64_t p) { return ((tables[static_cast<size_t>(seqs[static_cast<size_t>(t)] * 3 + p / B)] * B + p % B) * hkv + kh) * d; };
      for (int64_t p = lo; p < n; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(q[static_cast<size_t>((t * H + h) * d + i)]) * k[static_cast<size_t>(at(p) + i)];
        sc[static_cast<size_t>(p)] = dot / std::sqrt(static_cast<double>(d));
        if (softcap > 0) sc[static_cast<size_t>(p)] = softcap * std::tanh(sc[static_cast<size_t>(p)] / softcap);
        mx = std::max(mx, sc[static_cast<size_t>(p)]);
      }
      for (int64_t p = lo; p < n; ++p) sum += sc[static_cast<size_t>(p)] = std::exp(sc[static_cast<size_t>(p)] - mx);
      for (int64_t i = 0; i < d; ++i) {
        double o = 0;
        for (int64_t p = lo; p < n; ++p) o += sc[static_cast<size_t>(p)] / sum * v[static_cast<size_t>(at(p) + i)];
        c.want.push_back(o);
      }
    }
  return c;
}

void expect_paged_matches(Device device, DType q_dtype, DType kv_dtype, double tol, int64_t window = 0,
                          double softcap = 0) {
  const PagedCase c = paged_case(q_dtype, kv_dtype, window, softcap);
  const Tensor got = paged_attention(c.q.to(device), c.k.to(device), c.v.to(device), c.tables.to(device), c.seqs.to(device),
                                     c.pos.to(device), std::nullopt, window, softcap);
  ASSERT_EQ(got.shape(), c.q.shape());
  ASSERT_EQ(got.dtype(), q_dtype);
  const std::vector<float> g = got.to(Device::cpu()).to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(g[i] - c.want[i]));
  EXPECT_LT(worst, tol) << device.str() << " q " << dtype_name(q_dtype) << " cache " << dtype_name(kv_dtype);
}

TEST(PagedAttention, MatchesAFloat64LoopOverTheBlockTables) {
  expect_paged_matches(Device::cpu(), DType::kF32, DType::kF32, 1e-5);
  expect_paged_matches(Device::cpu(), DType::kF32, DType::kF16, 1e-5);  // the same f16 values in the reference
  expect_paged_matches(Device::cpu(), DType::kBF16, DType::kF16, 2e-2);  // the output rounded to bf16
  expect_paged_matches(Device::cpu(), DType::kF16, DType::kBF16, 4e-3);
  // Sliding windows: 3 positions (queries at 7 and 8 see 5-7 and 6-8, one block's
  // boundary crossed), 1 (itself only), and one longer than every sequence (all).
  for (const int64_t window : {3, 1, 100}) expect_paged_matches(Device::cpu(), DType::kF32, DType::kF16, 1e-5, window);
  // Gemma 2's soft cap (scores of ~N(0, 1) here, so a cap of 0.5 bends most of them).
  expect_paged_matches(Device::cpu(), DType::kF32, DType::kF16, 1e-5, 0, 0.5);
  expect_paged_matches(Device::cpu(), DType::kF32, DType::kF16, 1e-5, 3, 0.5);
  const PagedCase c = paged_case(DType::kF32, DType::kF16);
  const Tensor all = paged_attention(c.q, c.k, c.v, c.tables, c.seqs, c.pos);
  const Tensor windowed = paged_attention(c.q, c.k, c.v, c.tables, c.seqs, c.pos, std::nullopt, 3);
  EXPECT_NE(all.to_vector<float>(), windowed.to_vector<float>());  // (the window changes something)
  const Tensor capped = paged_attention(c.q, c.k, c.v, c.tables, c.seqs, c.pos, std::nullopt, 0, 0.5);
  EXPECT_NE(all.to_vector<float>(), capped.to_vector<float>());
}

TEST(PagedAttention, BadInputsAreTypedErrors) {
  const PagedCase c = paged_case(DType::kF32, DType::kF16);
  auto call = [&](const Tensor& q, const Tensor& k, const Tensor& tables, const Tensor& seqs, const Tensor& pos) {
    return paged_attention(q, k, k, tables, seqs, pos);
  };
  EXPECT_KILN_ERROR(call(reshape(c.q, {5, 32}), c.k, c.tables, c.seqs, c.pos), kInvalidArgument, "[T, H, d]");
  EXPECT_KILN_ERROR(call(reshape(c.q, {5, 2, 16}), c.k, c.tables, c.seqs, c.pos), kInvalidArgument, "head sizes");
  EXPECT_KILN_ERROR(call(c.q, reshape(c.k, {4, 3, 3, 8}), c.tables, c.seqs, c.pos), kInvalidArgument, "multiple of Hkv");
  EXPECT_KILN_ERROR(paged_attention(c.q, c.k, c.v.to(DType::kF32), c.tables, c.seqs, c.pos), kInvalidArgument, "v_cache");
  EXPECT_KILN_ERROR(call(c.q, c.k, c.tables.to(DType::kI64), c.seqs, c.pos), kInvalidArgument, "block_tables must be i32");
  EXPECT_KILN_ERROR(call(c.q, c.k, c.tables, c.seqs.to(DType::kI64), c.pos), kInvalidArgument, "seq_ids and positions");
  EXPECT_KILN_ERROR(call(c.q.to(DType::kF64), c.k, c.tables, c.seqs, c.pos), kInvalidArgument, "f32, f16 or bf16");
  EXPECT_KILN_ERROR(paged_attention(c.q, c.k, c.v, c.tables, c.seqs, c.pos, std::nullopt, -1), kInvalidArgument,
                    "window must be >= 0");
  EXPECT_KILN_ERROR(paged_attention(c.q, c.k, c.v, c.tables, c.seqs, c.pos, std::nullopt, 0, -1.0), kInvalidArgument,
                    "softcap must be");
  EXPECT_KILN_ERROR(call(c.q, c.k, c.tables, Tensor::from_vector<int32_t>({0, 0, 2, 1, 0}, {5}), c.pos), kOutOfRange,
                    "names sequence 2");
  EXPECT_KILN_ERROR(call(c.q, c.k, c.tables, c.seqs, Tensor::from_vector<int32_t>({7, 9, 0, 4, 2}, {5})), kOutOfRange,
                    "position 9");
  EXPECT_KILN_ERROR(call(c.q, c.k, Tensor::from_vector<int32_t>({4, 1, 6, 0, 2, 0}, {2, 3}), c.seqs, c.pos), kOutOfRange,
                    "the cache has 6 blocks");
}

TEST(PagedAttention, OnCudaMatchesTheReference) {
  Backend* b = find_backend(DeviceType::kCUDA);
  if (!b) GTEST_SKIP() << "no CUDA backend: " << backend_unavailable_reason(DeviceType::kCUDA);
  if (b->device_count() == 0) GTEST_SKIP() << "no CUDA device: " << b->no_device_reason();
  const Device cuda{DeviceType::kCUDA, 0};
  expect_paged_matches(cuda, DType::kF32, DType::kF32, 1e-5);
  expect_paged_matches(cuda, DType::kF32, DType::kF16, 1e-5);
  expect_paged_matches(cuda, DType::kBF16, DType::kF16, 2e-2);
  expect_paged_matches(cuda, DType::kF16, DType::kBF16, 4e-3);
  for (const int64_t window : {3, 1}) expect_paged_matches(cuda, DType::kF32, DType::kF16, 1e-5, window);
  expect_paged_matches(cuda, DType::kF32, DType::kF16, 1e-5, 3, 0.5);
}

}  // namespace
}  // namespace kiln::testing
