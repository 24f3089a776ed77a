#pragma once
// The model package: one directory per model version holding the graph, the weights,
// the signatures and metadata; what `kiln train --export` and export_package write, what
// SavedModel (saved_model.h), `kiln show|run|convert` and the server read. Format:
// docs/formats/model-package.md.
//
//   <base>/<name>/<version>/          version: a positive decimal integer
//     manifest.json                   format, versions, producer, SHA-256 of every file
//     model.pb                        graph(s), signatures, metadata (proto/kiln/model_package.proto)
//     variables.safetensors           every weight and constant (docs/formats/checkpoint.md)
//     assets/                         files the model needs (vocabularies, label names)
//     assets.extra/                   files for the server (warm-up requests)
//
// Version discipline: a package records the producer's format version and the oldest
// consumer format version that can read it; a consumer older than that refuses the
// package with FailedPreconditionError (instead of misreading it).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor_spec.h"

namespace kiln::package {

inline constexpr const char* kFormatName = "kiln-model-1";
// The package format version this build writes, and the newest it reads.
inline constexpr int kFormatVersion = 1;
// Method names, as TensorFlow Serving spells them (signatures carry one).
inline constexpr const char* kPredictMethod = "tensorflow/serving/predict";
inline constexpr const char* kClassifyMethod = "tensorflow/serving/classify";
inline constexpr const char* kRegressMethod = "tensorflow/serving/regress";
inline constexpr const char* kDefaultSignature = "serving_default";
// File names inside a version directory.
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kGraphFile = "model.pb";
inline constexpr const char* kWeightsFile = "variables.safetensors";
inline constexpr const char* kAssetsDir = "assets";
inline constexpr const char* kAssetsExtraDir = "assets.extra";

struct TensorInfo {
  std::string name;
  TensorSpec spec;  // shape: -1 for sizes the signature leaves open (the batch)
  // An imported TensorFlow SavedModel's graph tensor ("serving_default_x:0"), which TF
  // Serving's metadata reports as the TensorInfo's name; empty for kiln packages (the
  // metadata shows `name`).
  std::string tensor_name = {};
};

struct Signature {
  std::string name;                   // "serving_default", ...
  std::string method = kPredictMethod;
  std::vector<TensorInfo> inputs;     // in argument order
  std::vector<TensorInfo> outputs;    // in result order
};

struct Metadata {
  int64_t created_unix_ms = 0;  // set by export
  std::string producer;         // set by export: "kiln <version>"
  std::string model_name;
  std::string description;
  std::string training_data;    // what the model was trained on
  std::map<std::string, std::string> hyperparameters;
  std::map<std::string, double> metrics;  // final metrics of training
  std::map<std::string, std::string> tags;
  std::string precision = "fp32";         // fp32 | fp16 | bf16 | int8
  std::string converted_from;             // set by kiln convert
};

struct ManifestFile {
  std::string path;    // relative to the version directory, '/'-separated
  int64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

struct Manifest {
  std::string format = kFormatName;
  int format_version = kFormatVersion;
  int min_consumer_version = kFormatVersion;
  std::string producer;
  std::vector<ManifestFile> files;
};

// SHA-256 of bytes / of a file, as 64 lowercase hex digits (OpenSSL).
std::string sha256_hex(const void* data, size_t n);
std::string sha256_file(const std::string& path);

// The numeric version directories under `base` (ascending); other names (temporary
// export directories, files) are ignored. Empty when `base` does not exist.
std::vector<int64_t> list_versions(const std::string& base);
// `dir` itself when it holds a manifest or a TensorFlow saved_model.pb, else its highest
// numeric version directory.
// Throws NotFoundError when it is neither a package nor a base with versions.
std::string resolve_version_dir(const std::string& dir);

}  // namespace kiln::package
