#pragma once
// Writing model packages (package.h) from traced functions. A trained Keras-style Model
// is exported by kiln::train::export_model (kiln/train/export.h), which builds on this.
//
//   package::ExportSignature sig;
//   sig.fn = [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0])}; };
//   sig.inputs = {{"x", {{-1, 784}, DType::kF32}}};
//   sig.output_names = {"probabilities"};
//   std::string dir = package::export_package("models/mnist", {sig});   // models/mnist/1
//
// Each signature's callable is traced (kiln::function's tracer) on example inputs
// built from its specs (-1 sizes become 2), then checked at another size (3) so that a
// trace that fixed an open size (e.g. a reshape to the traced batch) is refused rather
// than exported broken. Variables read by the callable are frozen: their current values
// become constants stored in variables.safetensors under the variable's name (each
// variable once, even when several signatures read it). Graphs are stored after the
// level-1 passes (folding, simplification, CSE, DCE); loaders run the rest.
//
// The version directory is written under a temporary name and renamed into place, so
// a poller (the server) never sees a half-written version.
//
// Thread-safety: reentrant; do not export into the same version concurrently.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/graph/function.h"
#include "kiln/graph/graph.h"
#include "kiln/package/package.h"

namespace kiln::package {

struct ExportSignature {
  std::string name = kDefaultSignature;
  std::string method = kPredictMethod;
  TracedFn fn;                            // must not assign variables or draw random numbers
  std::vector<TensorInfo> inputs;         // names and specs of fn's arguments
  std::vector<std::string> output_names;  // one per result of fn
};

struct ExportOptions {
  // The version to write; nullopt: one more than the highest existing version (1 if
  // none). An existing version is an error unless overwrite.
  std::optional<int64_t> version;
  bool overwrite = false;
  Metadata metadata;  // created_unix_ms and producer are filled in
  // Files copied into assets/ and assets.extra/ (kept under their file names).
  std::vector<std::string> assets;
  std::vector<std::string> assets_extra;
  int optimization_level = 1;  // passes run before the graph is stored (0: none)
  // The stored name of a frozen variable (default: Variable::name()); names are made
  // unique with "_1", "_2", ... suffixes.
  std::function<std::string(const Variable&)> weight_name;
};

// Writes <base>/<version>/ and returns its path. Throws InvalidArgumentError for bad
// signatures (no signatures, duplicate or empty names, a method whose outputs do not
// fit it: classify needs "scores" and/or "classes", regress one output "outputs"; a
// trace that fixes an open size; variable assignments), UnimplementedError for random
// ops, FailedPreconditionError when the version exists.
std::string export_package(const std::string& base, const std::vector<ExportSignature>& signatures,
                           const ExportOptions& opts = {});

// Writes the version directory `dir` from already-built graphs (kiln convert's
// writer): one graph per signature, inputs/outputs in signature order.
struct GraphSignature {
  Signature signature;
  graph::Graph graph;
};
void write_package(const std::string& dir, const std::vector<GraphSignature>& signatures, Metadata metadata,
                   const std::vector<std::string>& assets = {}, const std::vector<std::string>& assets_extra = {},
                   bool overwrite = false);

}  // namespace kiln::package
