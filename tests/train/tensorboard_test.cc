#include "kiln/train/tensorboard.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/device_config_internal.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/data/tfrecord.h"
#include "kiln/train/layers.h"
#include "kiln/train/model.h"
#include "tensorboard/event.pb.h"
#include "test_util.h"

namespace kiln::train {
namespace {

using kiln::testing::TempDir;
using kiln::testing::write_bytes;

namespace fs = std::filesystem;

std::vector<tensorflow::Event> read_events(const std::string& path) {
  std::vector<tensorflow::Event> out;
  for (const std::string& rec : data::read_tfrecords(path)) {
    tensorflow::Event e;
    EXPECT_TRUE(e.ParseFromString(rec)) << "record " << out.size() << " of " << path << " is not an Event";
    out.push_back(e);
  }
  return out;
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(SummaryWriter, WritesVersionThenScalars) {
  TempDir dir("tensorboard");
  std::string logdir = dir.path() + "/run/a";  // parents are created
  double t0 = now();
  std::string path;
  {
    SummaryWriter w(logdir);
    path = w.path();
    w.scalar("loss", 2.5, 0);
    w.scalar("loss", 0.0, 1);  // zero must still be stored (oneof presence)
    w.scalar("accuracy", 0.75, 1);
    w.scalar("loss", -1.25, 1000000000000);
  }
  double t1 = now();
  // events.out.tfevents.<secs>.<host>.<pid>.kiln
  std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(logdir));
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find("." + std::to_string(::getpid()) + ".kiln"), std::string::npos) << name;
  EXPECT_EQ(name.substr(name.size() - 5), ".kiln");
  int64_t secs = std::stoll(name.substr(20));
  EXPECT_GE(secs, static_cast<int64_t>(t0) - 1);
  EXPECT_LE(secs, static_cast<int64_t>(t1));

  std::vector<tensorflow::Event> ev = read_events(path);
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0].file_version(), "brain.Event:2");
  EXPECT_FALSE(ev[0].has_summary());
  struct Want {
    const char* tag;
    float value;
    int64_t step;
  };
  std::vector<Want> want = {{"loss", 2.5f, 0}, {"loss", 0.0f, 1}, {"accuracy", 0.75f, 1}, {"loss", -1.25f, 1000000000000}};
  for (size_t i = 0; i < want.size(); ++i) {
    const tensorflow::Event& e = ev[i + 1];
    ASSERT_TRUE(e.has_summary()) << i;
    ASSERT_EQ(e.summary().value_size(), 1);
    const auto& v = e.summary().value(0);
    EXPECT_EQ(v.tag(), want[i].tag);
    EXPECT_EQ(v.value_case(), tensorflow::Summary::Value::kSimpleValue) << i;
    EXPECT_EQ(v.simple_value(), want[i].value);
    EXPECT_EQ(e.step(), want[i].step);
    EXPECT_GE(e.wall_time(), t0 - 1);
    EXPECT_LE(e.wall_time(), t1 + 1);
  }
}

TEST(SummaryWriter, FlushMakesEventsReadableWhileOpen) {
  TempDir dir("tensorboard");
  SummaryWriter w(dir.path());
  // The version record is on disk as soon as the writer exists.
  ASSERT_EQ(read_events(w.path()).size(), 1u);
  w.scalar("x", 1.0, 7);
  w.flush();
  std::vector<tensorflow::Event> ev = read_events(w.path());
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1].step(), 7);
  EXPECT_EQ(ev[1].summary().value(0).simple_value(), 1.0f);
}

TEST(SummaryWriter, TwoWritersInOneDirectoryGetDistinctFiles) {
  TempDir dir("tensorboard");
  SummaryWriter a(dir.path()), b(dir.path());
  EXPECT_NE(a.path(), b.path());
  a.scalar("a", 1, 1);
  b.scalar("b", 2, 1);
  a.flush();
  b.flush();
  EXPECT_EQ(read_events(a.path())[1].summary().value(0).tag(), "a");
  EXPECT_EQ(read_events(b.path())[1].summary().value(0).tag(), "b");
}

TEST(SummaryWriter, UncreatableLogdirThrows) {
  TempDir dir("tensorboard");
  std::string file = dir.path() + "/plain_file";
  data::write_tfrecords(file, {});
  EXPECT_KILN_ERROR(SummaryWriter(file + "/sub"), kFailedPrecondition, file);
  EXPECT_KILN_ERROR(SummaryWriter(file), kFailedPrecondition, "log directory");
}

// The TensorBoard callback writes each initialized logical device's allocator
// statistics per epoch: memory/cpu_0/bytes_in_use, peak_bytes_in_use, bytes_reserved.
TEST(TensorBoardCallback, WritesAllocatorStatsPerDevice) {
  config::internal::reset_for_testing();  // fresh devices: split the CPU in two
  config::set_logical_device_configuration(Device::cpu(), {{0}, {0}});
  const Device cpu1{DeviceType::kCPU, 1};
  Tensor held = Tensor::empty({1 << 20}, DType::kU8, cpu1);  // 1 MiB on cpu:1 through both epochs
  set_seed(4);
  auto m = std::make_shared<Sequential>(std::vector<LayerPtr>{layers::Dense(16, "relu"), layers::Dense(3)}, Shape{8});
  m->compile({optimizers::Adam({0.01}), {losses::SparseCategoricalCrossentropy(true)}, {}});
  Tensor x = kiln::testing::rand_tensor({64, 8}, DType::kF32, -1, 1, 5);
  Tensor y = Tensor::from_vector<int32_t>(std::vector<int32_t>(64, 1), {64});
  TempDir dir("tb_memory");
  m->fit(x, y, {.epochs = 2, .batch_size = 16, .callbacks = {callbacks::TensorBoard(dir.path())}, .verbose = 0});
  std::string path;
  for (auto& e : fs::directory_iterator(dir.path() + "/train")) path = e.path().string();
  std::map<std::string, std::map<int64_t, double>> got;  // tag -> step -> value
  for (const tensorflow::Event& e : read_events(path))
    if (e.has_summary())
      for (const auto& v : e.summary().value())
        if (v.tag().rfind("memory/", 0) == 0) got[v.tag()][e.step()] = v.simple_value();
  const std::vector<std::string> want = {
      "memory/cpu_0/bytes_in_use", "memory/cpu_0/bytes_reserved", "memory/cpu_0/peak_bytes_in_use",
      "memory/cpu_1/bytes_in_use", "memory/cpu_1/bytes_reserved", "memory/cpu_1/peak_bytes_in_use"};
  std::vector<std::string> tags;
  for (auto& [tag, steps] : got) tags.push_back(tag);
  EXPECT_EQ(tags, want);
  for (int64_t epoch : {0, 1}) {
    SCOPED_TRACE(epoch);
    // cpu:1 holds exactly the 1 MiB buffer, in its first 2 MiB region.
    EXPECT_EQ(got["memory/cpu_1/bytes_in_use"][epoch], 1 << 20);
    EXPECT_EQ(got["memory/cpu_1/peak_bytes_in_use"][epoch], 1 << 20);
    EXPECT_EQ(got["memory/cpu_1/bytes_reserved"][epoch], 2 << 20);
    // cpu:0 ran the model: the peak within the epoch covers what remains in use.
    EXPECT_GT(got["memory/cpu_0/bytes_in_use"][epoch], 0);
    EXPECT_GT(got["memory/cpu_0/peak_bytes_in_use"][epoch], got["memory/cpu_0/bytes_in_use"][epoch]);
    EXPECT_GE(got["memory/cpu_0/bytes_reserved"][epoch], got["memory/cpu_0/peak_bytes_in_use"][epoch]);
  }
  EXPECT_EQ(config::memory_stats(cpu1).bytes_in_use, 1 << 20);
  held = Tensor();
  config::internal::reset_for_testing();
}

}  // namespace
}  // namespace kiln::train
