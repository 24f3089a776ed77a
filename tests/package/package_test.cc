// Model packages: export from functions, load, run; the references are the same
// callables run eagerly. Corrupt, incompatible and inconsistent packages get typed
// errors naming the file and the cause.
#include <filesystem>
#include <fstream>
#include <thread>

#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/file_io.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "kiln/package/export.h"
#include "kiln/package/saved_model.h"
#include "package/package_internal.h"
#include "test_util.h"

namespace kiln::package {
namespace {
namespace fs = std::filesystem;
using testing::rand_tensor;

using kiln::testing::TempDir;

struct Mlp {
  Variable w1{rand_tensor({4, 8}, DType::kF32, -1, 1, 1), "w1"};
  Variable b1{rand_tensor({8}, DType::kF32, -1, 1, 2), "b1"};
  Variable w2{rand_tensor({8, 3}, DType::kF32, -1, 1, 3), "w2"};
  std::vector<Tensor> operator()(const std::vector<Tensor>& x) const {
    Tensor h = ops::relu(ops::add(ops::matmul(x[0], w1.value()), b1.value()));
    return {ops::softmax(ops::matmul(h, w2.value()), -1)};
  }
  ExportSignature signature() const {
    ExportSignature s;
    s.fn = [this](const std::vector<Tensor>& x) { return (*this)(x); };
    s.inputs = {{"x", {{-1, 4}, DType::kF32}}};
    s.output_names = {"probs"};
    return s;
  }
};

std::string export_mlp(const Mlp& m, const std::string& base, ExportOptions opts = {}) {
  ExportSignature classify = m.signature();
  classify.name = "classify";
  classify.method = kClassifyMethod;
  classify.fn = [&m](const std::vector<Tensor>& x) {
    Tensor p = m(x)[0];
    return std::vector<Tensor>{p, ops::argmax(p, -1)};
  };
  classify.output_names = {"scores", "classes"};
  return export_package(base, {m.signature(), classify}, opts);
}

// Rewrites the manifest's sizes and checksums after a test edits a file, so that the
// loader's later checks (not the checksum) see the edit.
void reseal(const std::string& dir) {
  const std::string mpath = dir + "/" + kManifestFile;
  Manifest m = internal::parse_manifest(read_file(mpath), mpath);
  for (ManifestFile& f : m.files) {
    const std::string p = dir + "/" + f.path;
    f.bytes = static_cast<int64_t>(fs::file_size(p));
    f.sha256 = sha256_file(p);
  }
  write_file_atomic(mpath, internal::manifest_json(m));
}

ModelPackageProto read_proto(const std::string& dir) {
  ModelPackageProto p;
  EXPECT_TRUE(p.ParseFromString(read_file(dir + "/" + kGraphFile)));
  return p;
}
void write_proto(const std::string& dir, const ModelPackageProto& p) {
  std::string bytes;
  ASSERT_TRUE(p.SerializeToString(&bytes));
  write_file_atomic(dir + "/" + kGraphFile, bytes);
  reseal(dir);
}

TEST(PackageTest, ExportLoadRunMatchesEagerAtAnyBatchSize) {
  TempDir tmp("package");
  Mlp m;
  const std::string dir = export_mlp(m, tmp.path() + "/mlp");
  EXPECT_EQ(dir, tmp.path() + "/mlp/1");
  auto model = SavedModel::load(dir);
  ASSERT_EQ(model->signatures().size(), 2u);
  const Signature& s = model->signature("serving_default");
  EXPECT_EQ(s.method, kPredictMethod);
  ASSERT_EQ(s.inputs.size(), 1u);
  EXPECT_EQ(s.inputs[0].spec.shape, (std::vector<int64_t>{-1, 4}));
  ASSERT_EQ(s.outputs.size(), 1u);
  EXPECT_EQ(s.outputs[0].name, "probs");
  EXPECT_EQ(s.outputs[0].spec.shape, (std::vector<int64_t>{-1, 3}));  // batch open, classes fixed
  const Signature& c = model->signature("classify");
  EXPECT_EQ(c.outputs[1].spec.dtype, DType::kI64);
  EXPECT_EQ(c.outputs[1].spec.shape, (std::vector<int64_t>{-1}));
  // Three weights, stored once although both signatures read them.
  EXPECT_EQ(model->num_weights(), 3);
  EXPECT_EQ(model->weight_bytes(), (4 * 8 + 8 + 8 * 3) * 4);
  for (int64_t batch : {1, 2, 7, 64}) {
    Tensor x = rand_tensor({batch, 4}, DType::kF32, -2, 2, static_cast<uint64_t>(batch));
    auto out = model->run("serving_default", {{"x", x}});
    EXPECT_CLOSE(out.at("probs"), m({x})[0], 1e-5, 1e-6);
    auto cl = model->run("classify", std::vector<Tensor>{x});
    EXPECT_CLOSE(cl[1], ops::argmax(m({x})[0], -1), 0, 0);
  }
  // The graph was fused at load (matmul + bias + ReLU).
  EXPECT_EQ(model->graph("serving_default").count_ops("fused_matmul"), 1);
}

TEST(PackageTest, FrozenWeightsKeepTheirExportValues) {
  TempDir tmp("package");
  Mlp m;
  auto model = SavedModel::load(export_mlp(m, tmp.path()));
  Tensor x = rand_tensor({3, 4}, DType::kF32, -1, 1, 5);
  Tensor before = m({x})[0];
  m.w2.assign(ops::mul(m.w2.value(), Tensor::scalar(2.0f)));  // training goes on
  EXPECT_CLOSE(model->run("serving_default", std::vector<Tensor>{x})[0], before, 1e-5, 1e-6);
}

bool mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(path) != std::string::npos) return true;
  return false;
}

TEST(PackageTest, OutputsThatAreWeightsAreCopies) {
  TempDir tmp("package");
  Variable w(Tensor::from_vector<float>({1, 2, 3}, {3}), "w");
  ExportSignature s;
  s.fn = [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::reshape(w.value(), {1, 3}), x[0]}; };
  s.inputs = {{"x", {{-1}, DType::kF32}}};
  s.output_names = {"w", "x"};
  auto model = SavedModel::load(export_package(tmp.path(), {s}));
  Tensor x = Tensor::from_vector<float>({5}, {1});
  auto out = model->run("serving_default", {{"x", x}});
  out.at("w").data<float>()[0] = 42;  // the weights live in a read-only mapping: this must be a copy
  EXPECT_EQ(model->run("serving_default", {{"x", x}}).at("w").to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(PackageTest, WeightsAreMemoryMappedForTheModelsLifetime) {
  TempDir tmp("package");
  Mlp m;
  const std::string dir = export_mlp(m, tmp.path());
  const std::string weights = fs::canonical(dir + "/" + kWeightsFile).string();
  {
    auto model = SavedModel::load(dir);
    EXPECT_TRUE(mapped(weights));
  }
  EXPECT_FALSE(mapped(weights));
}

TEST(PackageTest, VersionsCountUpAndExistingOnesAreKept) {
  TempDir tmp("package");
  Mlp m;
  EXPECT_EQ(export_mlp(m, tmp.path()), tmp.path() + "/1");
  EXPECT_EQ(export_mlp(m, tmp.path()), tmp.path() + "/2");
  ExportOptions o;
  o.version = 2;
  EXPECT_KILN_ERROR(export_mlp(m, tmp.path(), o), kFailedPrecondition, "exists already");
  o.overwrite = true;
  EXPECT_EQ(export_mlp(m, tmp.path(), o), tmp.path() + "/2");
  o.version = 10;
  EXPECT_EQ(export_mlp(m, tmp.path(), o), tmp.path() + "/10");
  fs::create_directories(fs::path(tmp.path()) / "7.tmp-1-0");  // an interrupted export: not a version
  fs::create_directories(fs::path(tmp.path()) / "007");
  EXPECT_EQ(list_versions(tmp.path()), (std::vector<int64_t>{1, 2, 10}));
  EXPECT_EQ(resolve_version_dir(tmp.path()), tmp.path() + "/10");
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-") == std::string::npos ||
                  e.path().filename() == "7.tmp-1-0",
              true);
}

TEST(PackageTest, MetadataAndAssetsRoundTrip) {
  TempDir tmp("package");
  Mlp m;
  const std::string labels = tmp.path() + "/labels.txt";
  write_file_atomic(labels, "a\nb\nc\n");
  ExportOptions o;
  o.metadata.model_name = "tiny";
  o.metadata.training_data = "random";
  o.metadata.hyperparameters["lr"] = "0.1";
  o.metadata.metrics["accuracy"] = 0.75;
  o.metadata.tags["team"] = "kiln";
  o.assets = {labels};
  o.assets_extra = {labels};
  auto model = SavedModel::load(export_mlp(m, tmp.path() + "/b", o));
  const Metadata& md = model->metadata();
  EXPECT_EQ(md.model_name, "tiny");
  EXPECT_EQ(md.training_data, "random");
  EXPECT_EQ(md.hyperparameters.at("lr"), "0.1");
  EXPECT_EQ(md.metrics.at("accuracy"), 0.75);
  EXPECT_EQ(md.tags.at("team"), "kiln");
  EXPECT_EQ(md.precision, "fp32");
  EXPECT_EQ(md.producer.rfind("kiln ", 0), 0u);
  EXPECT_GT(md.created_unix_ms, 1'600'000'000'000);
  EXPECT_EQ(read_file(model->dir() + "/assets/labels.txt"), "a\nb\nc\n");
  EXPECT_EQ(read_file(model->dir() + "/assets.extra/labels.txt"), "a\nb\nc\n");
  std::vector<std::string> listed;
  for (const auto& f : model->manifest().files) listed.push_back(f.path);
  EXPECT_EQ(listed, (std::vector<std::string>{"assets.extra/labels.txt", "assets/labels.txt", kGraphFile, kWeightsFile}));
  EXPECT_EQ(model->manifest().files[0].sha256, sha256_hex("a\nb\nc\n", 6));
  EXPECT_KILN_ERROR(export_mlp(m, tmp.path() + "/c", [] {
                      ExportOptions x;
                      x.assets = {"/nonexistent/vocab.txt"};
                      return x;
                    }()),
                    kNotFound, "/nonexistent/vocab.txt");
  EXPECT_TRUE(list_versions(tmp.path() + "/c").empty());  // nothing half-written
}

TEST(PackageTest, Sha256MatchesKnownVectors) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(PackageTest, BadSignaturesAreRefusedAtExport) {
  TempDir tmp("package");
  Mlp m;
  EXPECT_KILN_ERROR(export_package(tmp.path(), {}), kInvalidArgument, "no signatures");
  EXPECT_KILN_ERROR(export_package(tmp.path(), {m.signature(), m.signature()}), kInvalidArgument, "given twice");
  ExportSignature s = m.signature();
  s.output_names = {"a", "b"};
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kInvalidArgument, "names 2 outputs, the function returns 1");
  s = m.signature();
  s.method = kClassifyMethod;
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kInvalidArgument, "may only output 'scores' and 'classes'");
  s.method = kRegressMethod;
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kInvalidArgument, "one output named 'outputs'");
  s.method = "tensorflow/serving/explain";
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kInvalidArgument, "unknown method");
  s = m.signature();
  s.inputs[0].name = "";
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kInvalidArgument, "empty name");
  // A trace that fixes the open batch size (a constant of the traced batch's shape).
  s = m.signature();
  s.fn = [&m](const std::vector<Tensor>& x) {
    return m({ops::add(x[0], rand_tensor({x[0].dim(0), 4}, DType::kF32))});
  };
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kInvalidArgument, "fixes a size its input signature leaves open");
  // Side effects and random numbers cannot be exported.
  Variable counter(Tensor::scalar(0.0f), "counter");
  s = m.signature();
  s.fn = [&](const std::vector<Tensor>& x) {
    counter.assign(ops::add(counter.value(), Tensor::scalar(1.0f)));
    return m(x);
  };
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kInvalidArgument, "assigns variables");
  s = m.signature();
  s.fn = [&](const std::vector<Tensor>& x) { return m({ops::add(x[0], ops::random_uniform(x[0].shape()))}); };
  EXPECT_KILN_ERROR(export_package(tmp.path(), {s}), kUnimplemented, "random op");
  EXPECT_TRUE(list_versions(tmp.path()).empty());
}

TEST(PackageTest, RunChecksInputs) {
  TempDir tmp("package");
  Mlp m;
  auto model = SavedModel::load(export_mlp(m, tmp.path()));
  Tensor x = rand_tensor({2, 4}, DType::kF32);
  EXPECT_KILN_ERROR(model->run("nope", {{"x", x}}), kNotFound, "no signature 'nope' (it has: serving_default, classify)");
  EXPECT_KILN_ERROR(model->run("serving_default", std::map<std::string, Tensor>{}), kInvalidArgument,
                    "needs input 'x'");
  EXPECT_KILN_ERROR(model->run("serving_default", {{"x", x}, {"y", x}}), kInvalidArgument, "no input named 'y'");
  EXPECT_KILN_ERROR(model->run("serving_default", {{"x", x.to(DType::kF64)}}), kInvalidArgument,
                    "input 'x' of signature 'serving_default' must be f32[-1, 4], got f64[2, 4]");
  EXPECT_KILN_ERROR(model->run("serving_default", {{"x", rand_tensor({2, 5}, DType::kF32)}}), kInvalidArgument,
                    "must be f32[-1, 4]");
  EXPECT_KILN_ERROR(model->run("serving_default", std::vector<Tensor>{}), kInvalidArgument, "takes 1 inputs, got 0");
  // Still serving after the errors.
  EXPECT_CLOSE(model->run("serving_default", {{"x", x}}).at("probs"), m({x})[0], 1e-5, 1e-6);
}

TEST(PackageTest, MissingAndCorruptFilesAreNamed) {
  TempDir tmp("package");
  Mlp m;
  EXPECT_KILN_ERROR(SavedModel::load(tmp.path() + "/none"), kNotFound, "no such directory");
  EXPECT_KILN_ERROR(SavedModel::load(tmp.path()), kNotFound, "manifest.json is missing");
  EXPECT_KILN_ERROR(resolve_version_dir(tmp.path()), kNotFound, "no numeric version directories");
  const std::string dir = export_mlp(m, tmp.path() + "/m");
  const std::string weights = dir + "/" + kWeightsFile;
  const std::string good = read_file(weights);
  // Truncated weights.
  write_file_atomic(weights, good.substr(0, good.size() - 10));
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "variables.safetensors is " + std::to_string(good.size() - 10) + " bytes, the manifest says " + std::to_string(good.size()) + " (truncated)");
  // One flipped bit: the SHA-256 catches it; without SHA-256, the CRC-32C does.
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 1;
  write_file_atomic(weights, flipped);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "variables.safetensors: SHA-256 mismatch");
  LoadOptions fast;
  fast.verify_sha256 = false;
  EXPECT_KILN_ERROR(SavedModel::load(dir, fast), kDataLoss, "checksum mismatch in tensor");
  write_file_atomic(weights, good);
  // A file the manifest lists is gone.
  fs::rename(dir + "/" + kGraphFile, dir + "/x");
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "model.pb is listed in the manifest but missing");
  fs::rename(dir + "/x", dir + "/" + kGraphFile);
  EXPECT_NO_THROW(SavedModel::load(dir));
  // Garbage model.pb (resealed, so the parser sees it).
  write_file_atomic(dir + "/" + kGraphFile, std::string("\xff\xff\xff\xff garbage", 12));
  reseal(dir);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "model.pb is corrupted");
}

TEST(PackageTest, ManifestProblems) {
  TempDir tmp("package");
  Mlp m;
  const std::string dir = export_mlp(m, tmp.path());
  const std::string mpath = dir + "/" + kManifestFile;
  const std::string good = read_file(mpath);
  Manifest mf = internal::parse_manifest(good, mpath);
  EXPECT_EQ(mf.format_version, kFormatVersion);
  // A newer producer that old consumers must not read.
  Manifest newer = mf;
  newer.format_version = 7;
  newer.min_consumer_version = 7;
  newer.producer = "kiln 9.0.0";
  write_file_atomic(mpath, internal::manifest_json(newer));
  EXPECT_KILN_ERROR(SavedModel::load(dir), kFailedPrecondition,
                    "(written by kiln 9.0.0) needs consumer format version >= 7; this kiln reads format version 1");
  // A newer producer that stays readable loads.
  newer.min_consumer_version = 1;
  write_file_atomic(mpath, internal::manifest_json(newer));
  EXPECT_NO_THROW(SavedModel::load(dir));
  Manifest other = mf;
  other.format = "tf-saved-model";
  write_file_atomic(mpath, internal::manifest_json(other));
  EXPECT_KILN_ERROR(SavedModel::load(dir), kFailedPrecondition, "format 'tf-saved-model' is not kiln-model-1");
  struct Case {
    std::string text, error;
  };
  const std::vector<Case> cases = {
      {"{", "not valid JSON"},
      {"[]", "not a JSON object"},
      {R"({"format":"kiln-model-1"})", "no 'format_version' field"},
      {R"({"format":1,"format_version":1,"min_consumer_version":1,"producer":"","files":[]})", "'format' has the wrong type"},
      {R"({"format":"kiln-model-1","format_version":1,"min_consumer_version":1,"producer":"","files":[{"path":"x"}]})",
       "a 'files' entry needs"},
      {R"({"format":"kiln-model-1","format_version":1,"min_consumer_version":1,"producer":"","files":[{"path":"../../etc/passwd","bytes":1,"sha256":")" +
           std::string(64, 'a') + R"("}]})",
       "not a relative path inside the package"},
      {R"({"format":"kiln-model-1","format_version":1,"min_consumer_version":1,"producer":"","files":[{"path":"/etc/passwd","bytes":1,"sha256":")" +
           std::string(64, 'a') + R"("}]})",
       "not a relative path inside the package"},
      {R"({"format":"kiln-model-1","format_version":1,"min_consumer_version":1,"producer":"","files":[{"path":"model.pb","bytes":1,"sha256":"ABC"}]})",
       "64 lowercase hex digits"},
      {R"({"format":"kiln-model-1","format_version":1,"min_consumer_version":1,"producer":"","files":[]})",
       "does not list model.pb"},
  };
  for (const Case& c : cases) {
    write_file_atomic(mpath, c.text);
    EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, c.error);
  }
  write_file_atomic(mpath, good);
  EXPECT_NO_THROW(SavedModel::load(dir));
}

TEST(PackageTest, GraphProblems) {
  TempDir tmp("package");
  Mlp m;
  const std::string dir = export_mlp(m, tmp.path());
  const ModelPackageProto good = read_proto(dir);
  auto op_node = [](ModelPackageProto& p) -> NodeProto& {
    for (NodeProto& n : *p.mutable_functions(0)->mutable_graph()->mutable_nodes())
      if (n.kind() == NodeProto::OP) return n;
    throw std::runtime_error("no op node");
  };
  ModelPackageProto p = good;
  op_node(p).set_op("frobnicate");
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kNotFound, "uses op 'frobnicate', which this build of kiln does not have");
  p = good;
  op_node(p).mutable_inputs(0)->set_node(1000);
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "not an earlier node");
  p = good;
  for (NodeProto& n : *p.mutable_functions(0)->mutable_graph()->mutable_nodes())
    if (n.kind() == NodeProto::CONSTANT) n.set_tensor("ghost");
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "reads weight 'ghost', which is not in variables.safetensors");
  p = good;
  p.mutable_signatures(0)->set_function("nowhere");
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "runs function 'nowhere', which is not defined");
  p = good;
  p.mutable_signatures(0)->mutable_outputs(0)->mutable_spec()->set_shape(1, 5);  // the graph computes 3 classes
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kInvalidArgument, "output 'probs' is declared f32[-1, 5] but the graph computes f32[1, 3]");
  p = good;
  p.mutable_signatures(0)->mutable_inputs(0)->mutable_spec()->set_shape(1, 6);
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kInvalidArgument, "its graph rejects the signature's inputs");
  p = good;
  p.mutable_signatures(0)->mutable_inputs(0)->mutable_spec()->set_dtype("f7");
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "unknown dtype 'f7'");
  p = good;
  p.clear_signatures();
  write_proto(dir, p);
  EXPECT_KILN_ERROR(SavedModel::load(dir), kDataLoss, "no signatures");
  write_proto(dir, good);
  EXPECT_NO_THROW(SavedModel::load(dir));
}

TEST(PackageTest, ConcurrentRunsOnOneModelAgreeWithSerialRuns) {
  TempDir tmp("package");
  Mlp m;
  auto model = SavedModel::load(export_mlp(m, tmp.path()));
  std::vector<Tensor> xs, want;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(rand_tensor({1 + i % 3, 4}, DType::kF32, -1, 1, static_cast<uint64_t>(100 + i)));
    want.push_back(model->run("serving_default", std::vector<Tensor>{xs.back()})[0]);
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 25; ++r) {
        const size_t i = static_cast<size_t>((t + r) % 8);
        Tensor got = model->run("serving_default", std::vector<Tensor>{xs[i]})[0];
        if (got.to_vector<float>() != want[i].to_vector<float>()) ++mismatches;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(PackageTest, ManyBatchSizesStayBounded) {
  TempDir tmp("package");
  Mlp m;
  auto model = SavedModel::load(export_mlp(m, tmp.path()));
  for (int64_t b = 1; b <= 80; ++b) {  // more shapes than the executor keeps plans for
    Tensor x = rand_tensor({b, 4}, DType::kF32, -1, 1, static_cast<uint64_t>(b));
    EXPECT_CLOSE(model->run("serving_default", std::vector<Tensor>{x})[0], m({x})[0], 1e-5, 1e-6);
  }
}

}  // namespace
}  // namespace kiln::package
