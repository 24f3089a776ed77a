// Model::fit / evaluate / predict on a data::Dataset.
#include <atomic>

#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/data/dataset.h"
#include "kiln/train.h"
#include "test_util.h"

namespace kiln::train {
namespace {

using data::Dataset;
using data::Element;

// y = 2 x0 - x1 + 0.5 on 256 random points.
struct Linear {
  Tensor x = kiln::testing::rand_tensor({256, 2}, DType::kF32, -1, 1, 3);
  Tensor y;
  Linear() {
    auto xv = x.to_vector<float>();
    std::vector<float> yv;
    for (size_t i = 0; i < 256; ++i) yv.push_back(2 * xv[2 * i] - xv[2 * i + 1] + 0.5f);
    y = Tensor::from_vector<float>(yv, {256, 1});
  }
};

ModelPtr make_model() {
  set_seed(5);
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{layers::Dense(1)}, Shape{2});
  m->compile({optimizers::SGD({0.1}), {losses::MeanSquaredError()}, {"mae"}});
  return m;
}

TEST(FitDataset, MatchesFitOnTensorsBatchForBatch) {
  Linear d;
  auto a = make_model();
  auto b = make_model();
  History ha = a->fit(d.x, d.y, {.epochs = 3, .batch_size = 32, .shuffle = false, .verbose = 0});
  auto ds = Dataset::from_tensor_slices({d.x, d.y}).batch(32).prefetch(2);
  History hb = b->fit(ds, {.epochs = 3, .verbose = 0});
  ASSERT_EQ(ha.at("loss").size(), 3u);
  for (size_t e = 0; e < 3; ++e) EXPECT_DOUBLE_EQ(ha.at("loss")[e], hb.at("loss")[e]) << "epoch " << e;
  EXPECT_TRUE(array_equal(a->trainable_weights()[0].value(), b->trainable_weights()[0].value()));
  EXPECT_EQ(hb.history.count("input_wait"), 1u);
  for (double w : hb.at("input_wait")) {
    EXPECT_GE(w, 0);
    EXPECT_LE(w, 1);
  }
  EXPECT_LT(hb.at("loss").back(), hb.at("loss").front());
  // evaluate / predict agree with the tensor versions.
  Logs ea = a->evaluate(d.x, d.y, {.batch_size = 64});
  Logs eb = b->evaluate(Dataset::from_tensor_slices({d.x, d.y}).batch(64));
  EXPECT_DOUBLE_EQ(ea.at("loss"), eb.at("loss"));
  Tensor pa = a->predict(d.x, 50);
  Tensor pb = b->predict(Dataset::from_tensor_slices({d.x}).batch(50))[0];
  EXPECT_TRUE(array_equal(pa, pb));
}

TEST(FitDataset, InfiniteDatasetNeedsStepsPerEpochAndContinuesAcrossEpochs) {
  Linear d;
  auto m = make_model();
  auto ds = Dataset::from_tensor_slices({d.x, d.y}).shuffle(256, 9).batch(16).repeat();
  EXPECT_KILN_ERROR(m->fit(ds, {.epochs = 1, .verbose = 0}), kInvalidArgument, "give steps_per_epoch");
  auto batches = std::make_shared<int>(0);
  struct Count : Callback {
    std::shared_ptr<int> n;
    void on_train_batch_end(int64_t, Logs&) override { ++*n; }
  };
  auto cb = std::make_shared<Count>();
  cb->n = batches;
  History h = m->fit(ds, {.epochs = 4, .callbacks = {cb}, .verbose = 0, .steps_per_epoch = 5});
  EXPECT_EQ(*batches, 20);
  EXPECT_EQ(h.at("loss").size(), 4u);
  // Validation data and a finite dataset with steps_per_epoch beyond one pass.
  auto fin = Dataset::from_tensor_slices({d.x, d.y}).batch(64);  // 4 batches
  History h2 = m->fit(fin, {.epochs = 2, .verbose = 0, .steps_per_epoch = 6, .validation_data = fin.take(1)});
  EXPECT_EQ(h2.at("val_loss").size(), 2u);
}

TEST(FitDataset, ResumedFitMatchesAnUninterruptedOne) {
  // A shuffled pipeline and BackupAndRestore: stop after epoch 1 + 3 batches, resume in
  // a "new process" (new model, new Dataset objects): same weights as one straight run.
  Linear d;
  kiln::testing::TempDir dir("fitds_resume");
  auto pipeline = [&] { return Dataset::from_tensor_slices({d.x, d.y}).shuffle(256, 11).batch(32); };
  auto straight = make_model();
  straight->fit(pipeline(), {.epochs = 3, .verbose = 0});

  struct CrashAt : Callback {  // after the backup of that batch was written
    int64_t batches = 0, limit = 0;
    void on_train_batch_end(int64_t, Logs&) override {
      if (++batches == limit) throw std::runtime_error("simulated crash");
    }
  };
  auto crash = std::make_shared<CrashAt>();
  crash->limit = 8 + 3;  // 8 batches per epoch
  auto first = make_model();
  EXPECT_THROW(first->fit(pipeline(), {.epochs = 3,
                                       .callbacks = {callbacks::BackupAndRestore(dir.file("backup"), 1), crash},
                                       .verbose = 0}),
               std::runtime_error);
  auto resumed = make_model();
  resumed->fit(pipeline(), {.epochs = 3, .callbacks = {callbacks::BackupAndRestore(dir.file("backup"), 1)}, .verbose = 0});
  EXPECT_TRUE(array_equal(resumed->trainable_weights()[0].value(), straight->trainable_weights()[0].value()));
  EXPECT_TRUE(array_equal(resumed->trainable_weights()[1].value(), straight->trainable_weights()[1].value()));
}

TEST(FitDataset, BadElementsAreClearErrors) {
  Linear d;
  auto m = make_model();
  auto three = Dataset::from_tensor_slices({d.x, d.y, d.y}).batch(32);
  EXPECT_KILN_ERROR(m->fit(three, {.verbose = 0}), kInvalidArgument, "takes 1 input(s) and 1 target(s)");
  auto strings = Dataset::from_tensor_slices({data::StringTensor::vector({"a", "b"}), Tensor::zeros({2, 1})}).batch(2);
  EXPECT_KILN_ERROR(m->fit(strings, {.verbose = 0}), kInvalidArgument, "expected a numeric tensor");
  EXPECT_KILN_ERROR(m->fit(Dataset::from_tensor_slices({d.x, d.y}).batch(8), {.validation_split = 0.2, .verbose = 0}),
                    kInvalidArgument, "validation_split does not apply");
  // A failing map surfaces from fit with the element index.
  auto failing = Dataset::from_tensor_slices({d.x, d.y}).batch(32).map([](const Element& e) -> Element {
    static std::atomic<int> n{0};
    if (++n == 3) throw DataLossError("bad record");
    return e;
  });
  EXPECT_KILN_ERROR(m->fit(failing, {.verbose = 0}), kDataLoss, "map: element 2: bad record");
}

}  // namespace
}  // namespace kiln::train
