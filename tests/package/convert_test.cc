// kiln convert's library half: optimised graphs, 16-bit weights, int8 PTQ. The
// references are the source package's answers.
#include <filesystem>

#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/file_io.h"
#include "kiln/core/op_def.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_file.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "kiln/package/convert.h"
#include "kiln/package/export.h"
#include "kiln/package/saved_model.h"
#include "test_util.h"

namespace kiln::package {
namespace {
namespace fs = std::filesystem;
using testing::rand_tensor;

using kiln::testing::TempDir;

ConvertOptions with_precision(const std::string& p) {
  ConvertOptions o;
  o.precision = p;
  return o;
}

// A small CNN + MLP head with weights big enough to be lowered (>= 1024 elements).
struct Net {
  Variable k1{rand_tensor({3, 3, 1, 8}, DType::kF32, -0.5, 0.5, 1), "conv/kernel"};
  Variable c1{rand_tensor({8}, DType::kF32, -0.1, 0.1, 2), "conv/bias"};
  Variable w1{rand_tensor({8 * 4 * 4, 64}, DType::kF32, -0.2, 0.2, 3), "dense/kernel"};
  Variable b1{rand_tensor({64}, DType::kF32, -0.1, 0.1, 4), "dense/bias"};
  Variable w2{rand_tensor({64, 5}, DType::kF32, -0.3, 0.3, 5), "out/kernel"};
  std::vector<Tensor> operator()(const std::vector<Tensor>& x) const {
    Tensor h = ops::relu(ops::conv2d(x[0], k1.value(), {.strides = {2, 2}, .padding = "same"}, c1.value()));
    h = ops::reshape(h, {-1, 8 * 4 * 4});
    h = ops::relu(ops::add(ops::matmul(h, w1.value()), b1.value()));
    return {ops::softmax(ops::matmul(h, w2.value()), -1)};
  }
};

std::string export_net(const Net& n, const std::string& base) {
  ExportSignature s;
  s.fn = [&n](const std::vector<Tensor>& x) { return n(x); };
  s.inputs = {{"image", {{-1, 8, 8, 1}, DType::kF32}}};
  s.output_names = {"probs"};
  const std::string labels = base + "-labels.txt";
  write_file_atomic(labels, "a\nb\n");
  ExportOptions o;
  o.assets = {labels};
  o.metadata.model_name = "net";
  return export_package(base, {s}, o);
}

Tensor run(const std::string& dir, const Tensor& x) {
  return SavedModel::load(dir)->run("serving_default", std::vector<Tensor>{x})[0];
}

TEST(ConvertTest, Fp32StoresTheOptimisedGraphWithTheSameAnswers) {
  TempDir tmp("convert");
  Net n;
  const std::string src = export_net(n, tmp.path() + "/m");
  convert_package(src, tmp.path() + "/m/2", with_precision("fp32"));
  auto m = SavedModel::load(tmp.path() + "/m/2");
  EXPECT_EQ(m->metadata().precision, "fp32");
  EXPECT_EQ(m->metadata().converted_from, src);
  EXPECT_EQ(m->metadata().model_name, "net");
  EXPECT_EQ(read_file(m->dir() + "/assets/m-labels.txt"), "a\nb\n");
  Tensor x = rand_tensor({3, 8, 8, 1}, DType::kF32, 0, 1, 9);
  EXPECT_CLOSE(run(tmp.path() + "/m/2", x), n({x})[0], 1e-5, 1e-6);
}

TEST(ConvertTest, SixteenBitWeightsHalveTheFileAndRoundOnce) {
  TempDir tmp("convert");
  Net n;
  const std::string src = export_net(n, tmp.path() + "/m");
  Tensor x = rand_tensor({4, 8, 8, 1}, DType::kF32, 0, 1, 9);
  for (const char* p : {"bf16", "fp16"}) {
    const std::string out = tmp.path() + "/" + p;
    ConvertReport r = convert_package(src, out, with_precision(p));
    EXPECT_EQ(r.weights_lowered, 1);  // dense/kernel: 8192 elements; the others are < 1024
    TensorFile w = load_tensor_file(out + "/variables.safetensors");
    const Tensor* k = w.find("dense/kernel");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->dtype(), std::string(p) == "bf16" ? DType::kBF16 : DType::kF16);
    EXPECT_EQ(w.find("out/kernel")->dtype(), DType::kF32);  // 320 elements: stays f32
    // The reference: the same net with dense/kernel rounded to 16 bits.
    Net rounded = n;
    rounded.w1 = Variable(n.w1.peek().to(k->dtype()).to(DType::kF32), "dense/kernel");
    EXPECT_CLOSE(run(out, x), rounded({x})[0], 1e-5, 1e-6);
    EXPECT_EQ(SavedModel::load(out)->metadata().precision, p);
  }
}

TEST(ConvertTest, Int8QuantizesMatmulsAndConvsWithinQuantizationError) {
  if (!OpRegistry::global().find("qlinear_matmul")) GTEST_FAIL() << "no int8 kernels in this build";
  TempDir tmp("convert");
  Net n;
  const std::string src = export_net(n, tmp.path() + "/m");
  ConvertOptions o = with_precision("int8");
  for (uint64_t b = 0; b < 4; ++b) o.calibration.push_back({{"image", rand_tensor({16, 8, 8, 1}, DType::kF32, 0, 1, 20 + b)}});
  ConvertReport r = convert_package(src, tmp.path() + "/q", o);
  EXPECT_EQ(r.nodes_quantized, 3);  // conv, dense, out
  EXPECT_EQ(r.calibration_batches, 4);
  auto m = SavedModel::load(tmp.path() + "/q");
  EXPECT_EQ(m->graph("serving_default").count_ops("qlinear_conv2d"), 1);
  EXPECT_EQ(m->graph("serving_default").count_ops("qlinear_matmul"), 2);
  TensorFile w = load_tensor_file(tmp.path() + "/q/variables.safetensors");
  ASSERT_NE(w.find("dense/kernel/int8"), nullptr);
  EXPECT_EQ(w.find("dense/kernel/int8")->dtype(), DType::kI8);
  Tensor x = rand_tensor({32, 8, 8, 1}, DType::kF32, 0, 1, 99);
  Tensor want = n({x})[0], got = m->run("serving_default", std::vector<Tensor>{x})[0];
  const double err = ops::max(ops::abs(ops::sub(got, want))).item<double>();
  EXPECT_LT(err, 0.03) << "int8 probabilities drift too far from f32";
  EXPECT_GT(err, 0.0) << "nothing was quantized?";
  const double agree = ops::mean(ops::cast(ops::equal(ops::argmax(got, -1), ops::argmax(want, -1)), DType::kF32)).item<double>();
  EXPECT_GE(agree, 0.9);
}

// conv -> pool -> conv -> pool -> dense: kiln convert chains the int8 layers, so u8
// activations flow from each quantised layer through the pooling into the next.
struct PoolNet {
  Variable k1{rand_tensor({3, 3, 1, 8}, DType::kF32, -0.5, 0.5, 11), "conv/kernel"};
  Variable k2{rand_tensor({3, 3, 8, 16}, DType::kF32, -0.3, 0.3, 12), "conv_1/kernel"};
  Variable c2{rand_tensor({16}, DType::kF32, -0.1, 0.1, 13), "conv_1/bias"};
  Variable w{rand_tensor({2 * 2 * 16, 5}, DType::kF32, -0.3, 0.3, 14), "dense/kernel"};
  std::vector<Tensor> operator()(const std::vector<Tensor>& x) const {
    Tensor h = ops::max_pool2d(ops::relu(ops::conv2d(x[0], k1.value(), {.padding = "same"})), {2, 2}, {2, 2});
    h = ops::max_pool2d(ops::relu(ops::conv2d(h, k2.value(), {.padding = "same"}, c2.value())), {2, 2}, {2, 2});
    return {ops::softmax(ops::matmul(ops::reshape(h, {-1, 2 * 2 * 16}), w.value()), -1)};
  }
};

TEST(ConvertTest, Int8LayersPassU8ActivationsThroughPooling) {
  if (!OpRegistry::global().find("qlinear_matmul")) GTEST_FAIL() << "no int8 kernels in this build";
  TempDir tmp("convert");
  PoolNet n;
  ExportSignature sig;
  sig.fn = [&n](const std::vector<Tensor>& x) { return n(x); };
  sig.inputs = {{"image", {{-1, 8, 8, 1}, DType::kF32}}};
  sig.output_names = {"probs"};
  const std::string src = export_package(tmp.path() + "/m", {sig}, ExportOptions{});
  ConvertOptions o = with_precision("int8");
  for (uint64_t b = 0; b < 4; ++b) o.calibration.push_back({{"image", rand_tensor({16, 8, 8, 1}, DType::kF32, 0, 1, 40 + b)}});
  EXPECT_EQ(convert_package(src, tmp.path() + "/q", o).nodes_quantized, 3);
  auto m = SavedModel::load(tmp.path() + "/q");
  const graph::Graph& g = m->graph("serving_default");
  int u8_quantised = 0, u8_pools = 0;
  for (const graph::Node& node : g.nodes) {
    if (node.kind != graph::NodeKind::kOp || node.outputs[0].dtype != DType::kU8) continue;
    u8_quantised += node.op->name == "qlinear_conv2d" || node.op->name == "qlinear_matmul";
    u8_pools += node.op->name == "max_pool2d";
  }
  EXPECT_EQ(u8_quantised, 2);  // both convolutions; the dense layer feeds the f32 softmax
  EXPECT_EQ(u8_pools, 2);
  Tensor x = rand_tensor({32, 8, 8, 1}, DType::kF32, 0, 1, 98);
  Tensor want = n({x})[0], got = m->run("serving_default", std::vector<Tensor>{x})[0];
  EXPECT_LT(ops::max(ops::abs(ops::sub(got, want))).item<double>(), 0.03);
  const double agree = ops::mean(ops::cast(ops::equal(ops::argmax(got, -1), ops::argmax(want, -1)), DType::kF32)).item<double>();
  EXPECT_GE(agree, 0.9);
}

TEST(ConvertTest, BadRequests) {
  TempDir tmp("convert");
  Net n;
  const std::string src = export_net(n, tmp.path() + "/m");
  EXPECT_KILN_ERROR(convert_package(src, tmp.path() + "/x", with_precision("int4")), kInvalidArgument,
                    "unknown precision 'int4'");
  EXPECT_KILN_ERROR(convert_package(src, src, with_precision("fp32")), kFailedPrecondition, "exists already");
  if (OpRegistry::global().find("qlinear_matmul")) {
    EXPECT_KILN_ERROR(convert_package(src, tmp.path() + "/y", with_precision("int8")), kInvalidArgument,
                      "needs calibration batches");
    ConvertOptions o = with_precision("int8");
    o.calibration.push_back({{"image", rand_tensor({2, 9, 9, 1}, DType::kF32)}});
    EXPECT_KILN_ERROR(convert_package(src, tmp.path() + "/y", o), kInvalidArgument,
                      "calibration input 'image' of signature 'serving_default' must be f32[-1, 8, 8, 1]");
  }
  EXPECT_KILN_ERROR(convert_package(tmp.path() + "/none", tmp.path() + "/z", {}), kNotFound, "no such directory");
  EXPECT_FALSE(fs::exists(tmp.path() + "/x") || fs::exists(tmp.path() + "/y") || fs::exists(tmp.path() + "/z"));
}

}  // namespace
}  // namespace kiln::package
