#pragma once
// tf.train.Example's feature model and the rules that turn examples into dense tensors,
// shared by the data layer (the wire codec and spec'd parsers: kiln/data/example.h) and
// the model server (classify/regress requests, whatever protocol brought them:
// src/serving/service.cc). Both live in libkiln_runtime's lowest layer so that the server
// needs no training code for them.
//
// Thread-safety: everything here is reentrant.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"

namespace kiln {

// One feature: a list of byte strings, float32s or int64s (tensorflow.Feature's oneof).
struct Feature {
  enum Kind : uint8_t {
    kNone,   // no list set (an empty tensorflow.Feature); parsed as if the feature were absent
    kBytes,  // bytes_list -> string components
    kFloat,  // float_list -> f32 components
    kInt64,  // int64_list -> i64 components
  };
  Kind kind = kNone;
  // Only the vector of `kind` is used (encoding ignores the others).
  std::vector<std::string> bytes;
  std::vector<float> floats;
  std::vector<int64_t> ints;

  static Feature of_bytes(std::vector<std::string> v);
  static Feature of_floats(std::vector<float> v);
  static Feature of_ints(std::vector<int64_t> v);
  // Number of values of `kind`.
  size_t size() const;
  // Same kind and values; floats compare bit for bit (NaN == NaN, 0.0 != -0.0).
  bool operator==(const Feature& o) const;
};

// "bytes_list", "float_list", "int64_list" or "no list".
std::string_view feature_kind_name(Feature::Kind kind);

// A tf.train.Example: its features by name.
using Features = std::map<std::string, Feature>;

// The tensor [N, row_dims...] of `dtype` that feature `name` of N examples fills, one
// row per example (TensorFlow Serving's classify and regress inputs). An example without
// the feature takes it from `context` (may be null). Values land in `dtype` exactly:
// float_list values fill float inputs, and integer inputs when they are whole numbers in
// range; int64_list values fill any numeric input, integer ones only when they fit (no
// detour through f64: an int64 above 2^53 keeps its last bit); one bytes_list string
// fills a u8/i8 row byte by byte; f16/bf16 inputs are filled in f32 and bool inputs in i64
// (nonzero: true), converted once.
// InvalidArgumentError, naming "examples[i] feature 'name'", for: no examples, the
// feature missing (or with no list), a value count other than numel(row_dims), a value
// the dtype cannot hold, bytes for another dtype; row_dims must be >= 0.
Tensor dense_from_examples(std::span<const Features> examples, const Features* context,
                           const std::string& name, std::span<const int64_t> row_dims, DType dtype);

}  // namespace kiln
