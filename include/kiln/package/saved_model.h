#pragma once
// Loading and running a model package (package.h): the standalone runtime's API, with
// no training code behind it.
//
//   auto model = kiln::package::SavedModel::load("models/mnist/1");
//   auto out = model->run("serving_default", {{"x", batch}});   // name -> tensor
//   Tensor probs = out.at("probabilities");
//
// load() checks, in this order, and fails with an error naming the file and the cause:
//   - the manifest exists and parses (NotFoundError: not a package; DataLossError),
//   - the format is kiln-model-1 and this consumer is new enough
//     (FailedPreconditionError: "needs consumer format version >= N"),
//   - every file the manifest lists exists, has its size and SHA-256 (DataLossError:
//     truncated, checksum mismatch), and no path escapes the directory,
//   - model.pb parses, every op is registered (NotFoundError: unknown op), node inputs
//     point backwards, constants match their weights' shapes and dtypes,
//   - every signature's graph accepts its input specs and yields its output specs
//     (InvalidArgumentError naming the signature and the node).
// Weights are memory-mapped, not copied (a 100 MB package loads in tens of ms).
//
// Thread-safety: a loaded SavedModel is immutable; run() may be called from many
// threads at once (each concurrent run gets its own memory arena).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/pass_options.h"
#include "kiln/package/package.h"

namespace kiln::graph {
class Graph;
}  // namespace kiln::graph

namespace kiln::package {

struct LoadOptions {
  // The passes run on the stored graphs at load (level 2 by default: fusions too).
  // passes.auto_mixed_precision is the one way a package computes in 16 bits at load;
  // nothing in the environment changes a package's numerics.
  graph::PassOptions passes;
  // Verify the SHA-256 of every file (the weights' CRC-32Cs are checked regardless).
  bool verify_sha256 = true;
};

class SavedModel {
 public:
  static std::shared_ptr<SavedModel> load(const std::string& dir, const LoadOptions& opts = {});
  ~SavedModel();

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  const Metadata& metadata() const { return metadata_; }
  const std::vector<Signature>& signatures() const { return signatures_; }
  // Throws NotFoundError listing the signatures there are.
  const Signature& signature(const std::string& name) const;
  // The (optimised) graph a signature runs.
  const graph::Graph& graph(const std::string& signature) const;
  // Bytes of weights (memory-mapped) and their count.
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t num_weights() const { return num_weights_; }
  double load_seconds() const { return load_seconds_; }

  // Runs a signature on named inputs; returns named outputs. Throws
  // InvalidArgumentError for a missing or unknown input name, or an input whose dtype
  // or shape does not fit its spec, NotFoundError for an unknown signature.
  std::map<std::string, Tensor> run(const std::string& signature, const std::map<std::string, Tensor>& inputs) const;
  // Positional form: inputs and outputs in signature order.
  std::vector<Tensor> run(const std::string& signature, const std::vector<Tensor>& inputs) const;

 private:
  SavedModel() = default;
  struct Entry;
  const Entry& entry(const std::string& name) const;
  std::string dir_;
  Manifest manifest_;
  Metadata metadata_;
  std::vector<Signature> signatures_;
  std::vector<std::unique_ptr<Entry>> entries_;  // parallel to signatures_
  int64_t weight_bytes_ = 0;
  int64_t num_weights_ = 0;
  double load_seconds_ = 0;
};

// Checks a tensor against a spec ("input 'x' of signature 'serving_default'" names it
// in the InvalidArgumentError).
void check_spec(const Tensor& t, const TensorSpec& spec, const std::string& what);
std::string spec_str(const TensorSpec& spec);  // "f32[-1, 784]"

}  // namespace kiln::package
