#pragma once
// TensorFlow SavedModels (docs/formats/savedmodel.md): a directory with saved_model.pb
// and variables/, as tf.saved_model.save and Keras' model.export() write it and TF
// Serving loads it. SavedModel::load (saved_model.h) takes such a directory as it takes
// a kiln package: the graph of the "serve" MetaGraph is imported into kiln's IR (its
// functions inlined, its variables bound to the bundle's tensors as constants, TF's
// ops mapped to kiln's) and runs through kiln's passes and executor, so `kiln serve`,
// `kiln show`, `kiln run` and `kiln convert` accept it.
//
// Errors: a missing saved_model.pb or variables index is NotFoundError; a file that
// does not parse, is truncated or fails a checksum is DataLossError naming the file;
// no MetaGraph with the tags, no signature kiln can serve, an op kiln does not map
// (all of them are listed, with node names) or a shape computation kiln cannot express
// is UnimplementedError.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/graph/graph.h"
#include "kiln/package/package.h"

namespace kiln::package {

inline constexpr const char* kTfSavedModelFile = "saved_model.pb";
inline constexpr const char* kTfSavedModelFormat = "tensorflow-saved-model";

// Whether `dir` holds a TensorFlow SavedModel (a saved_model.pb).
bool is_tf_saved_model(const std::string& dir);

struct TfImportOptions {
  std::set<std::string> tags = {"serve"};  // the MetaGraph's tag set, as TF Serving picks it
};

struct TfSignature {
  Signature signature;  // inputs and outputs sorted by key, as TF Serving reports them
  graph::Graph graph;   // traced; not yet optimised
};

struct TfImport {
  std::vector<TfSignature> signatures;
  Metadata metadata;     // producer "TensorFlow <version>", tags
  // Signatures left out and why (string inputs, TF1 classify/regress on serialized
  // Examples, ...).
  std::vector<std::pair<std::string, std::string>> skipped;
  int64_t weight_bytes = 0;  // of the variables the signatures read
  int64_t num_weights = 0;
};

TfImport import_tf_saved_model(const std::string& dir, const TfImportOptions& opts = {});

}  // namespace kiln::package
