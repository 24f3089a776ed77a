// Warm-up: assets.extra/tf_serving_warmup_requests (TFRecord of PredictionLog, written
// here with kiln's TFRecord writer as TensorFlow Serving users write it) is replayed
// before a version serves; a corrupt file or a failing request keeps the version out.
#include <filesystem>

#include "kiln/core/file_io.h"
#include "kiln/data/tfrecord.h"
#include "kiln/serving/model_manager.h"
#include "package/tf_tensor_proto.h"
#include "serving/warmup.h"
#include "serving_test_util.h"
#include "tensorflow_serving/apis/prediction_log.pb.h"

namespace kiln::serving {
namespace {
namespace fs = std::filesystem;
using kiln::testing::TempDir;

std::string predict_log(const std::string& input_name, const Tensor& x, const std::string& signature = "") {
  tensorflow::serving::PredictionLog log;
  auto* req = log.mutable_predict_log()->mutable_request();
  req->mutable_model_spec()->set_name("m");
  req->mutable_model_spec()->set_signature_name(signature);
  tf::tensor_to_proto(x, &(*req->mutable_inputs())[input_name]);
  return log.SerializeAsString();
}

std::string classify_log(const Tensor& x) {
  tensorflow::serving::PredictionLog log;
  auto* req = log.mutable_classify_log()->mutable_request();
  req->mutable_model_spec()->set_signature_name("classify");
  auto* ex = req->mutable_input()->mutable_example_list()->add_examples();
  auto& f = (*ex->mutable_features()->mutable_feature())["x"];
  for (float v : x.to_vector<float>()) f.mutable_float_list()->add_value(v);
  return log.SerializeAsString();
}

// A package version whose assets.extra holds the given warm-up records (or raw bytes).
void export_with_warmup(const std::string& base, int64_t version, const std::vector<std::string>& records,
                        const std::string& raw = "") {
  testing::export_test_model(base, version, version);
  fs::path extra = fs::path(base) / std::to_string(version) / package::kAssetsExtraDir;
  fs::create_directories(extra);
  const std::string file = (extra / kWarmupFile).string();
  if (!raw.empty()) {
    kiln::testing::write_bytes(file, raw);
    return;
  }
  data::TFRecordWriter w(file);
  for (auto& r : records) w.write(r);
  w.close();
}

ManagerOptions with_warmup(std::vector<int>* counts) {
  ManagerOptions o;
  o.poll_seconds = 0;
  o.load.verify_sha256 = false;  // assets.extra was added after export: not in the manifest
  o.warmup = [counts](const Servable& s) { counts->push_back(run_warmup(s)); };
  return o;
}

ModelConfig cfg(const std::string& base) {
  ModelConfig c;
  c.name = "m";
  c.base_path = base;
  return c;
}

TEST(Warmup, RequestsAreReplayedBeforeTheVersionServes) {
  TempDir dir("warmup");
  Tensor x = kiln::testing::rand_tensor({2, 4}, DType::kF32, -1, 1, 3);
  export_with_warmup(dir.path(), 1, {predict_log("x", x), predict_log("x", x), classify_log(kiln::testing::rand_tensor({4}, DType::kF32, -1, 1, 4))});
  std::vector<int> counts;
  ModelManager mgr(with_warmup(&counts));
  mgr.set_config({cfg(dir.path())});
  mgr.poll_now();
  ASSERT_EQ(counts, std::vector<int>({3}));
  EXPECT_EQ(mgr.find("m", std::nullopt, "")->version(), 1);
}

TEST(Warmup, NoFileMeansNoWarmup) {
  TempDir dir("warmup");
  testing::export_test_model(dir.path(), 1, 1);
  std::vector<int> counts;
  ModelManager mgr(with_warmup(&counts));
  mgr.set_config({cfg(dir.path())});
  mgr.poll_now();
  EXPECT_EQ(counts, std::vector<int>({0}));
}

TEST(Warmup, BadFilesAndFailingRequestsKeepTheVersionOut) {
  TempDir dir("warmup");
  Tensor x = kiln::testing::rand_tensor({2, 4}, DType::kF32, -1, 1, 3);
  testing::export_test_model(dir.path(), 1, 1);
  export_with_warmup(dir.path(), 2, {predict_log("x", x), predict_log("nope", x)});  // unknown input
  std::vector<int> counts;
  ModelManager mgr(with_warmup(&counts));
  mgr.set_config({cfg(dir.path())});
  mgr.poll_now();
  EXPECT_EQ(mgr.find("m", std::nullopt, "")->version(), 1);
  auto st = mgr.status("m")[0];
  EXPECT_EQ(st.version, 2);
  EXPECT_EQ(st.state, VersionState::kEnd);
  EXPECT_EQ(st.status.code, Code::kInvalidArgument);
  EXPECT_NE(st.status.message.find("request 1 failed"), std::string::npos) << st.status.message;
  EXPECT_NE(st.status.message.find("needs input 'x'"), std::string::npos) << st.status.message;

  // A truncated file, and one that is not TFRecord at all: DATA_LOSS naming the file.
  fs::remove_all(dir.path() + "/2");
  data::TFRecordWriter(dir.path() + "/tmp.tfrecord").write(predict_log("x", x));
  export_with_warmup(dir.path(), 2, {}, read_file(dir.path() + "/tmp.tfrecord").substr(0, 30));
  mgr.poll_now();
  st = mgr.status("m")[0];
  EXPECT_EQ(st.status.code, Code::kDataLoss) << st.status.message;
  EXPECT_NE(st.status.message.find("tf_serving_warmup_requests"), std::string::npos) << st.status.message;
  fs::remove_all(dir.path() + "/2");
  export_with_warmup(dir.path(), 2, {}, "not a tfrecord file at all");
  mgr.poll_now();
  EXPECT_EQ(mgr.status("m")[0].status.code, Code::kDataLoss);
  EXPECT_EQ(mgr.find("m", std::nullopt, "")->version(), 1);
}

}  // namespace
}  // namespace kiln::serving
