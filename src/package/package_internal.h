#pragma once
// Conversions between the package's files and kiln's types, shared by the exporter,
// the loader, the fuzzer (fuzz/package_fuzzer.cc) and tests.
#include <functional>
#include <memory>
#include <vector>
#include <string>
#include <string_view>

#include "kiln/core/tensor_file.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/graph.h"
#include "kiln/graph/pass_options.h"
#include "kiln/package/package.h"
#include "kiln/model_package.pb.h"

namespace kiln::package::internal {

std::string manifest_json(const Manifest& m);
// Throws DataLossError naming `source` for malformed JSON or fields; does not check
// versions or files.
Manifest parse_manifest(std::string_view text, const std::string& source);

// `key(node_index)` names a constant node's weight.
void graph_to_proto(const graph::Graph& g, const std::function<std::string(int)>& key, GraphProto* out);
// Throws DataLossError (malformed: inputs pointing forward, missing weights, shape
// mismatches) or NotFoundError (unknown op) naming `source`.
graph::Graph graph_from_proto(const GraphProto& p, const TensorFile& weights, const std::string& source);

void signature_to_proto(const Signature& s, const std::string& function, SignatureDefProto* out);
Signature signature_from_proto(const SignatureDefProto& p, const std::string& source);
void metadata_to_proto(const Metadata& m, MetadataProto* out);
Metadata metadata_from_proto(const MetadataProto& p);

// Every signature of a parsed model.pb with its graph (from `weights`), optimised at
// `passes` (its name set per signature) and checked against the signature (the loader after its file checks; the
// fuzzer). Throws as SavedModel::load.
struct LoadedSignature {
  Signature signature;
  std::unique_ptr<graph::Executor> executor;
};
std::vector<LoadedSignature> load_signatures(const ModelPackageProto& pkg, const TensorFile& weights,
                                             const std::string& source,
                                             const graph::PassOptions& passes);

// One signature's graph optimised at `passes` and checked against the signature (its
// input specs, open sizes as 1, must give its output specs); `what` names it in errors.
LoadedSignature prepare_signature(Signature sig, graph::Graph g, const std::string& what,
                                  const graph::PassOptions& passes);

// Checks a signature's names and method (InvalidArgumentError).
void validate_signature(const Signature& s);

}  // namespace kiln::package::internal
