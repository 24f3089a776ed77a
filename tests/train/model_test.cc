// Model: Sequential/functional construction, summary, fit/evaluate/predict, callbacks,
// reproducibility and crash recovery (BackupAndRestore).
#include "kiln/train/model.h"

#include <filesystem>
#include <fstream>

#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/metrics.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "kiln/train/layers.h"
#include "test_util.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;
namespace L = layers;
using kiln::testing::rand_tensor;

// Two Gaussian-ish blobs per class in 8-d: learnable to ~100% by a small MLP.
struct Toy {
  Tensor x, y;
};
Toy toy_data(int64_t n, uint64_t seed) {
  Tensor x = rand_tensor({n, 8}, DType::kF32, -1, 1, seed);
  std::vector<float> xv = x.to_vector<float>();
  std::vector<int32_t> yv(n);
  for (int64_t i = 0; i < n; ++i) {
    float s = xv[i * 8] + xv[i * 8 + 1] - xv[i * 8 + 2];
    yv[i] = s > 0.3f ? 2 : (s < -0.3f ? 0 : 1);
  }
  return {x, Tensor::from_vector<int32_t>(yv, {n})};
}

ModelPtr small_mlp(uint64_t seed) {
  set_seed(seed);
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(16, "relu"), L::Dense(3)}, Shape{8});
  m->compile({optimizers::Adam({0.01}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}});
  return m;
}

std::vector<std::vector<float>> weights_of(const Model& m) {
  std::vector<std::vector<float>> w;
  for (const Variable& v : m.weights()) w.push_back(v.peek().to_vector<float>());
  return w;
}

TEST(Sequential, SummaryMatchesKerasParamCounts) {
  set_seed(1);
  Sequential mlp({L::Dense(256, "relu"), L::Dense(128, "relu"), L::Dense(10)}, Shape{784}, "mlp");
  std::string s = mlp.summary();
  EXPECT_NE(s.find("Model: \"mlp\""), std::string::npos) << s;
  EXPECT_NE(s.find("dense (Dense)"), std::string::npos) << s;
  EXPECT_NE(s.find("dense_1 (Dense)"), std::string::npos) << s;
  EXPECT_NE(s.find("dense_2 (Dense)"), std::string::npos) << s;
  EXPECT_NE(s.find("(None, 256)"), std::string::npos) << s;
  EXPECT_NE(s.find("200960"), std::string::npos) << s;
  EXPECT_NE(s.find("Total params: 235,146"), std::string::npos) << s;
  EXPECT_NE(s.find("Non-trainable params: 0"), std::string::npos) << s;
  EXPECT_EQ(mlp.count_params(), 235146);
}

TEST(Sequential, CnnParamCounts) {
  set_seed(1);
  L::Conv2DOptions same;
  same.padding = "same";
  Sequential cnn({L::Conv2D(32, {3, 3}, same), L::MaxPool2D(), L::Conv2D(64, {3, 3}, same), L::MaxPool2D(),
                  L::Flatten(), L::Dense(128, "relu"), L::Dense(10)},
                 Shape{28, 28, 1});
  // Keras: 320 + 18496 + 401536 + 1290.
  EXPECT_EQ(cnn.count_params(), 320 + 18496 + 401536 + 1290);
  EXPECT_NE(cnn.summary().find("(None, 7, 7, 64)"), std::string::npos) << cnn.summary();
}

TEST(Functional, MultiInputMultiOutputWithResidual) {
  set_seed(3);
  auto a = Input({8}, DType::kF32, "a");
  auto b = Input({4}, DType::kF32, "b");
  auto h = L::Dense(8, "relu")(L::Concatenate()({a, b}));
  auto r = L::Add()({a, h});  // residual
  auto out1 = L::Dense(3, "linear", "logits")(r);
  auto out2 = L::Dense(1, "linear", "score")(h);
  auto model = Model::functional({a, b}, {out1, out2}, "two_heads");
  EXPECT_EQ(out1.shape().dim(0), -1);
  EXPECT_EQ(out1.shape().dim(1), 3);
  std::string s = model->summary();
  EXPECT_NE(s.find("Connected to"), std::string::npos) << s;
  EXPECT_NE(s.find("a, dense"), std::string::npos) << s;

  model->compile({optimizers::Adam({0.01}),
                  {losses::SparseCategoricalCrossentropy(true), losses::MeanSquaredError()},
                  {},
                  {1.0, 0.5}});
  Toy t = toy_data(256, 5);
  Tensor xb = rand_tensor({256, 4}, DType::kF32, -1, 1, 6);
  Tensor score = ops::sum(xb, {1}, true);
  Logs before = model->evaluate({t.x, xb}, {t.y, score});
  model->fit({t.x, xb}, {t.y, score}, {.epochs = 15, .batch_size = 32, .verbose = 0});
  Logs after = model->evaluate({t.x, xb}, {t.y, score});
  EXPECT_LT(after["loss"], before["loss"] * 0.5);
  auto preds = model->predict({t.x, xb}, 100);
  ASSERT_EQ(preds.size(), 2u);
  EXPECT_EQ(preds[0].shape(), Shape({256, 3}));
  EXPECT_EQ(preds[1].shape(), Shape({256, 1}));
}

TEST(Functional, InputNotListedIsAnError) {
  auto a = Input({4});
  auto b = Input({4});
  auto y = L::Add()({a, b});
  EXPECT_KILN_ERROR(Model::functional({a}, {y}), kInvalidArgument, "not among the model's inputs");
}

TEST(Fit, LearnsAndReportsHistory) {
  auto m = small_mlp(7);
  Toy t = toy_data(512, 8);
  History h = m->fit(t.x, t.y, {.epochs = 20, .batch_size = 32, .validation_split = 0.25, .verbose = 0});
  ASSERT_EQ(h.at("loss").size(), 20u);
  EXPECT_LT(h.at("loss").back(), h.at("loss").front() * 0.5);
  EXPECT_GT(h.at("accuracy").back(), 0.9);
  EXPECT_EQ(h.at("val_loss").size(), 20u);
  EXPECT_GT(h.at("val_accuracy").back(), 0.85);
  EXPECT_GT(h.at("samples_per_sec").back(), 0);
}

TEST(Fit, SameSeedSameRun) {
  Toy t = toy_data(200, 9);
  auto m1 = small_mlp(11);
  History h1 = m1->fit(t.x, t.y, {.epochs = 3, .batch_size = 16, .shuffle_seed = 4, .verbose = 0});
  auto m2 = small_mlp(11);
  History h2 = m2->fit(t.x, t.y, {.epochs = 3, .batch_size = 16, .shuffle_seed = 4, .verbose = 0});
  EXPECT_EQ(h1.at("loss"), h2.at("loss"));
  EXPECT_EQ(weights_of(*m1), weights_of(*m2));
  auto m3 = small_mlp(12);
  EXPECT_NE(weights_of(*m1), weights_of(*m3));
}

TEST(Fit, BadInputsAreTypedErrors) {
  set_seed(1);
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(3)}, Shape{8});
  Toy t = toy_data(10, 1);
  EXPECT_KILN_ERROR(m->fit(t.x, t.y), kFailedPrecondition, "compile");
  m->compile({optimizers::SGD(), {losses::SparseCategoricalCrossentropy(true)}});
  Tensor y_short = ops::slice(t.y, {0}, {5});
  EXPECT_KILN_ERROR(m->fit(t.x, y_short, {.verbose = 0}), kInvalidArgument, "5 samples");
  EXPECT_KILN_ERROR(m->fit(t.x, t.y, {.batch_size = 0, .verbose = 0}), kInvalidArgument, "batch_size");
  Tensor wrong = ops::zeros({10, 7});
  EXPECT_ANY_THROW(m->fit(wrong, t.y, {.verbose = 0}));
  EXPECT_KILN_ERROR(m->compile({nullptr, {losses::MeanSquaredError()}}), kInvalidArgument, "optimizer");
}

TEST(Callbacks, EarlyStoppingStops) {
  auto m = small_mlp(2);
  Toy t = toy_data(64, 3);
  // A monitor that can never improve by 10 after the first epoch: stops after patience + 1 epochs.
  History h = m->fit(t.x, t.y, {.epochs = 50, .batch_size = 16, .callbacks = {callbacks::EarlyStopping("loss", 10, 2)},
                                .verbose = 0});
  EXPECT_EQ(h.at("loss").size(), 4u);
}

TEST(Callbacks, LearningRateSchedulerAndCsvLogger) {
  auto m = small_mlp(2);
  Toy t = toy_data(64, 3);
  kiln::testing::TempDir tmp("model_csv");
  const std::string& dir = tmp.path();
  std::string csv = dir + "/log.csv";
  History h = m->fit(t.x, t.y,
                     {.epochs = 3, .batch_size = 16,
                      .callbacks = {callbacks::LearningRateScheduler([](int e, double) { return 0.1 / (e + 1); }),
                                    callbacks::CSVLogger(csv)},
                      .verbose = 0});
  EXPECT_NEAR(h.at("learning_rate")[0], 0.1, 1e-12);
  EXPECT_NEAR(h.at("learning_rate")[2], 0.1 / 3, 1e-12);
  std::ifstream in(csv);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("epoch,", 0), 0u) << header;
  EXPECT_NE(header.find("loss"), std::string::npos);
  int rows = 0;
  while (std::getline(in, line)) ++rows;
  EXPECT_EQ(rows, 3);
}

TEST(Callbacks, PrometheusMetricsCountStepsSamplesAndEpochs) {
  auto m = small_mlp(2);
  Toy t = toy_data(70, 3);  // batches of 16: 4 full and one of 6, per epoch
  Metrics metrics;
  History h = m->fit(t.x, t.y, {.epochs = 3, .batch_size = 16, .callbacks = {callbacks::PrometheusMetrics(metrics)},
                                .verbose = 0});
  const std::string text = metrics.render();
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << "no '" << line << "' in\n" << text;
  };
  has("# TYPE kiln_train_steps_total counter");
  has("kiln_train_steps_total 15");
  has("kiln_train_samples_total 210");
  has("kiln_train_running 0");
  has("kiln_train_epoch 3");
  has("kiln_train_step_seconds_count 15");
  has("# TYPE kiln_train_step_seconds histogram");
  has("# TYPE kiln_train_input_wait_seconds_total counter");
  EXPECT_NE(text.find("kiln_train_epoch_metric{name=\"loss\"} "), std::string::npos);
  EXPECT_NE(text.find("kiln_train_epoch_metric{name=\"samples_per_sec\"} "), std::string::npos);
  EXPECT_EQ(metrics.gauge("kiln_train_loss", "", {}).at({}).value(), h.at("loss").back());
}

TEST(Callbacks, ModelCheckpointSavesLoadableWeights) {
  auto m = small_mlp(2);
  Toy t = toy_data(64, 3);
  kiln::testing::TempDir tmp("model_mc");
  const std::string& dir = tmp.path();
  m->fit(t.x, t.y, {.epochs = 2, .batch_size = 16,
                    .callbacks = {callbacks::ModelCheckpoint(dir + "/w-{epoch}.ckpt", "loss")}, .verbose = 0});
  EXPECT_TRUE(fs::exists(dir + "/w-1.ckpt"));
  ASSERT_TRUE(fs::exists(dir + "/w-2.ckpt"));
  auto fresh = small_mlp(99);
  fresh->load_weights(dir + "/w-2.ckpt");
  EXPECT_EQ(weights_of(*fresh), weights_of(*m));
  EXPECT_EQ(fresh->optimizer()->iterations(), m->optimizer()->iterations());
}

TEST(State, LoadRejectsMismatchedCheckpointBeforeAssigning) {
  auto m = small_mlp(2);
  auto before = weights_of(*m);
  CheckpointData d = m->state();
  d.tensors[1].second = ops::zeros({3});
  EXPECT_KILN_ERROR(m->load_state(d), kInvalidArgument, "expects");
  EXPECT_EQ(weights_of(*m), before);
  CheckpointData missing;
  EXPECT_KILN_ERROR(m->load_state(missing), kNotFound, "model/dense/kernel");
}

// Simulates a crash: throws from a batch callback.
struct Crash : std::runtime_error {
  Crash() : std::runtime_error("crash") {}
};
class CrashAt : public Callback {
 public:
  explicit CrashAt(int64_t at) : at_(at) {}
  void on_train_batch_end(int64_t, Logs&) override {
    if (++n_ == at_) throw Crash();
  }

 private:
  int64_t at_, n_ = 0;
};

TEST(BackupAndRestore, ResumedRunEqualsUninterruptedRun) {
  Toy t = toy_data(160, 21);
  FitOptions fo{.epochs = 3, .batch_size = 16, .shuffle_seed = 5, .verbose = 0};
  auto ref = small_mlp(31);
  ref->fit(t.x, t.y, fo);

  kiln::testing::TempDir tmp("model_bar");
  const std::string& dir = tmp.path();
  auto crashed = small_mlp(31);
  FitOptions f1 = fo;
  f1.callbacks = {callbacks::BackupAndRestore(dir, /*save_freq=*/4), std::make_shared<CrashAt>(14)};
  EXPECT_THROW(crashed->fit(t.x, t.y, f1), Crash);  // 10 batches per epoch: dies in epoch 2
  EXPECT_FALSE(fs::is_empty(dir));

  auto resumed = small_mlp(77);  // different init: everything must come from the backup
  FitOptions f2 = fo;
  f2.callbacks = {callbacks::BackupAndRestore(dir, 4)};
  History h = resumed->fit(t.x, t.y, f2);
  EXPECT_EQ(h.at("loss").size(), 2u);  // epochs 2 and 3
  EXPECT_EQ(weights_of(*resumed), weights_of(*ref));
  EXPECT_EQ(resumed->optimizer()->iterations(), ref->optimizer()->iterations());
  EXPECT_TRUE(fs::is_empty(dir)) << "backups are deleted after a completed run";
}

TEST(BackupAndRestore, CorruptedNewestBackupFallsBackToPrevious) {
  Toy t = toy_data(160, 21);
  FitOptions fo{.epochs = 2, .batch_size = 16, .shuffle_seed = 5, .verbose = 0};
  auto ref = small_mlp(31);
  ref->fit(t.x, t.y, fo);

  kiln::testing::TempDir tmp("model_bar2");
  const std::string& dir = tmp.path();
  auto crashed = small_mlp(31);
  FitOptions f1 = fo;
  f1.callbacks = {callbacks::BackupAndRestore(dir, 3), std::make_shared<CrashAt>(13)};
  EXPECT_THROW(crashed->fit(t.x, t.y, f1), Crash);
  // Truncate the newest backup.
  std::vector<std::string> paths = CheckpointManager(dir, 2, "backup").checkpoints();
  ASSERT_EQ(paths.size(), 2u);
  std::vector<fs::path> files(paths.begin(), paths.end());
  fs::resize_file(files.back(), fs::file_size(files.back()) / 2);

  auto resumed = small_mlp(77);
  FitOptions f2 = fo;
  f2.callbacks = {callbacks::BackupAndRestore(dir, 3)};
  ::testing::internal::CaptureStderr();
  resumed->fit(t.x, t.y, f2);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(files.back().filename().string()), std::string::npos) << err;
  EXPECT_EQ(weights_of(*resumed), weights_of(*ref));
}

}  // namespace
}  // namespace kiln::train

namespace kiln::train {
namespace {

std::string slurp_events(const std::string& dir) {
  std::string all;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      std::ifstream in(e.path(), std::ios::binary);
      all += std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
  return all;
}

TEST(Callbacks, TensorBoardWritesTrainAndValidationScalars) {
  auto m = small_mlp(2);
  Toy t = toy_data(64, 3);
  kiln::testing::TempDir tmp("model_tb");
  const std::string& dir = tmp.path();
  m->fit(t.x, t.y, {.epochs = 2, .batch_size = 16, .validation_split = 0.25,
                    .callbacks = {callbacks::TensorBoard(dir, /*update_freq=*/1)}, .verbose = 0});
  std::string train = slurp_events(dir + "/train"), val = slurp_events(dir + "/validation");
  for (const char* tag : {"brain.Event:2", "epoch_loss", "epoch_accuracy", "epoch_learning_rate",
                          "epoch_samples_per_sec", "batch_loss"})
    EXPECT_NE(train.find(tag), std::string::npos) << tag;
  EXPECT_NE(val.find("epoch_loss"), std::string::npos);
  EXPECT_NE(val.find("epoch_accuracy"), std::string::npos);
  EXPECT_EQ(val.find("batch_loss"), std::string::npos);
}

}  // namespace
}  // namespace kiln::train

namespace kiln::train {
namespace {

TEST(Fit, ExplicitValidationDataAndPredict) {
  auto m = small_mlp(5);
  Toy t = toy_data(256, 8), v = toy_data(64, 9);
  History h = m->fit(t.x, t.y, {.epochs = 10, .batch_size = 32, .validation_x = {v.x}, .validation_y = {v.y},
                                .verbose = 0});
  Logs e = m->evaluate(v.x, v.y, {.batch_size = 7});
  EXPECT_NEAR(h.at("val_loss").back(), e["loss"], 1e-5);
  EXPECT_NEAR(h.at("val_accuracy").back(), e["accuracy"], 1e-9);
  Tensor p = m->predict(v.x, 10);
  EXPECT_EQ(p.shape(), Shape({64, 3}));
  // predict in batches equals one call in inference mode.
  EXPECT_CLOSE(p, (*m)(v.x, false), 1e-5, 1e-6);
  Toy bad = toy_data(10, 1);
  EXPECT_KILN_ERROR(m->fit(t.x, t.y, {.validation_x = {bad.x}, .validation_y = {v.y}, .verbose = 0}),
                    kInvalidArgument, "validation");
}

}  // namespace
}  // namespace kiln::train
