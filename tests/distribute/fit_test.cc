// Model::fit under MirroredStrategy on logical CPU devices against the same model on one
// device: same seed, same data order, same global batch. The replicas' gradients are
// all-reduced weighted by shard size, so the two runs differ by float summation order
// only; the bound is stated per test. Every replica's copies stay bit-identical.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>

#include "kiln/autodiff/tape.h"
#include "kiln/core/random.h"
#include "kiln/data/dataset.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/strategy.h"
#include "kiln/ops.h"
#include "kiln/train/layers.h"
#include "kiln/train/model.h"
#include "loopback.h"
#include "gpus.h"
#include "test_util.h"

namespace kiln::train {
namespace {

namespace L = layers;
using distribute::MirroredStrategy;
using kiln::testing::rand_tensor;

struct Data {
  Tensor x, y;
};
// Ten classes, labels from a fixed linear map of the features (learnable).
Data data(int64_t n, const Shape& sample, uint64_t seed) {
  std::vector<int64_t> dims{n};
  for (int64_t d : sample.vec()) dims.push_back(d);
  Tensor x = rand_tensor(Shape(dims), DType::kF32, -1, 1, seed);
  const int64_t f = x.numel() / n;
  std::vector<float> xv = x.to_vector<float>();
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float best = -1e30f;
    for (int c = 0; c < 10; ++c) {
      float s = 0;
      for (int64_t j = c; j < f; j += 10) s += xv[static_cast<size_t>(i * f + j)];
      if (s > best) best = s, y[static_cast<size_t>(i)] = c;
    }
  }
  return {x, Tensor::from_vector<int32_t>(y, {n})};
}

ModelPtr mlp() {
  set_seed(7);
  return std::make_shared<Sequential>(std::vector<LayerPtr>{L::Dense(32, "relu"), L::Dense(10)}, Shape{20});
}

ModelPtr cnn() {
  set_seed(11);
  L::Conv2DOptions conv;
  conv.activation = "relu";
  return std::make_shared<Sequential>(
      std::vector<LayerPtr>{L::Conv2D(8, {3, 3}, conv), L::MaxPool2D(), L::Conv2D(8, {3, 3}, conv), L::MaxPool2D(),
                            L::Flatten(), L::Dense(10)},
      Shape{14, 14, 1});
}

// Dense + BatchNorm (moving statistics: non-trainable weights the forward assigns) + Dense.
ModelPtr bn_model(bool synchronized = false) {
  set_seed(5);
  L::BatchNormOptions bn;
  bn.synchronized = synchronized;
  return std::make_shared<Sequential>(
      std::vector<LayerPtr>{L::Dense(16, "relu"), L::BatchNormalization(bn), L::Dense(10)}, Shape{20});
}

void compile(Model& m, std::shared_ptr<distribute::Strategy> s, bool eager = false, OptimizerPtr opt = nullptr) {
  CompileOptions co{opt ? opt : optimizers::Adam({0.01}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}};
  co.strategy = std::move(s);
  co.run_eagerly = eager;
  m.compile(co);
}

FitOptions fit_options(int epochs, int64_t batch) {
  FitOptions fo;
  fo.epochs = epochs;
  fo.batch_size = batch;
  fo.shuffle_seed = 3;
  fo.verbose = 0;
  return fo;
}

// Rows [0, n) of t.
Tensor take_rows_for_test(const Tensor& t, int64_t n) {
  std::vector<int64_t> begin(static_cast<size_t>(t.rank()), 0), size = t.shape().vec();
  size[0] = n;
  return ops::slice(t, begin, size);
}

// Largest |a - b| over every weight and optimizer slot.
double max_diff(const Model& a, const Model& b) {
  std::vector<Variable> va = a.weights(), vb = b.weights();
  for (const Variable& v : a.optimizer()->variables()) va.push_back(v);
  for (const Variable& v : b.optimizer()->variables()) vb.push_back(v);
  EXPECT_EQ(va.size(), vb.size());
  double d = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    std::vector<double> x = va[i].peek().to(Device::cpu()).to_vector<double>(),
                        y = vb[i].peek().to(Device::cpu()).to_vector<double>();
    for (size_t j = 0; j < x.size(); ++j) d = std::max(d, std::abs(x[j] - y[j]));
  }
  return d;
}

// Every mirrored variable's copies are bit-identical, on their replicas' devices.
void expect_copies_equal(const Model& m, int replicas) {
  std::vector<Variable> vars = m.weights();
  for (const Variable& v : m.optimizer()->variables()) vars.push_back(v);
  for (const Variable& v : vars) {
    SCOPED_TRACE(v.name());
    ASSERT_EQ(v.num_replicas(), replicas);
    for (int r = 1; r < replicas; ++r) {
      EXPECT_EQ(v.replica_value(r).device(), (Device{DeviceType::kCPU, r}));
      EXPECT_TRUE(array_equal(v.replica_value(r).to(Device::cpu()), v.replica_value(0)));
    }
  }
}

TEST(MirroredFit, MlpTwoReplicasEqualsOneDevice) {
  Data d = data(500, Shape{20}, 1);  // batches of 64: seven full ones and one of 52
  ModelPtr one = mlp(), two = mlp();
  compile(*one, nullptr);
  compile(*two, MirroredStrategy::create("cpu:0,cpu:1"));
  History h1 = one->fit(d.x, d.y, fit_options(2, 64));
  History h2 = two->fit(d.x, d.y, fit_options(2, 64));
  // Bound: 1e-5 absolute after 16 Adam steps at lr 0.01 (float summation order only).
  EXPECT_LT(max_diff(*one, *two), 1e-5);
  EXPECT_NEAR(h1.at("loss").back(), h2.at("loss").back(), 1e-5);
  EXPECT_EQ(h1.at("accuracy").back(), h2.at("accuracy").back());
  EXPECT_EQ(two->optimizer()->iterations(), 16);
  // The first step eager, the next traced (each replica: one trace per shard shape).
  EXPECT_EQ(two->traced_steps(), 15);
  expect_copies_equal(*two, 2);
  // evaluate and predict run on replica 0's copies.
  EXPECT_NEAR(one->evaluate(d.x, d.y).at("loss"), two->evaluate(d.x, d.y).at("loss"), 1e-5);
  EXPECT_CLOSE(two->predict(d.x), one->predict(d.x), 1e-4, 1e-5);
}

// GPU replicas (NCCL; up to 2 GPUs, skipped without one): the mlp equals one GPU, the
// replicas' copies equal.
TEST(MirroredFit, MlpOnGpusEqualsOneGpu) {
  std::string why;
  const std::vector<Device> gpus = kiln::testing::gpus_for_test(2, &why);
  if (gpus.empty()) GTEST_SKIP() << why;
  const int n = static_cast<int>(gpus.size());
  Data d = data(256, Shape{20}, 15);
  ModelPtr one = mlp(), many = mlp();
  CompileOptions co{optimizers::Adam({0.01}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}};
  co.device = gpus[0].str();
  one->compile(co);
  compile(*many, MirroredStrategy::create(gpus));
  History h1 = one->fit(d.x, d.y, fit_options(2, 64));
  History hn = many->fit(d.x, d.y, fit_options(2, 64));
  EXPECT_LT(max_diff(*one, *many), 1e-4);  // (GPU reductions: another summation order)
  EXPECT_NEAR(h1.at("loss").back(), hn.at("loss").back(), 1e-4);
  for (const Variable& v : many->weights())
    for (int r = 1; r < n; ++r)
      EXPECT_TRUE(array_equal(v.replica_value(r).to(Device::cpu()), v.replica_value(0).to(Device::cpu()))) << v.name();
}

TEST(MirroredFit, UnevenShardsAndIdleReplicas) {
  // 3 replicas, batches of 32 over 65 rows: shards 11/11/10, and a last batch of one
  // row (1/0/0: two replicas add nothing that step).
  Data d = data(65, Shape{20}, 2);
  ModelPtr one = mlp(), three = mlp();
  compile(*one, nullptr);
  compile(*three, MirroredStrategy::create("cpu:0,cpu:1,cpu:2"));
  one->fit(d.x, d.y, fit_options(2, 32));
  three->fit(d.x, d.y, fit_options(2, 32));
  EXPECT_LT(max_diff(*one, *three), 1e-5);
  expect_copies_equal(*three, 3);
}

TEST(MirroredFit, DatasetOfGlobalBatchesEqualsOneDevice) {
  // fit(Dataset): each element is a global batch (shuffled per epoch, prefetched), split
  // across the replicas as tensors are.
  Data d = data(300, Shape{20}, 9);
  auto ds = data::Dataset::from_tensor_slices({d.x, d.y}).shuffle(300, 4).batch(32).prefetch(2);
  ModelPtr one = mlp(), two = mlp();
  compile(*one, nullptr);
  compile(*two, MirroredStrategy::create("cpu:0,cpu:1"));
  FitOptions fo = fit_options(2, 32);
  History h1 = one->fit(ds, fo);
  History h2 = two->fit(ds, fo);
  EXPECT_LT(max_diff(*one, *two), 1e-5);
  EXPECT_EQ(h1.at("accuracy"), h2.at("accuracy"));
  expect_copies_equal(*two, 2);
}

TEST(MirroredFit, EagerStepsEqualTracedOnes) {
  Data d = data(256, Shape{20}, 3);
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  ModelPtr eager = mlp(), traced = mlp();
  compile(*eager, s, /*eager=*/true);
  compile(*traced, s);
  eager->fit(d.x, d.y, fit_options(1, 64));
  traced->fit(d.x, d.y, fit_options(1, 64));
  EXPECT_EQ(eager->traced_steps(), 0);
  EXPECT_LT(max_diff(*eager, *traced), 1e-5);
  expect_copies_equal(*eager, 2);
}

TEST(MirroredFit, CnnOneEpochEqualsOneDevice) {
  Data d = data(192, Shape{14, 14, 1}, 4);
  ModelPtr one = cnn(), two = cnn();
  compile(*one, nullptr, false, optimizers::SGD({0.05}, 0.9));
  compile(*two, MirroredStrategy::create("cpu:0,cpu:1"), false, optimizers::SGD({0.05}, 0.9));
  History h1 = one->fit(d.x, d.y, fit_options(1, 48));
  History h2 = two->fit(d.x, d.y, fit_options(1, 48));
  EXPECT_LT(max_diff(*one, *two), 1e-5);
  EXPECT_EQ(h1.at("accuracy").back(), h2.at("accuracy").back());
  expect_copies_equal(*two, 2);
}

// Synchronized batch normalisation: the statistics of the global batch on every replica,
// so N replicas train exactly as one device does with plain batch normalisation (the
// moving statistics too), also with uneven shards (3 replicas, 32 rows: 11, 11, 10) and
// across workers. Per-shard statistics do not.
TEST(MirroredFit, SynchronizedBatchNormEqualsOneDevice) {
  Data d = data(192, Shape{20}, 5);
  ModelPtr one = bn_model(), sync3 = bn_model(true), plain3 = bn_model();
  compile(*one, nullptr);
  compile(*sync3, MirroredStrategy::create("cpu:0,cpu:1,cpu:2"));
  compile(*plain3, MirroredStrategy::create("cpu:0,cpu:1,cpu:2"));
  EXPECT_TRUE(sync3->syncs_replicas());
  EXPECT_FALSE(plain3->syncs_replicas());
  History h1 = one->fit(d.x, d.y, fit_options(2, 32));
  History h3 = sync3->fit(d.x, d.y, fit_options(2, 32));
  plain3->fit(d.x, d.y, fit_options(2, 32));
  EXPECT_LT(max_diff(*one, *sync3), 1e-5);
  EXPECT_GT(max_diff(*one, *plain3), 1e-4) << "per-shard statistics differ from the batch's";
  EXPECT_NEAR(h1.at("loss").back(), h3.at("loss").back(), 1e-5);
  expect_copies_equal(*sync3, 3);
  // A batch that leaves a replica without rows cannot be synchronised.
  EXPECT_KILN_ERROR(sync3->train_step({take_rows_for_test(d.x, 2)}, {take_rows_for_test(d.y, 2)}), kInvalidArgument,
                    "a batch of 2 rows for 3 replicas: synchronized batch statistics need a row on every replica");
  // Alone, synchronized is plain batch normalisation.
  ModelPtr alone = bn_model(true);
  compile(*alone, nullptr);
  alone->fit(d.x, d.y, fit_options(2, 32));
  EXPECT_LT(max_diff(*one, *alone), 1e-5);  // (other ops compute the same statistics)
}

TEST(MirroredFit, BatchNormStatisticsStayEqualAcrossReplicas) {
  Data d = data(128, Shape{20}, 5);
  ModelPtr m = bn_model();
  compile(*m, MirroredStrategy::create("cpu:0,cpu:1"));
  m->fit(d.x, d.y, fit_options(2, 32));
  expect_copies_equal(*m, 2);
  // The moving mean moved (the statistics were updated, then averaged).
  bool moved = false;
  for (const Variable& v : m->non_trainable_weights())
    for (double x : v.peek().to_vector<double>()) moved |= x != 0 && x != 1;
  EXPECT_TRUE(moved);
}

TEST(MirroredFit, StrategyFromScopeAndCheckpointRestore) {
  Data d = data(128, Shape{20}, 6);
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  ModelPtr m = mlp();
  {
    distribute::StrategyScope scope(s);
    compile(*m, nullptr);  // picks up the scope's strategy
  }
  m->fit(d.x, d.y, fit_options(1, 32));
  ASSERT_EQ(m->weights()[0].num_replicas(), 2);
  CheckpointData saved = m->state();
  m->fit(d.x, d.y, fit_options(1, 32));
  m->load_state(saved);  // every replica's copy from the checkpoint
  expect_copies_equal(*m, 2);
  EXPECT_TRUE(array_equal(m->weights()[0].peek(), *saved.find("model/" + m->named_weights()[0].first)));
  // A device other than the strategy's first is refused.
  CompileOptions co{optimizers::SGD(), {losses::SparseCategoricalCrossentropy(true)}};
  co.strategy = s;
  co.device = "cpu:1";
  EXPECT_KILN_ERROR(m->compile(co), kInvalidArgument, "not the strategy's first device");
  // Compiled again without a strategy: back to one copy.
  compile(*m, nullptr);
  EXPECT_EQ(m->weights()[0].num_replicas(), 1);
}

TEST(MirroredFit, BadBatchesAreTypedErrors) {
  ModelPtr m = mlp();
  compile(*m, MirroredStrategy::create("cpu:0,cpu:1"));
  EXPECT_KILN_ERROR(m->train_step({Tensor::zeros({4, 20})}, {Tensor::zeros({3}, DType::kI32)}), kInvalidArgument,
                    "same rows");
  EXPECT_KILN_ERROR(m->train_step({Tensor::zeros({0, 20})}, {Tensor::zeros({0}, DType::kI32)}), kInvalidArgument,
                    "empty batch");
  EXPECT_THROW(m->train_step({Tensor::zeros({4, 7})}, {Tensor::zeros({4}, DType::kI32)}), InvalidArgumentError);
  // Still trains afterwards.
  Data d = data(64, Shape{20}, 7);
  EXPECT_NO_THROW(m->fit(d.x, d.y, fit_options(1, 32)));
  expect_copies_equal(*m, 2);
}

// Two workers as threads of this process (each its own model and
// MultiWorkerMirroredStrategy, over loopback TCP) against one device.
// Two workers as threads over loopback, one replica each: `fit(model, rank)` on w0 and w1.
// `devices`: worker r's replica (default cpu:r).
std::vector<History> on_two_workers(Model& w0, Model& w1, const std::function<History(Model&, int)>& fit,
                                    const distribute::CommunicationOptions& comm = {},
                                    const std::vector<Device>& devices = {}) {
  const int port = kiln::testing::free_port();
  std::vector<History> hist(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r)
    workers.emplace_back([&, r] {
      try {
        distribute::ClusterSpec c;
        c.rank = r;
        c.size = 2;
        c.coordinator = "127.0.0.1:" + std::to_string(port);
        c.host = "127.0.0.1";
        const Device device = devices.empty() ? Device{DeviceType::kCPU, r} : devices.at(static_cast<size_t>(r));
        auto s = distribute::MultiWorkerMirroredStrategy::create(c, {device}, 30);
        s->set_communication_options(comm);
        EXPECT_EQ(s->num_replicas_in_sync(), 2);
        EXPECT_EQ(s->num_local_replicas(), 1);
        Model& m = r == 0 ? w0 : w1;
        compile(m, s);
        hist[static_cast<size_t>(r)] = fit(m, r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : workers) t.join();
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  return hist;
}

TEST(MultiWorkerFit, TwoWorkersEqualOneDevice) {
  Data d = data(320, Shape{20}, 8);
  ModelPtr one = mlp(), w0 = mlp(), w1 = mlp();
  compile(*one, nullptr);
  History h1 = one->fit(d.x, d.y, fit_options(2, 64));
  std::vector<History> hist = on_two_workers(*w0, *w1, [&](Model& m, int) { return m.fit(d.x, d.y, fit_options(2, 64)); });
  ASSERT_EQ(hist[1].at("loss").size(), 2u);
  EXPECT_LT(max_diff(*one, *w0), 1e-5);
  EXPECT_EQ(max_diff(*w0, *w1), 0.0);  // every worker applies the same update
  EXPECT_DOUBLE_EQ(hist[0].at("loss").back(), hist[1].at("loss").back());  // the job's loss, on every worker
  // Metrics of the global batches (the workers' predictions gathered), on every worker.
  EXPECT_EQ(hist[0].at("accuracy"), hist[1].at("accuracy"));
  EXPECT_NEAR(hist[0].at("accuracy").back(), h1.at("accuracy").back(), 1e-9);
}

// The gradients all-reduced in one bucket after the backward pass, or in buckets of
// every size while it runs: the same bits (the buckets are reduced elementwise in
// replica order whatever their size, and each bucket's gradients are final when given).
TEST(MirroredFit, OverlapAndBucketSizesGiveTheSameBits) {
  using Overlap = distribute::CommunicationOptions::Overlap;
  Data d = data(160, Shape{14, 14, 1}, 9);
  ModelPtr ref = cnn();
  auto s = MirroredStrategy::create("cpu:0,cpu:1,cpu:2");
  s->set_communication_options({0, Overlap::kOff});
  compile(*ref, s);
  ref->fit(d.x, d.y, fit_options(2, 32));
  for (const distribute::CommunicationOptions& comm : std::vector<distribute::CommunicationOptions>{
           {1, Overlap::kOn}, {1, Overlap::kOff}, {300, Overlap::kOn}, {1 << 20, Overlap::kAuto}}) {
    SCOPED_TRACE(::testing::Message() << "bytes_per_pack " << comm.bytes_per_pack << ", overlap " << static_cast<int>(comm.overlap));
    ModelPtr m = cnn();
    auto sc = MirroredStrategy::create("cpu:0,cpu:1,cpu:2");
    sc->set_communication_options(comm);
    compile(*m, sc);
    m->fit(d.x, d.y, fit_options(2, 32));
    EXPECT_EQ(max_diff(*ref, *m), 0.0);
    expect_copies_equal(*m, 3);
  }
  // Across workers too: every tensor its own bucket, overlapped, against one bucket.
  ModelPtr a0 = mlp(), a1 = mlp(), b0 = mlp(), b1 = mlp();
  Data e = data(200, Shape{20}, 4);
  auto fit = [&](Model& m, int) { return m.fit(e.x, e.y, fit_options(2, 50)); };
  on_two_workers(*a0, *a1, fit, {0, Overlap::kOff});
  on_two_workers(*b0, *b1, fit, {1, Overlap::kOn});
  EXPECT_EQ(max_diff(*a0, *b0), 0.0);
  EXPECT_EQ(max_diff(*b0, *b1), 0.0);
}

// Two workers with one GPU each (skipped without two GPUs): one NCCL communicator over
// both workers' GPUs; the run equals one GPU.
TEST(MultiWorkerFit, TwoWorkersOnGpusEqualOneGpu) {
  std::string why;
  const std::vector<Device> gpus = kiln::testing::gpus_for_test(2, &why);
  if (gpus.size() < 2) GTEST_SKIP() << (gpus.empty() ? why : "one GPU: the test needs two");
  Data d = data(256, Shape{20}, 16);
  ModelPtr one = mlp(), w0 = mlp(), w1 = mlp();
  CompileOptions co{optimizers::Adam({0.01}), {losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}};
  co.device = gpus[0].str();
  one->compile(co);
  History h1 = one->fit(d.x, d.y, fit_options(2, 64));
  std::vector<History> hist =
      on_two_workers(*w0, *w1, [&](Model& m, int) { return m.fit(d.x, d.y, fit_options(2, 64)); }, {}, gpus);
  EXPECT_LT(max_diff(*one, *w0), 1e-4);  // (GPU reductions: another summation order)
  EXPECT_EQ(max_diff(*w0, *w1), 0.0);
  EXPECT_NEAR(h1.at("loss").back(), hist[0].at("loss").back(), 1e-4);
}

// Workers with different numbers of replicas: an error on every worker at create, naming
// the one that differs.
TEST(MultiWorkerFit, WorkersWithDifferentReplicasAreAnError) {
  const int port = kiln::testing::free_port();
  std::vector<std::string> errors(2);
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r)
    workers.emplace_back([&, r] {
      distribute::ClusterSpec c;
      c.rank = r;
      c.size = 2;
      c.coordinator = "127.0.0.1:" + std::to_string(port);
      c.host = "127.0.0.1";
      std::vector<Device> devices{Device{DeviceType::kCPU, r}};
      if (r == 1) devices.push_back(Device{DeviceType::kCPU, 2});
      try {
        distribute::MultiWorkerMirroredStrategy::create(c, devices, 30);
      } catch (const Error& e) {  // any other error fails the expectation below, not the process
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : workers) t.join();
  for (const std::string& e : errors)
    EXPECT_NE(e.find("worker 1 has 2 cpu replicas, worker 0 has 1 cpu"), std::string::npos) << e;
}

// fit(Dataset) on two workers: each reads its part of every global batch (auto-sharded by
// elements: the map under the batch runs on half the elements per worker), and the run
// equals one process reading the global batches. 321 rows in batches of 64: the last
// global batch has one row, so worker 1's part ends a step early and it passes an empty
// batch to that step.
TEST(MultiWorkerFit, AutoShardedDatasetEqualsOneProcess) {
  Data d = data(321, Shape{20}, 12);
  std::atomic<int> maps{0};
  auto ds = data::Dataset::from_tensor_slices({d.x, d.y})
                .shuffle(321, 6)
                .map([&maps](const data::Element& e) {
                  ++maps;
                  return e;
                })
                .batch(64)
                .prefetch(2);
  ModelPtr one = mlp(), w0 = mlp(), w1 = mlp();
  compile(*one, nullptr);
  FitOptions fo = fit_options(2, 64);
  History h1 = one->fit(ds, fo);
  EXPECT_EQ(maps.load(), 2 * 321);
  maps = 0;
  std::vector<History> hist = on_two_workers(*w0, *w1, [&](Model& m, int) { return m.fit(ds, fo); });
  EXPECT_EQ(maps.load(), 2 * 321) << "each element is read by one worker";
  ASSERT_EQ(hist[1].at("loss").size(), 2u);
  EXPECT_LT(max_diff(*one, *w0), 1e-5);
  EXPECT_EQ(max_diff(*w0, *w1), 0.0);
  for (int w = 0; w < 2; ++w) {
    // Metrics of each global batch: the workers' predictions and targets, gathered.
    EXPECT_EQ(hist[static_cast<size_t>(w)].at("accuracy"), h1.at("accuracy"));
    EXPECT_NEAR(hist[static_cast<size_t>(w)].at("loss").back(), h1.at("loss").back(), 1e-5);
  }
}

// Resuming an epoch past the end of a worker's part (here step 5 of 6: worker 1's part
// has 5 batches, worker 0's a sixth of one row) still runs the step: worker 1 passes an
// empty batch shaped like the ones it skipped. Equal to one process resumed alike.
TEST(MultiWorkerFit, ResumingPastAWorkersLastBatch) {
  struct ResumeAt final : Callback {
    void on_train_begin(Logs&) override { model()->step_in_epoch = 5; }
  };
  Data d = data(321, Shape{20}, 14);
  auto ds = data::Dataset::from_tensor_slices({d.x, d.y}).shuffle(321, 8).batch(64);
  ModelPtr one = mlp(), w0 = mlp(), w1 = mlp();
  compile(*one, nullptr);
  FitOptions fo = fit_options(2, 64);
  fo.callbacks = {std::make_shared<ResumeAt>()};
  one->fit(ds, fo);
  on_two_workers(*w0, *w1, [&](Model& m, int) {
    FitOptions mine = fo;
    mine.callbacks = {std::make_shared<ResumeAt>()};
    return m.fit(ds, mine);
  });
  EXPECT_LT(max_diff(*one, *w0), 1e-5);
  EXPECT_EQ(max_diff(*w0, *w1), 0.0);
}

// Synchronized batch normalisation across two workers equals one device, also reading an
// auto-sharded Dataset (its last global batch of 1 row would leave worker 1 without rows:
// the epoch ends before it, as the test's one-device run drops it too).
TEST(MultiWorkerFit, SynchronizedBatchNormEqualsOneDevice) {
  Data d = data(257, Shape{20}, 13);
  auto ds = data::Dataset::from_tensor_slices({d.x, d.y}).shuffle(257, 2).batch(64);
  ModelPtr one = bn_model(), w0 = bn_model(true), w1 = bn_model(true);
  compile(*one, nullptr);
  FitOptions fo = fit_options(2, 64);
  History h1 = one->fit(ds.unbatch().take(256).batch(64), fo);  // (the shuffle is before the take)
  std::vector<History> hist = on_two_workers(*w0, *w1, [&](Model& m, int) { return m.fit(ds, fo); });
  ASSERT_EQ(hist[0].at("loss").size(), 2u);
  EXPECT_LT(max_diff(*one, *w0), 1e-5);
  EXPECT_EQ(max_diff(*w0, *w1), 0.0);
  EXPECT_EQ(hist[0].at("accuracy"), h1.at("accuracy"));
}

// A custom training loop (tf.distribute's strategy.run): per-replica gradients,
// all-reduced, applied by each replica to its own copy.
TEST(MirroredFit, CustomLoopWithRunAndAllReduce) {
  auto s = MirroredStrategy::create("cpu:0,cpu:1");
  Variable w(Tensor::zeros({3}), "w");
  s->mirror({w});
  // Least squares towards (1, -2, 3): x rows are unit vectors.
  Tensor x = Tensor::from_vector<float>({1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, {4, 3});
  Tensor y = Tensor::from_vector<float>({1, -2, 3, 2}, {4});
  for (int step = 0; step < 200; ++step) {
    auto shards = s->split_batch({x, y});
    std::vector<Tensor> losses(2);
    s->run([&](distribute::ReplicaContext& ctx) {
      const auto& sh = shards[static_cast<size_t>(ctx.replica_id())];
      GradientTape tape;
      Tensor err = ops::sub(ops::sum(ops::mul(sh[0], w.value()), {1}), sh[1]);
      Tensor loss = ops::mean(ops::square(err));
      std::vector<Tensor> g = tape.gradient(loss, {w});
      ctx.all_reduce(g, distribute::ReduceOp::kMean);
      w.assign(ops::sub(w.peek(), ops::mul(g[0], ops::scalar(0.2, DType::kF32))));
      losses[static_cast<size_t>(ctx.replica_id())] = loss;
    });
    if (step == 199) {
      EXPECT_LT(s->reduce(distribute::ReduceOp::kMean, losses).item<double>(), 1e-3);
    }
  }
  EXPECT_CLOSE(w.peek(), Tensor::from_vector<float>({1, -2, 3}, {3}), 0, 0.05);
  EXPECT_TRUE(array_equal(w.replica_value(1).to(Device::cpu()), w.replica_value(0)));
}

}  // namespace
}  // namespace kiln::train
