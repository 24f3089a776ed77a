// The model manager on real packages: version policies, new versions swapping in,
// broken versions never serving, labels and traffic splits, in-flight requests
// surviving an unload, memory returning after many reloads, batched predict.
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "kiln/ops.h"
#include "kiln/package/export.h"
#include "kiln/core/metrics.h"
#include "kiln/serving/model_manager.h"
#include "serving_test_util.h"

namespace kiln::serving {
namespace {
namespace fs = std::filesystem;
using kiln::testing::TempDir;
using testing::export_test_model;
using testing::test_model_probs;

Tensor sample_x(int64_t n, uint64_t seed = 7) { return kiln::testing::rand_tensor({n, 4}, DType::kF32, -1, 1, seed); }

void expect_close(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], 1e-5) << i;
}

ModelConfig cfg(const std::string& name, const std::string& base) {
  ModelConfig c;
  c.name = name;
  c.base_path = base;
  return c;
}

ManagerOptions no_poll() {
  ManagerOptions o;
  o.poll_seconds = 0;
  o.load.verify_sha256 = false;
  return o;
}

TEST(ModelManager, LatestVersionServesAndNewVersionsSwapIn) {
  TempDir dir("serving");
  export_test_model(dir.path(), 1, 1);
  export_test_model(dir.path(), 2, 2);
  ModelManager mgr(no_poll());
  mgr.set_config({cfg("m", dir.path())});
  EXPECT_FALSE(mgr.ready());
  mgr.poll_now();
  EXPECT_TRUE(mgr.ready());
  auto s = mgr.find("m", std::nullopt, "");
  EXPECT_EQ(s->version(), 2);
  Tensor x = sample_x(3);
  expect_close(s->predict_sync("serving_default", {{"x", x}}).at("probs"), test_model_probs(x, 2));

  export_test_model(dir.path(), 3, 3);
  mgr.poll_now();
  EXPECT_EQ(mgr.find("m", std::nullopt, "")->version(), 3);
  // The old servable still answers the request that holds it.
  expect_close(s->predict_sync("serving_default", {{"x", x}}).at("probs"), test_model_probs(x, 2));
  auto st = mgr.status("m");
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].version, 3);
  EXPECT_EQ(st[0].state, VersionState::kAvailable);
  EXPECT_EQ(st[1].version, 2);
  EXPECT_EQ(st[1].state, VersionState::kEnd);
  try {
    mgr.find("m", 2, "");
    ADD_FAILURE() << "version 2 was unloaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(ModelManager, BrokenVersionIsReportedAndNeverServes) {
  TempDir dir("serving");
  export_test_model(dir.path(), 1, 1);
  ModelManager mgr(no_poll());
  mgr.set_config({cfg("m", dir.path())});
  mgr.poll_now();
  // Version 2: a manifest that does not parse.
  fs::create_directories(dir.path() + "/2");
  std::ofstream(dir.path() + "/2/manifest.json") << "{ not json";
  mgr.poll_now();
  EXPECT_EQ(mgr.find("m", std::nullopt, "")->version(), 1);
  auto st = mgr.status("m");
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].version, 2);
  EXPECT_EQ(st[0].state, VersionState::kEnd);
  EXPECT_FALSE(st[0].status.ok());
  EXPECT_NE(st[0].status.message.find("manifest"), std::string::npos) << st[0].status.message;
  EXPECT_EQ(st[1].state, VersionState::kAvailable);
  // Not retried while unchanged; a fixed version 2 then takes over.
  mgr.poll_now();
  EXPECT_EQ(mgr.loads(), 1);
  fs::remove_all(dir.path() + "/2");
  export_test_model(dir.path(), 2, 2);
  mgr.poll_now();
  EXPECT_EQ(mgr.find("m", std::nullopt, "")->version(), 2);
}

TEST(ModelManager, FailingWarmupKeepsTheVersionOut) {
  TempDir dir("serving");
  export_test_model(dir.path(), 1, 1);
  export_test_model(dir.path(), 2, 2);
  ManagerOptions o = no_poll();
  o.warmup = [](const Servable& s) {
    if (s.version() == 2) throw InvalidArgumentError("warm-up request 0 failed");
  };
  ModelManager mgr(o);
  mgr.set_config({cfg("m", dir.path())});
  mgr.poll_now();
  EXPECT_EQ(mgr.find("m", std::nullopt, "")->version(), 1);
  EXPECT_EQ(mgr.status("m")[0].status.message, "warm-up request 0 failed");
}

TEST(ModelManager, PoliciesLabelsAndTrafficSplit) {
  TempDir dir("serving");
  for (int v = 1; v <= 3; ++v) export_test_model(dir.path(), v, v);
  ModelManager mgr(no_poll());
  ModelConfig c = cfg("m", dir.path());
  c.policy.kind = VersionPolicy::Kind::kSpecific;
  c.policy.versions = {1, 2};
  c.labels = {{"stable", 1}, {"canary", 2}};
  c.traffic_split = {{"stable", 9}, {"canary", 1}};
  mgr.set_config({c});
  mgr.poll_now();
  EXPECT_EQ(mgr.find("m", std::nullopt, "stable")->version(), 1);
  EXPECT_EQ(mgr.find("m", std::nullopt, "canary")->version(), 2);
  EXPECT_EQ(mgr.find("m", 1, "")->version(), 1);
  int canary = 0;
  for (int i = 0; i < 4000; ++i) canary += mgr.find("m", std::nullopt, "")->version() == 2;
  EXPECT_GT(canary, 250);  // 10% of 4000 = 400
  EXPECT_LT(canary, 550);
  try {
    mgr.find("m", std::nullopt, "nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("label: 'nope'"), std::string::npos);
  }
  try {
    mgr.find("m", 3, "");  // on disk, not in the policy
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
  c.policy.kind = VersionPolicy::Kind::kAll;
  mgr.set_config({c});
  mgr.poll_now();
  EXPECT_EQ(mgr.find("m", 3, "")->version(), 3);
}

TEST(ModelManager, ConfigIsValidated) {
  ModelManager mgr(no_poll());
  EXPECT_KILN_ERROR(mgr.set_config({cfg("", "/x")}), kInvalidArgument, "has no name");
  EXPECT_KILN_ERROR(mgr.set_config({cfg("a", "/x"), cfg("a", "/y")}), kInvalidArgument, "twice");
  ModelConfig c = cfg("a", "/x");
  c.traffic_split = {{"beta", 1}};
  EXPECT_KILN_ERROR(mgr.set_config({c}), kInvalidArgument, "neither a version number nor one of its version_labels");
  c.traffic_split = {{"99999999999999999999", 1}};  // does not fit an int64
  EXPECT_KILN_ERROR(mgr.set_config({c}), kInvalidArgument, "neither a version number nor one of its version_labels");
  try {
    mgr.find("zzz", std::nullopt, "");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(ModelManager, ModelWithoutVersionsIsUnavailableNotCrashing) {
  TempDir dir("serving");
  ModelManager mgr(no_poll());
  mgr.set_config({cfg("m", dir.path() + "/missing")});
  mgr.poll_now();
  EXPECT_FALSE(mgr.ready());
  try {
    mgr.find("m", std::nullopt, "");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
  }
}

TEST(ModelManager, BatchedPredictFromManyThreadsMatchesTheModel) {
  TempDir dir("serving");
  export_test_model(dir.path(), 1, 5);
  ManagerOptions o = no_poll();
  BatchingOptions b;
  b.max_batch_size = 32;
  b.batch_timeout_micros = 1000;
  b.num_batch_threads = 2;
  o.batching = b;
  ModelManager mgr(o);
  mgr.set_config({cfg("m", dir.path())});
  mgr.poll_now();
  std::atomic<int> bad{0}, merged{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 12; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        auto s = mgr.find("m", std::nullopt, "");
        Tensor x = sample_x(1 + (t + i) % 3, 100 * t + i);
        BatchInfo info;
        Tensor got = s->predict_sync("serving_default", {{"x", x}}, Clock::time_point::max(), &info).at("probs");
        Tensor want = test_model_probs(x, 5);
        auto g = got.to_vector<float>(), w = want.to_vector<float>();
        for (size_t k = 0; k < g.size(); ++k)
          if (std::abs(g[k] - w[k]) > 1e-5) ++bad;
        if (info.batch_size > x.dim(0)) ++merged;
      }
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(merged.load(), 0);
}

long rss_kib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

TEST(ModelManager, MemoryReturnsAfterFiftyReloads) {
  TempDir dir("serving");
  // About 4 MiB of weights per version: a leak of versions would show.
  auto big = [&](int64_t v) {
    auto w = std::make_shared<Variable>(kiln::testing::rand_tensor({1024, 1024}, DType::kF32, -1, 1, v), "w");
    package::ExportSignature s;
    s.fn = [w](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::matmul(x[0], w->value())}; };
    s.inputs = {{"x", {{-1, 1024}, DType::kF32}}};
    s.output_names = {"y"};
    package::ExportOptions eo;
    eo.version = v;
    package::export_package(dir.path(), {s}, eo);
  };
  ModelManager mgr(no_poll());
  mgr.set_config({cfg("m", dir.path())});
  Tensor x = kiln::testing::rand_tensor({8, 1024}, DType::kF32, -1, 1, 1);
  long baseline = 0;
  for (int v = 1; v <= 50; ++v) {
    big(v);
    mgr.poll_now();
    mgr.find("m", std::nullopt, "")->predict_sync("serving_default", {{"x", x}});
    if (v > 1) fs::remove_all(dir.path() + "/" + std::to_string(v - 1));
    if (v == 5) baseline = rss_kib();
  }
  EXPECT_EQ(mgr.loads(), 50);
  // The sanitizers keep freed memory (quarantine, shadow): RSS says nothing there, and
  // LeakSanitizer checks that every unloaded version was freed.
  if (kiln::testing::kSanitized) GTEST_SKIP() << "RSS check only without sanitizers (50 reloads ran)";
  const long grown = rss_kib() - baseline;
  EXPECT_LT(grown, 40 * 1024) << "RSS grew by " << grown << " KiB over 45 reloads";
}

}  // namespace
}  // namespace kiln::serving
