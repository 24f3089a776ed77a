// export_model: trained Keras-style models as packages; the reference is the model's
// own predict() on the same inputs.
#include <filesystem>
#include <set>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "kiln/package/saved_model.h"
#include "kiln/train.h"
#include "test_util.h"

namespace kiln::train {
namespace {
namespace fs = std::filesystem;
using kiln::testing::rand_tensor;
namespace L = layers;

using kiln::testing::TempDir;

TEST(ExportTest, SequentialAfterFitMatchesPredictAndRecordsLineage) {
  TempDir tmp("export");
  auto model = std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(16, "relu"), L::Dense(3)});
  model->compile({optimizers::Adam({0.01}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
  Tensor x = rand_tensor({64, 5}, DType::kF32, -1, 1, 1);
  Tensor y = ops::cast(ops::argmax(ops::slice(x, {0, 0}, {64, 3}), -1), DType::kI32);
  FitOptions fo;
  fo.epochs = 2;
  fo.batch_size = 16;
  fo.verbose = 0;
  model->fit(x, y, fo);

  ModelExportOptions o;
  o.classify_signature = true;
  o.softmax_outputs = true;
  o.metadata.training_data = "random";
  auto pkg = package::SavedModel::load(export_model(*model, tmp.path(), o));
  const auto& sig = pkg->signature("serving_default");
  ASSERT_EQ(sig.inputs.size(), 1u);
  EXPECT_EQ(sig.inputs[0].name, "dense_input");  // Keras' names
  EXPECT_EQ(sig.inputs[0].spec.shape, (std::vector<int64_t>{-1, 5}));
  EXPECT_EQ(sig.outputs[0].name, "dense_1");
  Tensor probs = ops::softmax(model->predict(x), -1);
  EXPECT_CLOSE(pkg->run("serving_default", {{"dense_input", x}}).at("dense_1"), probs, 1e-5, 1e-6);
  auto cl = pkg->run("classify", {{"dense_input", x}});
  EXPECT_CLOSE(cl.at("classes"), ops::argmax(probs, -1), 0, 0);
  // Weights under their model paths; lineage from fit.
  const auto& g = pkg->graph("serving_default");
  std::set<std::string> names;
  for (const auto& n : g.nodes)
    if (n.kind == graph::NodeKind::kConstant) names.insert(n.name);
  EXPECT_TRUE(names.count("dense/kernel")) << *names.begin();
  const auto& md = pkg->metadata();
  EXPECT_EQ(md.model_name, model->name());
  EXPECT_EQ(md.training_data, "random");
  EXPECT_EQ(md.hyperparameters.at("optimizer"), "adam");
  EXPECT_EQ(md.hyperparameters.at("epochs"), "2");
  EXPECT_EQ(md.hyperparameters.at("batch_size"), "16");
  EXPECT_EQ(md.hyperparameters.at("loss"), "sparse_categorical_crossentropy");
  EXPECT_TRUE(md.metrics.count("loss") && md.metrics.count("accuracy"));
}

TEST(ExportTest, FunctionalMultiInputOutputWithNormalizationAndDropout) {
  TempDir tmp("export");
  SymbolicTensor img = Input({8, 8, 1}, DType::kF32, "image");
  SymbolicTensor meta = Input({3}, DType::kF32, "meta");
  SymbolicTensor h = L::Conv2D(4, {3, 3}, {.padding = "same"})(img);
  h = L::BatchNormalization()(h);
  h = L::MaxPool2D()(h);
  h = L::Flatten()(h);
  h = L::Dropout(0.5)(h);
  SymbolicTensor joined = L::Concatenate()(std::vector<SymbolicTensor>{h, meta});
  SymbolicTensor cls = L::Dense(4, "linear", "cls")(joined);
  SymbolicTensor reg = L::Dense(1, "linear", "reg")(L::LayerNormalization()(joined));
  auto model = Model::functional({img, meta}, {cls, reg});
  auto pkg = package::SavedModel::load(export_model(*model, tmp.path()));
  const auto& sig = pkg->signature("serving_default");
  ASSERT_EQ(sig.inputs.size(), 2u);
  EXPECT_EQ(sig.inputs[0].name, "image");
  EXPECT_EQ(sig.inputs[1].name, "meta");
  EXPECT_EQ(sig.inputs[0].spec.shape, (std::vector<int64_t>{-1, 8, 8, 1}));
  ASSERT_EQ(sig.outputs.size(), 2u);
  EXPECT_EQ(sig.outputs[0].name, "cls");
  EXPECT_EQ(sig.outputs[1].name, "reg");
  for (int64_t b : {1, 5}) {
    Tensor xi = rand_tensor({b, 8, 8, 1}, DType::kF32, -1, 1, 2), xm = rand_tensor({b, 3}, DType::kF32, -1, 1, 3);
    auto want = model->predict(std::vector<Tensor>{xi, xm});
    auto got = pkg->run("serving_default", {{"image", xi}, {"meta", xm}});
    EXPECT_CLOSE(got.at("cls"), want[0], 1e-5, 1e-5);
    EXPECT_CLOSE(got.at("reg"), want[1], 1e-5, 1e-5);
  }
}

TEST(ExportTest, MixedPrecisionModelExportsFloat32Outputs) {
  TempDir tmp("export");
  set_global_policy("mixed_bfloat16");
  auto model = std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(8, "relu"), L::Dense(2)}, Shape{4});
  set_global_policy("float32");
  auto pkg = package::SavedModel::load(export_model(*model, tmp.path()));
  EXPECT_EQ(pkg->signature("serving_default").outputs[0].spec.dtype, DType::kF32);
  Tensor x = rand_tensor({3, 4}, DType::kF32, -1, 1, 4);
  EXPECT_CLOSE(pkg->run("serving_default", std::vector<Tensor>{x})[0], model->predict(x), 1e-6, 1e-6);
}

TEST(ExportTest, IntegerInputsAndErrors) {
  TempDir tmp("export");
  auto unbuilt = std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(2)});
  EXPECT_KILN_ERROR(export_model(*unbuilt, tmp.path()), kFailedPrecondition, "is not built");
  // A Sequential that starts with an Embedding takes integer ids: say so.
  auto emb = std::make_shared<Sequential>(std::vector<LayerPtr>{L::Embedding(10, 4), L::Flatten(), L::Dense(2)});
  Tensor ids = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor want = emb->predict(ids);
  ModelExportOptions o;
  o.input_specs = std::vector<TensorSpec>{{{-1, 3}, DType::kI32}};
  auto pkg = package::SavedModel::load(export_model(*emb, tmp.path(), o));
  EXPECT_CLOSE(pkg->run("serving_default", std::vector<Tensor>{ids})[0], want, 1e-6, 1e-6);
  o.input_specs = std::vector<TensorSpec>{{{-1, 3}, DType::kI32}, {{-1, 3}, DType::kI32}};
  EXPECT_KILN_ERROR(export_model(*emb, tmp.path(), o), kInvalidArgument, "input_specs has 2 specs, the model has 1");
}

}  // namespace
}  // namespace kiln::train
