// TensorFlow SavedModels (kiln/package/tf_saved_model.h): the committed Keras MLP
// (scripts/fixtures/gen_tf_saved_models.py) against TensorFlow's outputs, the
// TensorBundle reader and its checksums, and the graph importer on hand-built GraphDefs
// (strided-slice masks, batch-dependent shapes, unmapped ops). The other models and the
// server: tests/interop/tf_saved_model.py.
#include "kiln/package/tf_saved_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/core/npy.h"
#include "kiln/graph/executor.h"
#include "kiln/ops.h"
#include "kiln/package/saved_model.h"
#include "package/tf_bundle.h"
#include "package/tf_graph_import.h"
#include "package/tf_tensor_proto.h"
#include "tensorflow/core/protobuf/trackable_object_graph.pb.h"
#include "test_util.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

const std::string kMlp = std::string(testing::fixture_dir()) + "/tf_saved_model/mlp";

TEST(TfSavedModel, TheCommittedKerasMlpEqualsTensorFlow) {
  ASSERT_TRUE(package::is_tf_saved_model(kMlp + "/1"));
  auto m = package::SavedModel::load(kMlp + "/1");
  EXPECT_EQ(m->manifest().format, package::kTfSavedModelFormat);
  EXPECT_NE(m->metadata().producer.find("TensorFlow 2."), std::string::npos) << m->metadata().producer;
  EXPECT_EQ(m->num_weights(), 4);
  EXPECT_EQ(m->weight_bytes(), (12 * 16 + 16 + 16 * 5 + 5) * 4);
  const package::Signature& s = m->signature("serving_default");
  ASSERT_EQ(s.inputs.size(), 1u);
  EXPECT_EQ(s.inputs[0].name, "inputs");
  EXPECT_EQ(s.inputs[0].spec.shape, (std::vector<int64_t>{-1, 12}));
  EXPECT_EQ(s.outputs[0].name, "output_0");
  for (int b : {1, 5}) {
    const std::string ref = kMlp + "/ref/b" + std::to_string(b);
    auto out = m->run("serving_default", {{"inputs", read_npy(ref + "_in0.npy")}});
    EXPECT_CLOSE(out.at("output_0"), read_npy(ref + "_out0.npy"), 1e-4, 1e-5);
  }
  // A base path resolves to its highest version, as for kiln packages.
  EXPECT_EQ(package::resolve_version_dir(kMlp), (fs::path(kMlp) / "1").string());
}

TEST(TfSavedModel, BundleReadsTensorsAndTheObjectGraph) {
  auto b = tf::TensorBundle::open(kMlp + "/1/variables/variables");
  EXPECT_EQ(b->num_shards(), 1);
  EXPECT_TRUE(b->contains("_CHECKPOINTABLE_OBJECT_GRAPH"));
  const std::vector<std::string> blob = b->strings("_CHECKPOINTABLE_OBJECT_GRAPH");
  ASSERT_EQ(blob.size(), 1u);
  tensorflow::TrackableObjectGraph tog;
  ASSERT_TRUE(tog.ParseFromString(blob[0]));
  int variables = 0;
  for (const auto& n : tog.nodes())
    for (const auto& a : n.attributes())
      if (a.name() == "VARIABLE_VALUE") {
        ++variables;
        const Tensor t = b->tensor(a.checkpoint_key());
        EXPECT_EQ(t.dtype(), DType::kF32);
        EXPECT_TRUE(t.shape() == Shape({12, 16}) || t.shape() == Shape({16}) || t.shape() == Shape({16, 5}) ||
                    t.shape() == Shape({5}))
            << t.desc();
      }
  EXPECT_EQ(variables, 4);
  EXPECT_KILN_ERROR(b->tensor("nope"), kNotFound, "has no tensor 'nope'");
  EXPECT_KILN_ERROR(b->tensor("_CHECKPOINTABLE_OBJECT_GRAPH"), kUnimplemented, "DT_STRING");
}

// A copy of the fixture to damage.
std::string copy_mlp(const TempDir& tmp) {
  const std::string d = tmp.file("mlp");
  fs::copy(kMlp + "/1", d, fs::copy_options::recursive);
  return d;
}
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

TEST(TfSavedModel, DamagedFilesAreTypedErrorsNamingTheFile) {
  TempDir tmp("tf_sm");
  const std::string d = copy_mlp(tmp);
  const std::string data = d + "/variables/variables.data-00000-of-00001";
  const std::string index = d + "/variables/variables.index";
  const std::string good_data = slurp(data), good_index = slurp(index), good_pb = slurp(d + "/saved_model.pb");

  std::string flipped = good_data;
  flipped[20] = static_cast<char>(flipped[20] ^ 0x40);
  testing::write_bytes(data, flipped);
  EXPECT_KILN_ERROR(package::SavedModel::load(d), kDataLoss, "fails its CRC-32C");
  testing::write_bytes(data, good_data.substr(0, 100));
  EXPECT_KILN_ERROR(package::SavedModel::load(d), kDataLoss, "truncated");
  testing::write_bytes(data, good_data);

  testing::write_bytes(index, good_index.substr(0, good_index.size() - 9));
  EXPECT_KILN_ERROR(package::SavedModel::load(d), kDataLoss, "variables.index");
  std::string bad_block = good_index;
  bad_block[5] = static_cast<char>(bad_block[5] ^ 0x01);  // inside the first data block
  testing::write_bytes(index, bad_block);
  EXPECT_KILN_ERROR(package::SavedModel::load(d), kDataLoss, "variables.index");
  testing::write_bytes(index, good_index);

  testing::write_bytes(d + "/saved_model.pb", good_pb.substr(0, good_pb.size() / 3));
  EXPECT_KILN_ERROR(package::SavedModel::load(d), kDataLoss, "saved_model.pb");
  testing::write_bytes(d + "/saved_model.pb", good_pb);
  EXPECT_NO_THROW(package::SavedModel::load(d));

  EXPECT_KILN_ERROR(package::import_tf_saved_model(d, {{"train"}}), kUnimplemented,
                    "has no MetaGraph tagged 'train' (it has: serve)");
  fs::remove(data);
  EXPECT_KILN_ERROR(package::SavedModel::load(d), kNotFound, "variables.data-00000-of-00001");
}

// ---- the importer on hand-built graphs -----------------------------------------------

struct GraphBuilder {
  tensorflow::GraphDef g;
  tensorflow::NodeDef& node(const std::string& name, const std::string& op, std::vector<std::string> inputs = {}) {
    tensorflow::NodeDef* n = g.add_node();
    n->set_name(name);
    n->set_op(op);
    for (const std::string& i : inputs) n->add_input(i);
    return *n;
  }
  void constant(const std::string& name, const Tensor& t) {
    tf::tensor_to_proto(t, (*node(name, "Const").mutable_attr())["value"].mutable_tensor());
  }
  void ints(const std::string& name, const std::vector<int64_t>& v) {
    constant(name, ops::cast(Tensor::from_vector<int64_t>(v, Shape{static_cast<int64_t>(v.size())}), DType::kI32));
  }
};
void set_i(tensorflow::NodeDef& n, const std::string& attr, int64_t v) { (*n.mutable_attr())[attr].set_i(v); }

graph::Graph import(const GraphBuilder& b, std::vector<int64_t> input_shape, const std::string& out) {
  return tf::import_graph(b.g, {{"x", {std::move(input_shape), DType::kF32}}}, {out},
                          [](const tensorflow::NodeDef& n) -> Tensor {
                            throw NotFoundError("no variable " + n.name());
                          });
}
Tensor run(const graph::Graph& g, const Tensor& x) { return graph::Executor(graph::Graph(g)).run({x}).at(0); }

TEST(TfGraphImport, StridedSliceMasksFollowTensorFlow) {
  const Tensor x = ops::reshape(ops::arange(24), {2, 3, 4});
  {  // x[:, 1, ::-2]: begin/end masks on dims 0 and 2, shrink on dim 1
    GraphBuilder b;
    b.node("x", "Placeholder");
    b.ints("b", {0, 1, 0});
    b.ints("e", {0, 2, 0});
    b.ints("s", {1, 1, -2});
    auto& n = b.node("y", "StridedSlice", {"x", "b", "e", "s"});
    set_i(n, "begin_mask", 5);
    set_i(n, "end_mask", 5);
    set_i(n, "shrink_axis_mask", 2);
    const Tensor y = run(import(b, {2, 3, 4}, "y"), x);
    EXPECT_CLOSE(y, Tensor::from_vector<float>({7, 5, 19, 17}, {2, 2}), 0, 0);
  }
  {  // x[..., None, 2]: an ellipsis, a new axis, a shrunk last dim
    GraphBuilder b;
    b.node("x", "Placeholder");
    b.ints("b", {0, 0, 2});
    b.ints("e", {0, 0, 3});
    b.ints("s", {1, 1, 1});
    auto& n = b.node("y", "StridedSlice", {"x", "b", "e", "s"});
    set_i(n, "ellipsis_mask", 1);
    set_i(n, "new_axis_mask", 2);
    set_i(n, "shrink_axis_mask", 4);
    const Tensor y = run(import(b, {2, 3, 4}, "y"), x);
    EXPECT_CLOSE(y, Tensor::from_vector<float>({2, 6, 10, 14, 18, 22}, {2, 3, 1}), 0, 0);
  }
}

TEST(TfGraphImport, ABatchDependentReshapeFollowsTheBatch) {
  // y = reshape(x, stack([shape(x)[0], 2, 3])), as Keras' Flatten/Reshape export it.
  GraphBuilder b;
  b.node("x", "Placeholder");
  b.node("shape", "Shape", {"x"});
  b.ints("b", {0});
  b.ints("e", {1});
  b.ints("s", {1});
  set_i(b.node("batch", "StridedSlice", {"shape", "b", "e", "s"}), "shrink_axis_mask", 1);
  b.constant("two", Tensor::scalar<int32_t>(2));
  b.constant("three", Tensor::scalar<int32_t>(3));
  b.node("dims", "Pack", {"batch", "two", "three"});
  b.node("y", "Reshape", {"x", "dims"});
  const graph::Graph g = import(b, {-1, 6}, "y");
  for (int64_t n : {1, 4, 7}) {
    const Tensor x = testing::rand_tensor({n, 6}, DType::kF32);
    const Tensor y = run(g, x);
    EXPECT_EQ(y.shape(), Shape({n, 2, 3}));
    EXPECT_CLOSE(y, ops::reshape(x, {n, 2, 3}), 0, 0);
  }
}

TEST(TfGraphImport, OtherBatchDependentShapesAreUnimplemented) {
  // x + fill(shape(x), 1): the fill's shape is the batch's.
  GraphBuilder b;
  b.node("x", "Placeholder");
  b.node("shape", "Shape", {"x"});
  b.constant("one", Tensor::scalar<float>(1));
  b.node("ones", "Fill", {"shape", "one"});
  b.node("y", "AddV2", {"x", "ones"});
  EXPECT_KILN_ERROR(import(b, {-1, 3}, "y"), kUnimplemented, "depends on the size of an open input dimension");
  // With a fixed shape the same graph imports.
  EXPECT_CLOSE(run(import(b, {2, 3}, "y"), ops::zeros({2, 3})), ops::ones({2, 3}), 0, 0);
}

TEST(TfGraphImport, FusedBatchNormWithGivenOrBatchStatistics) {
  // x [2, 2] normalised per channel (the last axis), eps 0: hand-computed.
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 6}, {2, 2});
  for (bool training : {false, true}) {
    GraphBuilder b;
    b.node("x", "Placeholder");
    b.constant("scale", Tensor::from_vector<float>({2, 1}, {2}));
    b.constant("offset", Tensor::from_vector<float>({0, 1}, {2}));
    b.constant("mean", Tensor::from_vector<float>({1, 2}, {2}));
    b.constant("var", Tensor::from_vector<float>({4, 16}, {2}));
    auto& n = b.node("bn", "FusedBatchNormV3", {"x", "scale", "offset", "mean", "var"});
    (*n.mutable_attr())["epsilon"].set_f(0);
    (*n.mutable_attr())["is_training"].set_b(training);
    b.node("y", "Identity", {"bn:0"});
    const Tensor y = run(import(b, {2, 2}, "y"), x);
    // Given statistics: (x - [1, 2]) / [2, 4] * [2, 1] + [0, 1]; the batch's: mean [2, 4],
    // biased variance [1, 4].
    const Tensor want = training ? Tensor::from_vector<float>({-2, 0, 2, 2}, {2, 2})
                                 : Tensor::from_vector<float>({0, 1, 2, 2}, {2, 2});
    SCOPED_TRACE(training ? "batch statistics" : "given statistics");
    EXPECT_CLOSE(y, want, 1e-6, 1e-6);
  }
}

TEST(TfGraphImport, EveryUnmappedOpIsListedWithItsNodes) {
  GraphBuilder b;
  b.node("x", "Placeholder");
  b.node("c1", "Cumsum", {"x", "x"});
  b.node("c2", "Cumsum", {"c1", "x"});
  b.node("w", "WhileLoop", {"c2"});
  b.node("y", "Relu", {"w"});
  const auto missing = tf::unsupported_ops(b.g, {"y"});
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing.at("Cumsum"), (std::set<std::string>{"c1", "c2"}));
  EXPECT_EQ(missing.at("WhileLoop"), (std::set<std::string>{"w"}));
  EXPECT_KILN_ERROR(import(b, {-1, 3}, "y"), kUnimplemented, "2 TensorFlow op(s) the graph uses: Cumsum (c1, c2); WhileLoop (w)");
}

TEST(TfGraphImport, BrokenGraphsAreDataLoss) {
  GraphBuilder b;
  b.node("x", "Placeholder");
  b.node("y", "Relu", {"nope"});
  EXPECT_KILN_ERROR(import(b, {2}, "y"), kDataLoss, "refers to node 'nope'");
  GraphBuilder c;
  c.node("x", "Placeholder");
  c.node("a", "Relu", {"b"});
  c.node("b", "Relu", {"a"});
  EXPECT_KILN_ERROR(import(c, {2}, "b"), kDataLoss, "cycle");
  GraphBuilder d;
  d.node("x", "Placeholder");
  d.node("y", "Relu", {"x:x"});
  EXPECT_KILN_ERROR(import(d, {2}, "y"), kDataLoss, "malformed output index");
  GraphBuilder m;  // too few inputs (the fuzzer's find): typed, before the op reads them
  m.node("x", "Placeholder");
  m.node("y", "Mean", {"x"});
  EXPECT_KILN_ERROR(import(m, {2, 3}, "y"), kDataLoss, "has 1 inputs; it takes at least 2");
  GraphBuilder e;
  e.node("x", "Placeholder");
  (*e.node("y", "StatefulPartitionedCall", {"x"}).mutable_attr())["f"].mutable_func()->set_name("missing_fn");
  EXPECT_KILN_ERROR(import(e, {2}, "y"), kDataLoss, "calls function 'missing_fn'");
}

}  // namespace
}  // namespace kiln
