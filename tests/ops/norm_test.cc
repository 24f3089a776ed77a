// Batch, layer and RMS normalisation against NumPy references, numerical
// properties, and typed errors.
#include <cmath>

#include "kiln/ops/nn.h"
#include "op_table.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;


OpFn bn_inf(double eps, int64_t axis) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{batch_norm_inference(in[0], in[1], in[2], in[3], in[4], eps, axis)};
  };
}
OpFn bn_train(double eps, int64_t axis) {
  return [=](const std::vector<Tensor>& in) {
    BatchNormTrainingResult r = batch_norm_training(in[0], in[1], in[2], eps, axis);
    return std::vector<Tensor>{r.y, r.mean, r.var};
  };
}
OpFn ln(int64_t begin) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{layer_norm(in[0], in[1], in[2], 1e-5, begin)};
  };
}

std::vector<OpCase> norm_cases() {
  return {
      {"bn_inference_nhwc", bn_inf(1e-3, -1), kFloatDtypes, 5},
      {"bn_inference_nchw", bn_inf(1e-3, 1), kFloatDtypes, 5},
      {"bn_inference_2d", bn_inf(1e-3, 1), kFloatDtypes, 5},
      {"bn_training_nhwc", bn_train(1e-3, 3), kFloatDtypes, 5},
      {"bn_training_nchw", bn_train(1e-3, 1), kFloatDtypes, 5},
      {"bn_training_2d", bn_train(1e-3, -1), kFloatDtypes, 5},
      {"layer_norm_last", ln(-1), kFloatDtypes, 5},
      {"layer_norm_begin1", ln(1), kFloatDtypes, 5},
      {"layer_norm_wide", ln(2), kFloatDtypes, 5},
      {"rms_norm", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(in[0], in[1], 1e-6)}; },
       kFloatDtypes, 5},
  };
}

class NormOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(NormOps, MatchesNumpy) { run_op_case("nn", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, NormOps, ::testing::ValuesIn(norm_cases()), [](const auto& i) { return i.param.name; });
KILN_CUDA_OP_TABLE(NormOps, "nn", norm_cases());

// Per-row mean and (biased) variance of a [rows, d] tensor, in double.
void row_moments(const Tensor& t, int64_t d, std::vector<double>& mean, std::vector<double>& var) {
  std::vector<double> v = t.to_vector<double>();
  int64_t rows = static_cast<int64_t>(v.size()) / d;
  mean.assign(rows, 0);
  var.assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < d; ++i) mean[r] += v[r * d + i] / d;
    for (int64_t i = 0; i < d; ++i) var[r] += (v[r * d + i] - mean[r]) * (v[r * d + i] - mean[r]) / d;
  }
}

TEST(LayerNorm, WithoutAffineGivesZeroMeanUnitVariance) {
  Tensor x = rand_tensor({6, 1000}, DType::kF32, -50, 150, 3);
  Tensor y = layer_norm(x, Tensor(), Tensor(), 1e-5);
  std::vector<double> m, v;
  row_moments(y, 1000, m, v);
  for (size_t r = 0; r < m.size(); ++r) {
    EXPECT_NEAR(m[r], 0, 1e-5);
    EXPECT_NEAR(v[r], 1, 1e-4);
  }
}

TEST(BatchNormTraining, LargeOffsetKeepsVarianceAccurate) {
  // Two-pass statistics: a mean of 1000 with spread ~1 must not lose the variance.
  Tensor x = rand_tensor({4096, 8}, DType::kF64, 999, 1001, 5);
  BatchNormTrainingResult r32 = batch_norm_training(x.to(DType::kF32), Tensor(), Tensor(), 1e-5, -1);
  BatchNormTrainingResult r64 = batch_norm_training(x, Tensor(), Tensor(), 1e-5, -1);
  EXPECT_EQ(r32.mean.shape(), Shape{8});
  EXPECT_CLOSE(r32.mean, r64.mean, 1e-6, 0);
  EXPECT_CLOSE(r32.var, r64.var, 2e-3, 0);  // x itself is rounded to f32 (ulp ~6e-5 at 1000)
  for (double v : r64.var.to_vector<double>()) EXPECT_NEAR(v, 1.0 / 3, 0.03);  // uniform on [-1, 1)
  EXPECT_CLOSE(r32.y, r64.y, 1e-3, 1e-3);
}

TEST(BatchNormTraining, NchwMatchesInferenceWithItsOwnStatistics) {
  Tensor x = rand_tensor({3, 5, 7, 9}, DType::kF64, -2, 3, 9);
  Tensor g = rand_tensor({5}, DType::kF64, 0.5, 1.5, 10), b = rand_tensor({5}, DType::kF64, -1, 1, 11);
  BatchNormTrainingResult r = batch_norm_training(x, g, b, 1e-3, 1);
  EXPECT_CLOSE(r.y, batch_norm_inference(x, r.mean, r.var, g, b, 1e-3, 1), 1e-12, 1e-12);
}

TEST(BatchNormInference, F32ParamsServe16BitInputs) {
  Tensor x = rand_tensor({4, 6}, DType::kF16, -1, 1, 2);
  Tensor mean = rand_tensor({6}, DType::kF32, -1, 1, 3), var = rand_tensor({6}, DType::kF32, 0.5, 1, 4);
  Tensor y = batch_norm_inference(x, mean, var, Tensor(), Tensor(), 1e-5, -1);
  EXPECT_EQ(y.dtype(), DType::kF16);
  Tensor ref = batch_norm_inference(x.to(DType::kF32), mean, var, Tensor(), Tensor(), 1e-5, -1);
  EXPECT_CLOSE(y, ref, 2e-3, 2e-3);
}

TEST(RmsNorm, UnitGammaGivesUnitRootMeanSquare) {
  Tensor x = rand_tensor({5, 64}, DType::kF64, -3, 3, 8);
  std::vector<double> y = rms_norm(x, Tensor(), 0).to_vector<double>();
  for (int r = 0; r < 5; ++r) {
    double ms = 0;
    for (int i = 0; i < 64; ++i) ms += y[r * 64 + i] * y[r * 64 + i] / 64;
    EXPECT_NEAR(ms, 1, 1e-12);
  }
}

TEST(NormErrors, TypedErrors) {
  Tensor x = Tensor::zeros({2, 3, 4});
  Tensor c4 = Tensor::zeros({4}), c3 = Tensor::zeros({3});
  EXPECT_KILN_ERROR(batch_norm_inference(x, c3, c4, c4, c4), kInvalidArgument, "mean must have shape [4], got [3]");
  EXPECT_KILN_ERROR(batch_norm_inference(x, c3, c3, c3, c3, 1e-5, 5), kOutOfRange, "axis");
  EXPECT_KILN_ERROR(batch_norm_inference(x, c4, c4, c4, c4, -1.0), kInvalidArgument, "eps must be finite and >= 0");
  EXPECT_KILN_ERROR(batch_norm_inference(x, c4, Tensor(), c4, c4), kInvalidArgument, "var is undefined");
  EXPECT_KILN_ERROR(batch_norm_training(x, c4, c3), kInvalidArgument, "beta must have shape [4]");
  EXPECT_KILN_ERROR(batch_norm_training(Tensor::scalar<float>(1), Tensor(), Tensor()), kInvalidArgument, "rank >= 1");
  EXPECT_KILN_ERROR(layer_norm(x, Tensor::zeros({3, 4}), Tensor()), kInvalidArgument,
                    "gamma must have shape [4], got [3, 4]");
  EXPECT_KILN_ERROR(layer_norm(x, Tensor(), Tensor(), 1e-5, 3), kOutOfRange, "begin_axis");
  EXPECT_KILN_ERROR(rms_norm(x, c3), kInvalidArgument, "gamma must have shape [4]");
}

}  // namespace
}  // namespace kiln::testing
