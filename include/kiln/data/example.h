#pragma once
// tf.train.Example and tf.train.SequenceExample: encode, decode, and parse into tensors
// the way tf.io.parse_example / parse_single_example / parse_single_sequence_example do.
//
// The protobuf wire format is decoded and encoded by hand (no libprotobuf at run time):
// the spec'd parsers write each feature straight into preallocated output tensors.
// Wire format subset, semantics and where kiln differs from TensorFlow:
// docs/formats/example.md. Messages: proto/tensorflow/{feature,example}.proto.
//
// Errors: bytes that are not a well-formed message throw
//   DataLossError("malformed Example: <what> at byte N")        (N: offset in the record)
// and well-formed messages that do not fit the spec (missing feature without default,
// wrong list kind, wrong value count) throw InvalidArgumentError naming the feature,
// the record index (batches) and expected vs got; VarLen padding past 2^31 values throws
// ResourceExhaustedError. Nothing else is thrown for any input.
//
// Thread-safety: everything here is reentrant; an ExampleParser may be shared.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/core/example.h"
#include "kiln/data/value.h"

namespace kiln::data {

// The feature model is shared with the server (kiln/core/example.h).
using kiln::Feature;
using kiln::feature_kind_name;
using kiln::Features;
// Per name, one Feature per time step.
using FeatureLists = std::map<std::string, std::vector<Feature>>;

struct SequenceExample {
  Features context;
  FeatureLists feature_lists;
  bool operator==(const SequenceExample& o) const = default;
};

// Serializes a tensorflow.Example holding `features`: byte-identical to libprotobuf's
// deterministic serialization (map keys sorted; lists packed; `features` always present).
std::string encode_example(const Features& features);
// The same, appended to *out (reuses its capacity).
void encode_example(const Features& features, std::string* out);
std::string encode_sequence_example(const SequenceExample& example);

// Decodes every feature (protobuf semantics: a key given twice keeps the last entry,
// repeated fields and messages merge, unknown fields are skipped). DataLossError if
// `serialized` is not a well-formed Example.
Features decode_example(std::string_view serialized);
SequenceExample decode_sequence_example(std::string_view serialized);

// ---- parsing into tensors ----
//
// The component type follows the list kind: kBytes -> StringTensor, kFloat -> f32,
// kInt64 -> i64.

// Exactly numel(shape) values of `kind` (shape fully defined, dims >= 0). A missing
// feature (absent or kNone) takes `default_value` (same kind, numel(shape) values) or
// throws InvalidArgumentError. Like tf.io.FixedLenFeature.
struct FixedLenFeature {
  Feature::Kind kind = Feature::kFloat;
  std::vector<int64_t> shape;
  std::optional<Feature> default_value;

  FixedLenFeature() = default;
  FixedLenFeature(Feature::Kind kind, std::vector<int64_t> shape, std::optional<Feature> default_value = {})
      : kind(kind), shape(std::move(shape)), default_value(std::move(default_value)) {}
};

// Any number of values of `kind` (a missing feature has none). TensorFlow returns a
// SparseTensor; kiln has none, so it gives the dense values instead:
//   parse_example:  "<name>": 1-D [n]
//   parse_examples: "<name>": [N, max n] padded with 0 / "" and
//                   "<name>/lengths": i64 [N], the number of values of each record
// (a SparseTensor's tf.sparse.to_dense plus its row lengths). ResourceExhaustedError if
// the padded values would exceed 2^31.
struct VarLenFeature {
  Feature::Kind kind = Feature::kFloat;
};

using FeatureSpec = std::variant<FixedLenFeature, VarLenFeature>;
// Features to parse; others in the records are skipped without being decoded. The
// element's components come in this (sorted) order, "<name>/lengths" right after its
// VarLen feature.
using ExampleSpec = std::map<std::string, FeatureSpec>;

// A feature list whose every step holds numel(shape) values of `kind`: output
// [T, shape...]. A feature list that is absent gives [0, shape...] if allow_missing,
// else InvalidArgumentError. Like tf.io.FixedLenSequenceFeature.
struct FixedLenSequenceFeature {
  Feature::Kind kind = Feature::kFloat;
  std::vector<int64_t> shape;
  bool allow_missing = false;

  FixedLenSequenceFeature() = default;
  FixedLenSequenceFeature(Feature::Kind kind, std::vector<int64_t> shape, bool allow_missing = false)
      : kind(kind), shape(std::move(shape)), allow_missing(allow_missing) {}
};
// In a SequenceSpec, VarLenFeature gives "<name>": [T, max n] padded with 0 / "" and
// "<name>/lengths": i64 [T]; an absent feature list gives [0, 0] and [0].
using SequenceFeatureSpec = std::variant<FixedLenSequenceFeature, VarLenFeature>;
using SequenceSpec = std::map<std::string, SequenceFeatureSpec>;

// A spec checked and laid out once, for parsing many records.
class ExampleParser {
 public:
  // InvalidArgumentError for a bad spec: kNone kind, negative dims, a default of the
  // wrong kind or size, a "<name>/lengths" that collides with another name.
  explicit ExampleParser(const ExampleSpec& spec);
  ~ExampleParser();
  ExampleParser(const ExampleParser&);
  ExampleParser& operator=(const ExampleParser&);

  // One record: FixedLen -> shape, VarLen -> [n].
  Element parse(std::string_view serialized) const;
  // N records -> [N, ...] components, each output buffer allocated once; the fast path
  // (tf.io.parse_example). Errors name the record index.
  Element parse_batch(std::span<const std::string_view> serialized) const;
  Element parse_batch(const StringTensor& serialized) const;  // any shape; N = numel
  // Names of the components, in order.
  const std::vector<std::string>& names() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

Element parse_example(std::string_view serialized, const ExampleSpec& spec);
Element parse_examples(std::span<const std::string_view> serialized, const ExampleSpec& spec);
Element parse_examples(const StringTensor& serialized, const ExampleSpec& spec);

// A SequenceExample: the context features as parse_example gives them, then the
// feature lists ([T, ...]); context and sequence names must not collide
// (InvalidArgumentError). Like tf.io.parse_single_sequence_example, in one element.
Element parse_sequence_example(std::string_view serialized, const ExampleSpec& context, const SequenceSpec& sequence);

}  // namespace kiln::data
