// Loading a model package (checks in the order saved_model.h lists) and running it.
#include "kiln/package/saved_model.h"

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/passes.h"
#include "kiln/package/tf_saved_model.h"
#include "package_internal.h"

namespace kiln::package {
namespace fs = std::filesystem;

struct SavedModel::Entry {
  std::unique_ptr<graph::Executor> executor;
};

SavedModel::~SavedModel() = default;

namespace internal {

std::vector<LoadedSignature> load_signatures(const ModelPackageProto& pkg, const TensorFile& weights,
                                             const std::string& source,
                                             const graph::PassOptions& passes) {
  std::vector<LoadedSignature> out;
  std::map<std::string, const FunctionProto*> functions;
  for (const FunctionProto& f : pkg.functions())
    if (!functions.emplace(f.name(), &f).second)
      throw DataLossError(source + ": function '" + f.name() + "' is defined twice");
  if (pkg.signatures_size() == 0) throw DataLossError(source + ": the package has no signatures");
  std::set<std::string> sig_names;
  for (const SignatureDefProto& sp : pkg.signatures()) {
    Signature sig = signature_from_proto(sp, source);
    if (!sig_names.insert(sig.name).second)
      throw DataLossError(source + ": signature '" + sig.name + "' is defined twice");
    auto fit = functions.find(sp.function());
    if (fit == functions.end())
      throw DataLossError(source + ": signature '" + sig.name + "' runs function '" + sp.function() +
                          "', which is not defined");
    const std::string where = source + " (function '" + sp.function() + "')";
    graph::Graph g = graph_from_proto(fit->second->graph(), weights, where);
    const std::string what = source + ": signature '" + sig.name + "'";
    out.push_back(prepare_signature(std::move(sig), std::move(g), what, passes));
  }
  return out;
}

LoadedSignature prepare_signature(Signature sig, graph::Graph g, const std::string& what,
                                  const graph::PassOptions& passes) {
  if (g.num_inputs != static_cast<int>(sig.inputs.size()) || g.outputs.size() != sig.outputs.size())
    throw DataLossError(what + " has " + std::to_string(sig.inputs.size()) + " inputs and " +
                        std::to_string(sig.outputs.size()) + " outputs, its graph " + std::to_string(g.num_inputs) +
                        " and " + std::to_string(g.outputs.size()));
  graph::PassOptions po = passes;
  po.name = sig.name;
  graph::optimize(g, po);
  auto executor = std::make_unique<graph::Executor>(std::move(g));
  // Signature consistency: the graph accepts the input specs (open sizes as 1) and
  // yields the output specs.
  std::vector<TensorMeta> in;
  for (const TensorInfo& t : sig.inputs) {
    std::vector<int64_t> dims = t.spec.shape;
    for (int64_t& d : dims)
      if (d < 0) d = 1;
    in.push_back({Shape(dims), t.spec.dtype});
  }
  std::vector<TensorMeta> metas;
  try {
    metas = executor->output_metas(in);
  } catch (const Error& e) {
    throw InvalidArgumentError(what + ": its graph rejects the signature's inputs: " + e.message());
  }
  for (size_t k = 0; k < metas.size(); ++k) {
    const TensorSpec& want = sig.outputs[k].spec;
    bool ok = metas[k].dtype == want.dtype && metas[k].shape.rank() == static_cast<int>(want.shape.size());
    for (int d = 0; ok && d < metas[k].shape.rank(); ++d)
      ok = want.shape[static_cast<size_t>(d)] < 0 || want.shape[static_cast<size_t>(d)] == metas[k].shape.dim(d);
    if (!ok)
      throw InvalidArgumentError(what + ": output '" + sig.outputs[k].name + "' is declared " + spec_str(want) +
                                 " but the graph computes " + std::string(dtype_name(metas[k].dtype)) +
                                 metas[k].shape.str());
  }
  return {std::move(sig), std::move(executor)};
}

}  // namespace internal

std::shared_ptr<SavedModel> SavedModel::load(const std::string& dir_in, const LoadOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<SavedModel> m(new SavedModel());
  const fs::path dir(dir_in);
  m->dir_ = dir_in;
  const std::string manifest_path = (dir / kManifestFile).string();
  std::error_code ec;
  if (!fs::exists(manifest_path, ec) && is_tf_saved_model(dir_in)) {
    // A TensorFlow SavedModel: imported into kiln's graphs (tf_saved_model.h).
    TfImport imp = import_tf_saved_model(dir_in);
    m->manifest_.format = kTfSavedModelFormat;
    m->manifest_.producer = imp.metadata.producer;
    m->metadata_ = std::move(imp.metadata);
    m->weight_bytes_ = imp.weight_bytes;
    m->num_weights_ = imp.num_weights;
    const std::string source = (dir / kTfSavedModelFile).string();
    for (TfSignature& ts : imp.signatures) {
      const std::string what = source + ": signature '" + ts.signature.name + "'";
      internal::LoadedSignature ls =
          internal::prepare_signature(std::move(ts.signature), std::move(ts.graph), what, opts.passes);
      auto entry = std::make_unique<Entry>();
      entry->executor = std::move(ls.executor);
      m->signatures_.push_back(std::move(ls.signature));
      m->entries_.push_back(std::move(entry));
    }
    m->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return m;
  }
  if (!fs::exists(manifest_path, ec)) {
    if (!fs::is_directory(dir, ec)) throw NotFoundError("no model package at " + dir_in + ": no such directory");
    throw NotFoundError("no model package at " + dir_in + ": " + kManifestFile + " is missing");
  }
  m->manifest_ = internal::parse_manifest(read_file(manifest_path), manifest_path);
  const Manifest& mf = m->manifest_;
  if (mf.format != kFormatName)
    throw FailedPreconditionError(manifest_path + ": format '" + mf.format + "' is not " + kFormatName);
  if (mf.min_consumer_version > kFormatVersion)
    throw FailedPreconditionError(manifest_path + ": the package (written by " + mf.producer +
                                  ") needs consumer format version >= " + std::to_string(mf.min_consumer_version) +
                                  "; this kiln reads format version " + std::to_string(kFormatVersion) +
                                  ": upgrade the consumer");

  // Files: sizes and checksums. The weights file is mapped once; its SHA-256 runs on a
  // second thread while this one validates its CRC-32Cs and parses the graph (the two
  // passes over 100 MB take about as long each).
  std::shared_ptr<MappedFile> weights_map;
  std::string weights_sha_want;
  std::set<std::string> listed;
  for (const ManifestFile& f : mf.files) {
    listed.insert(f.path);
    const std::string path = (dir / f.path).string();
    if (!fs::is_regular_file(path, ec)) throw DataLossError(path + " is listed in the manifest but missing");
    std::shared_ptr<MappedFile> map = MappedFile::open(path);
    if (static_cast<int64_t>(map->size()) != f.bytes)
      throw DataLossError(path + " is " + std::to_string(map->size()) + " bytes, the manifest says " +
                          std::to_string(f.bytes) + (static_cast<int64_t>(map->size()) < f.bytes ? " (truncated)" : ""));
    if (f.path == kWeightsFile) {
      weights_map = map;
      weights_sha_want = f.sha256;
      continue;
    }
    if (opts.verify_sha256) {
      const std::string got = sha256_hex(map->data(), map->size());
      if (got != f.sha256)
        throw DataLossError(path + ": SHA-256 mismatch (manifest " + f.sha256 + ", file " + got +
                            "): the file changed or is corrupted");
    }
  }
  std::string weights_sha_got;
  std::thread sha_thread;
  if (opts.verify_sha256 && weights_map)
    sha_thread = std::thread([&] { weights_sha_got = sha256_hex(weights_map->data(), weights_map->size()); });
  // Joined on every path out of this function (errors included).
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{sha_thread};
  for (const char* required : {kGraphFile, kWeightsFile})
    if (!listed.count(required)) throw DataLossError(manifest_path + ": the manifest does not list " + required);

  const std::string graph_path = (dir / kGraphFile).string();
  ModelPackageProto pkg;
  {
    const std::string bytes = read_file(graph_path);
    if (!pkg.ParseFromString(bytes)) throw DataLossError(graph_path + " is corrupted: not a ModelPackage message");
  }
  if (pkg.format() != kFormatName)
    throw DataLossError(graph_path + ": format '" + pkg.format() + "' is not " + kFormatName);
  const std::string weights_path = (dir / kWeightsFile).string();
  // The SHA-256 verdict comes first: a corrupted file is reported as such, whatever the
  // CRC-32C check says.
  TensorFile weights;
  std::exception_ptr crc_error;
  try {
    weights = map_tensor_file(weights_map);
  } catch (...) {
    crc_error = std::current_exception();
  }
  if (sha_thread.joinable()) {
    sha_thread.join();
    if (weights_sha_got != weights_sha_want)
      throw DataLossError(weights_path + ": SHA-256 mismatch (manifest " + weights_sha_want + ", file " +
                          weights_sha_got + "): the file changed or is corrupted");
  }
  if (crc_error) std::rethrow_exception(crc_error);
  for (const auto& [name, t] : weights.tensors) {
    m->weight_bytes_ += static_cast<int64_t>(t.nbytes());
    ++m->num_weights_;
  }
  m->metadata_ = internal::metadata_from_proto(pkg.metadata());

  for (auto& ls : internal::load_signatures(pkg, weights, graph_path, opts.passes)) {
    auto entry = std::make_unique<Entry>();
    entry->executor = std::move(ls.executor);
    m->signatures_.push_back(std::move(ls.signature));
    m->entries_.push_back(std::move(entry));
  }
  m->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

const Signature& SavedModel::signature(const std::string& name) const {
  for (const Signature& s : signatures_)
    if (s.name == name) return s;
  std::string have;
  for (const Signature& s : signatures_) have += (have.empty() ? "" : ", ") + s.name;
  throw NotFoundError("model " + dir_ + " has no signature '" + name + "' (it has: " + have + ")");
}

const SavedModel::Entry& SavedModel::entry(const std::string& name) const {
  const Signature& s = signature(name);
  return *entries_[static_cast<size_t>(&s - signatures_.data())];
}

const graph::Graph& SavedModel::graph(const std::string& signature) const { return entry(signature).executor->graph(); }

std::vector<Tensor> SavedModel::run(const std::string& name, const std::vector<Tensor>& inputs) const {
  const Signature& s = signature(name);
  if (inputs.size() != s.inputs.size())
    throw InvalidArgumentError("signature '" + name + "' takes " + std::to_string(s.inputs.size()) + " inputs, got " +
                               std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    check_spec(inputs[i], s.inputs[i].spec, "input '" + s.inputs[i].name + "' of signature '" + name + "'");
  return entry(name).executor->run(inputs);
}

std::map<std::string, Tensor> SavedModel::run(const std::string& name, const std::map<std::string, Tensor>& inputs) const {
  const Signature& s = signature(name);
  std::vector<Tensor> args;
  for (const TensorInfo& t : s.inputs) {
    auto it = inputs.find(t.name);
    if (it == inputs.end()) {
      std::string want;
      for (const TensorInfo& u : s.inputs) want += (want.empty() ? "" : ", ") + u.name;
      throw InvalidArgumentError("signature '" + name + "' needs input '" + t.name + "' (its inputs: " + want + ")");
    }
    args.push_back(it->second);
  }
  for (const auto& [k, _] : inputs) {
    bool known = false;
    for (const TensorInfo& t : s.inputs) known |= t.name == k;
    if (!known) throw InvalidArgumentError("signature '" + name + "' has no input named '" + k + "'");
  }
  std::vector<Tensor> out = run(name, args);
  std::map<std::string, Tensor> named;
  for (size_t k = 0; k < out.size(); ++k) named.emplace(s.outputs[k].name, std::move(out[k]));
  return named;
}

}  // namespace kiln::package
