// TensorFlow SavedModels -> kiln signatures and graphs (kiln/package/tf_saved_model.h).
#include "kiln/package/tf_saved_model.h"

#include <algorithm>
#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "tensorflow/core/protobuf/saved_model.pb.h"
#include "tensorflow/core/protobuf/trackable_object_graph.pb.h"
#include "tf_bundle.h"
#include "tf_graph_import.h"
#include "tf_types.h"

namespace kiln::package {
namespace fs = std::filesystem;

namespace {

std::string tag_list(const std::set<std::string>& tags) {
  std::string s;
  for (const std::string& t : tags) s += (s.empty() ? "" : ",") + t;
  return s;
}

// The checkpoint key of each top-level VarHandleOp that a traced function captures: a
// call node's trailing inputs are its function's captures, whose object-graph nodes
// (SavedConcreteFunction.bound_inputs) are the checkpoint's object-graph nodes, whose
// VARIABLE_VALUE attribute names the bundle key.
std::map<std::string, std::string> handle_keys(const tensorflow::MetaGraphDef& mg, const tf::TensorBundle& bundle) {
  std::map<std::string, std::string> out;
  const char* kGraphKey = "_CHECKPOINTABLE_OBJECT_GRAPH";
  if (!bundle.contains(kGraphKey) || mg.object_graph_def().concrete_functions().empty()) return out;
  const std::vector<std::string> blob = bundle.strings(kGraphKey);
  tensorflow::TrackableObjectGraph tog;
  if (blob.size() != 1 || !tog.ParseFromString(blob[0]))
    throw DataLossError(bundle.prefix() + ".index: " + kGraphKey + " is not a TrackableObjectGraph");
  std::map<int, std::string> node_key;
  for (int i = 0; i < tog.nodes_size(); ++i)
    for (const auto& a : tog.nodes(i).attributes())
      if (a.name() == "VARIABLE_VALUE") node_key[i] = a.checkpoint_key();
  std::map<std::string, const tensorflow::NodeDef*> nodes;
  for (const auto& n : mg.graph_def().node()) nodes[n.name()] = &n;
  for (const auto& n : mg.graph_def().node()) {
    if (n.op() != "StatefulPartitionedCall" && n.op() != "PartitionedCall") continue;
    auto f = n.attr().find("f");
    if (f == n.attr().end()) continue;
    auto cf = mg.object_graph_def().concrete_functions().find(f->second.func().name());
    if (cf == mg.object_graph_def().concrete_functions().end()) continue;
    std::vector<std::string> data;
    for (const std::string& in : n.input())
      if (!in.empty() && in[0] != '^') data.push_back(in.substr(0, in.find(':')));
    const auto& bound = cf->second.bound_inputs();
    if (bound.size() > static_cast<int>(data.size())) continue;
    const size_t first = data.size() - static_cast<size_t>(bound.size());
    for (int j = 0; j < bound.size(); ++j) {
      const std::string& handle = data[first + static_cast<size_t>(j)];
      auto hn = nodes.find(handle);
      auto key = node_key.find(bound[j]);
      if (hn == nodes.end() || hn->second->op() != "VarHandleOp" || key == node_key.end()) continue;
      auto [it, fresh] = out.emplace(handle, key->second);
      if (!fresh && it->second != key->second)
        throw DataLossError("variable handle '" + handle + "' is bound to both '" + it->second + "' and '" +
                            key->second + "'");
    }
  }
  return out;
}

// A signature's tensor name "node:0" -> its spec; DT_STRING and unknown-rank tensors
// are not importable (the reason is returned instead).
std::string to_spec(const tensorflow::TensorInfo& t, TensorSpec* spec) {
  if (t.encoding_case() != tensorflow::TensorInfo::kName) return "a sparse or composite tensor";
  if (t.dtype() == tensorflow::DT_STRING) return "a string tensor (kiln has no string tensors)";
  const std::optional<DType> dt = tf::from_tf_dtype(t.dtype());
  if (!dt) return "dtype " + tensorflow::DataType_Name(t.dtype());
  if (t.tensor_shape().unknown_rank()) return "a tensor of unknown rank";
  spec->dtype = *dt;
  spec->shape.clear();
  for (const auto& d : t.tensor_shape().dim()) spec->shape.push_back(d.size() < 0 ? -1 : d.size());
  return "";
}

}  // namespace

bool is_tf_saved_model(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kTfSavedModelFile, ec);
}

TfImport import_tf_saved_model(const std::string& dir, const TfImportOptions& opts) {
  const std::string pb_path = (fs::path(dir) / kTfSavedModelFile).string();
  tensorflow::SavedModel sm;
  {
    const std::string bytes = read_file(pb_path);
    if (!sm.ParseFromString(bytes)) throw DataLossError(pb_path + " is corrupted or truncated: not a SavedModel message");
  }
  const tensorflow::MetaGraphDef* mg = nullptr;
  std::string have;
  for (const auto& m : sm.meta_graphs()) {
    const std::set<std::string> tags(m.meta_info_def().tags().begin(), m.meta_info_def().tags().end());
    if (tags == opts.tags) mg = &m;
    have += (have.empty() ? "" : "; ") + tag_list(tags);
  }
  if (!mg)
    throw UnimplementedError(pb_path + " has no MetaGraph tagged '" + tag_list(opts.tags) + "' (it has: " +
                             (have.empty() ? "none" : have) + ")");

  TfImport out;
  out.metadata.producer = "TensorFlow " + mg->meta_info_def().tensorflow_version();
  out.metadata.model_name = fs::path(dir).lexically_normal().parent_path().filename().string();
  out.metadata.tags["tf_saved_model_tags"] = tag_list(opts.tags);

  // Variables: read lazily (a signature reads only its own) and once.
  const fs::path var_prefix = fs::path(dir) / "variables" / "variables";
  std::unique_ptr<tf::TensorBundle> bundle;
  std::map<std::string, std::string> keys;
  std::error_code ec;
  if (fs::exists(var_prefix.string() + ".index", ec)) {
    bundle = tf::TensorBundle::open(var_prefix.string());
    keys = handle_keys(*mg, *bundle);
  }
  std::map<std::string, Tensor> read;
  const tf::VariableResolver resolve = [&](const tensorflow::NodeDef& n) -> Tensor {
    std::string shared = n.name();
    if (auto s = n.attr().find("shared_name"); s != n.attr().end() && !s->second.s().empty()) shared = s->second.s();
    if (!bundle) throw NotFoundError(var_prefix.string() + ".index is missing; variable '" + shared + "' has no value");
    std::string key;
    if (auto k = keys.find(n.name()); k != keys.end()) key = k->second;
    else if (bundle->contains(shared)) key = shared;  // TF1 savers key variables by name
    else if (bundle->contains(n.name())) key = n.name();
    else
      throw NotFoundError("variable '" + shared + "' (node '" + n.name() + "') has no value in " + bundle->prefix() +
                          ".index");
    auto it = read.find(key);
    if (it == read.end()) {
      it = read.emplace(key, bundle->tensor(key)).first;
      out.weight_bytes += static_cast<int64_t>(it->second.nbytes());
      ++out.num_weights;
    }
    return it->second;
  };

  std::vector<std::string> names;
  for (const auto& [name, _] : mg->signature_def()) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const tensorflow::SignatureDef& sd = mg->signature_def().at(name);
    if (name == "__saved_model_init_op") continue;
    TfSignature ts;
    ts.signature.name = name;
    ts.signature.method = sd.method_name().empty() ? kPredictMethod : sd.method_name();
    std::vector<tf::GraphInput> inputs;
    std::vector<std::string> outputs;
    std::string why;
    auto collect = [&](const google::protobuf::Map<std::string, tensorflow::TensorInfo>& m, bool is_input) {
      std::vector<std::string> ks;
      for (const auto& [k, _] : m) ks.push_back(k);
      std::sort(ks.begin(), ks.end());
      for (const std::string& k : ks) {
        TensorInfo info{k, {}, m.at(k).name()};
        const std::string bad = to_spec(m.at(k), &info.spec);
        if (!bad.empty() && why.empty()) why = (is_input ? "input '" : "output '") + k + "' is " + bad;
        const std::string& tensor = m.at(k).name();
        if (is_input) {
          const size_t colon = tensor.find(':');
          if (colon != std::string::npos && tensor.substr(colon) != ":0" && why.empty())
            why = "input '" + k + "' is output " + tensor.substr(colon + 1) + " of a node, not a placeholder";
          inputs.push_back({tensor.substr(0, colon), info.spec});
          ts.signature.inputs.push_back(info);
        } else {
          outputs.push_back(tensor);
          ts.signature.outputs.push_back(info);
        }
      }
    };
    collect(sd.inputs(), true);
    collect(sd.outputs(), false);
    if (ts.signature.outputs.empty() && why.empty()) why = "it has no outputs";
    if (ts.signature.method != kPredictMethod && ts.signature.method != kClassifyMethod &&
        ts.signature.method != kRegressMethod && why.empty())
      why = "method '" + ts.signature.method + "'";
    if (!why.empty()) {
      out.skipped.emplace_back(name, why);
      continue;
    }
    try {
      ts.graph = tf::import_graph(mg->graph_def(), inputs, outputs, resolve);
    } catch (const Error& e) {
      throw_error(e.code(), pb_path + ": signature '" + name + "': " + e.message());
    }
    out.signatures.push_back(std::move(ts));
  }
  if (out.signatures.empty()) {
    std::string reasons;
    for (const auto& [n, why] : out.skipped) reasons += (reasons.empty() ? "" : "; ") + n + ": " + why;
    throw UnimplementedError(pb_path + " has no signature kiln can serve" + (reasons.empty() ? "" : " (" + reasons + ")"));
  }
  return out;
}

}  // namespace kiln::package
