// Writing model packages: tracing signatures, freezing variables, files + manifest.
#include "kiln/package/export.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/core/version.h"
#include "kiln/graph/executor.h"
#include "package_internal.h"

namespace kiln::package {
namespace fs = std::filesystem;
namespace {

std::string producer() { return std::string("kiln ") + KILN_VERSION_STRING; }

// Variables become constants holding their current values (named after the variable),
// on the host: packages are device-neutral, and passes read constants on the host.
void freeze_variables(graph::Graph& g, const ExportOptions& opts) {
  for (graph::Node& n : g.nodes) {
    if (n.kind != graph::NodeKind::kVariable) continue;
    n.kind = graph::NodeKind::kConstant;
    n.constant = n.variable.peek().to(Device::cpu());
    n.name = opts.weight_name ? opts.weight_name(n.variable) : n.variable.name();
    n.variable = Variable();
  }
}

std::vector<TensorMeta> metas_at(const std::vector<TensorInfo>& inputs, int64_t open_size) {
  std::vector<TensorMeta> out;
  for (const TensorInfo& t : inputs) {
    std::vector<int64_t> dims = t.spec.shape;
    for (int64_t& d : dims)
      if (d < 0) d = open_size;
    out.push_back({Shape(dims), t.spec.dtype});
  }
  return out;
}

void copy_files(const std::vector<std::string>& files, const fs::path& to) {
  if (files.empty()) return;
  fs::create_directories(to);
  for (const std::string& f : files) {
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) throw NotFoundError("export: asset file not found: " + f);
    fs::copy_file(f, to / fs::path(f).filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) throw FailedPreconditionError("export: cannot copy " + f + ": " + ec.message());
  }
}

// An exported function must be deterministic: a random op draws anew every run.
void refuse_random_ops(const graph::Graph& g, const std::string& what) {
  for (const graph::Node& n : g.nodes)
    if (n.stateful())
      throw UnimplementedError(what + " has a random op '" + n.op->name +
                               "' (an inference function must be deterministic; call layers with training=false)");
}

}  // namespace

void write_package(const std::string& dir, const std::vector<GraphSignature>& signatures, Metadata metadata,
                   const std::vector<std::string>& assets, const std::vector<std::string>& assets_extra,
                   bool overwrite) {
  if (signatures.empty()) throw InvalidArgumentError("export: no signatures to export");
  std::set<std::string> names;
  for (const GraphSignature& s : signatures) {
    internal::validate_signature(s.signature);
    if (!names.insert(s.signature.name).second)
      throw InvalidArgumentError("export: signature '" + s.signature.name + "' is given twice");
    if (!s.graph.assignments.empty())
      throw InvalidArgumentError("export: signature '" + s.signature.name +
                                 "' assigns variables (a training step?); export inference functions only");
    refuse_random_ops(s.graph, "export: signature '" + s.signature.name + "'");
    if (s.graph.num_inputs != static_cast<int>(s.signature.inputs.size()) ||
        s.graph.outputs.size() != s.signature.outputs.size())
      throw InvalidArgumentError("export: signature '" + s.signature.name + "' does not match its graph's inputs/outputs");
  }
  std::error_code ec;
  if (fs::exists(dir, ec) && !overwrite)
    throw FailedPreconditionError("export: " + dir + " exists already (choose another version or overwrite)");

  // Weights: each distinct tensor once, named after its variable when it has one.
  TensorFile weights;
  std::map<std::pair<const Storage*, std::string>, std::string> key_of;  // (buffer, meta) -> key
  std::set<std::string> used;
  ModelPackageProto pkg;
  pkg.set_format(kFormatName);
  for (const GraphSignature& s : signatures) {
    const graph::Graph& g = s.graph;
    auto key = [&](int i) {
      const graph::Node& n = g.nodes[static_cast<size_t>(i)];
      const Tensor t = n.kind == graph::NodeKind::kVariable ? n.variable.peek() : n.constant;
      const std::string name = n.kind == graph::NodeKind::kVariable ? n.variable.name() : n.name;
      // Buffer identity plus offset/shape/dtype (views of one buffer are distinct weights).
      const std::pair<const Storage*, std::string> id{
          t.storage().get(), std::to_string(reinterpret_cast<uintptr_t>(t.raw_data())) + t.desc()};
      if (auto it = key_of.find(id); it != key_of.end()) return it->second;
      std::string k = name.empty() ? "const/" + s.signature.name + "/" + std::to_string(i) : name;
      for (int suffix = 1; used.count(k); ++suffix)
        k = (name.empty() ? "const/" + s.signature.name + "/" + std::to_string(i) : name) + "_" + std::to_string(suffix);
      used.insert(k);
      key_of[id] = k;
      weights.tensors.emplace_back(k, t.device().type == DeviceType::kCPU ? t : t.to(Device::cpu()));
      return k;
    };
    FunctionProto* f = pkg.add_functions();
    f->set_name(s.signature.name);
    internal::graph_to_proto(g, key, f->mutable_graph());
    internal::signature_to_proto(s.signature, s.signature.name, pkg.add_signatures());
  }
  metadata.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  metadata.producer = producer();
  internal::metadata_to_proto(metadata, pkg.mutable_metadata());

  // Everything goes into a sibling temporary directory, renamed into place at the end.
  static std::atomic<int> counter{0};
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.parent_path() / (final_dir.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                                                  "-" + std::to_string(counter++));
  fs::create_directories(tmp, ec);
  if (ec) throw FailedPreconditionError("export: cannot create " + tmp.string() + ": " + ec.message());
  try {
    std::string bytes;
    if (!pkg.SerializeToString(&bytes)) throw InternalError("export: cannot serialise model.pb");
    write_file_atomic((tmp / kGraphFile).string(), bytes);
    save_tensor_file((tmp / kWeightsFile).string(), weights);
    copy_files(assets, tmp / kAssetsDir);
    copy_files(assets_extra, tmp / kAssetsExtraDir);
    Manifest m;
    m.producer = producer();
    std::vector<std::string> files;
    for (auto it = fs::recursive_directory_iterator(tmp); it != fs::recursive_directory_iterator(); ++it)
      if (it->is_regular_file()) files.push_back(fs::relative(it->path(), tmp).generic_string());
    std::sort(files.begin(), files.end());
    for (const std::string& rel : files) {
      const std::string p = (tmp / rel).string();
      m.files.push_back({rel, static_cast<int64_t>(fs::file_size(p)), sha256_file(p)});
    }
    write_file_atomic((tmp / kManifestFile).string(), internal::manifest_json(m));
    if (overwrite) fs::remove_all(final_dir, ec);
    fs::rename(tmp, final_dir, ec);
    if (ec) throw FailedPreconditionError("export: cannot move the package into " + dir + ": " + ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

std::string export_package(const std::string& base, const std::vector<ExportSignature>& signatures,
                           const ExportOptions& opts) {
  if (signatures.empty()) throw InvalidArgumentError("export: no signatures to export");
  std::vector<GraphSignature> built;
  for (const ExportSignature& es : signatures) {
    const std::string what = "export: signature '" + es.name + "'";
    if (!es.fn) throw InvalidArgumentError(what + " has no function");
    Signature sig{es.name, es.method, es.inputs, {}};
    std::vector<Tensor> args;
    for (const TensorMeta& m : metas_at(es.inputs, 2)) args.push_back(Tensor::zeros(m.shape, m.dtype));
    std::vector<Tensor> results;
    graph::Graph g = graph::trace(es.fn, args, &results);
    refuse_random_ops(g, what);
    if (results.size() != es.output_names.size())
      throw InvalidArgumentError(what + " names " + std::to_string(es.output_names.size()) +
                                 " outputs, the function returns " + std::to_string(results.size()));
    freeze_variables(g, opts);
    graph::PassOptions po;
    po.level = opts.optimization_level;
    po.name = es.name;
    graph::optimize(g, po);
    // Which output sizes follow the open input sizes: infer again at another size.
    graph::Executor probe(g);
    std::vector<TensorMeta> at3;
    try {
      at3 = probe.output_metas(metas_at(es.inputs, 3));
    } catch (const Error& e) {
      throw InvalidArgumentError(what + ": the traced function fixes a size its input signature leaves open (-1): " +
                                 e.message());
    }
    for (size_t k = 0; k < results.size(); ++k) {
      TensorSpec spec{{}, results[k].dtype()};
      for (int d = 0; d < results[k].rank(); ++d)
        spec.shape.push_back(at3[k].shape.rank() == results[k].rank() && at3[k].shape.dim(d) == results[k].dim(d)
                                 ? results[k].dim(d)
                                 : -1);
      sig.outputs.push_back({es.output_names[k], spec});
    }
    internal::validate_signature(sig);
    built.push_back({std::move(sig), std::move(g)});
  }
  int64_t version = 1;
  if (opts.version) {
    if (*opts.version <= 0) throw InvalidArgumentError("export: version must be positive, got " + std::to_string(*opts.version));
    version = *opts.version;
  } else if (auto vs = list_versions(base); !vs.empty()) {
    version = vs.back() + 1;
  }
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) throw FailedPreconditionError("export: cannot create " + base + ": " + ec.message());
  const std::string dir = (fs::path(base) / std::to_string(version)).string();
  Metadata md = opts.metadata;
  write_package(dir, built, md, opts.assets, opts.assets_extra, opts.overwrite);
  return dir;
}

}  // namespace kiln::package
