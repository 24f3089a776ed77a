// Fuzzes the tf.train.Example / SequenceExample decoder and the spec'd parsers: any
// input must decode or throw kiln::Error (DataLossError for bad bytes,
// InvalidArgumentError for a record that does not fit the spec), never crash. A decoded
// message must re-encode to bytes that decode to the same message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/data/example.h"

namespace {

using namespace kiln::data;  // NOLINT

const ExampleSpec& spec() {
  static const ExampleSpec s{
      {"image", FixedLenFeature{Feature::kBytes, {}}},
      {"label", FixedLenFeature{Feature::kInt64, {}, Feature::of_ints({0})}},
      {"x", FixedLenFeature{Feature::kFloat, {2}, Feature::of_floats({0, 0})}},
      {"f", VarLenFeature{Feature::kFloat}},
      {"i", VarLenFeature{Feature::kInt64}},
      {"b", VarLenFeature{Feature::kBytes}},
      {"", VarLenFeature{Feature::kInt64}},
  };
  return s;
}

void check_examples(std::string_view in) {
  try {
    Features fs = decode_example(in);
    if (decode_example(encode_example(fs)) != fs) __builtin_trap();
  } catch (const kiln::Error&) {
  }
  try {
    parse_example(in, spec());
  } catch (const kiln::Error&) {
  }
  // Split into a batch of records at every 0xff byte (a separator fuzzers find easily).
  std::vector<std::string_view> batch;
  size_t start = 0;
  for (size_t i = 0; i <= in.size(); ++i) {
    if (i == in.size() || static_cast<unsigned char>(in[i]) == 0xff) {
      batch.push_back(in.substr(start, i - start));
      start = i + 1;
    }
  }
  try {
    Element e = parse_examples(batch, spec());
    if (e["label"].shape().dim(0) != static_cast<int64_t>(batch.size())) __builtin_trap();
  } catch (const kiln::Error&) {
  }
}

void check_sequences(std::string_view in) {
  try {
    SequenceExample s = decode_sequence_example(in);
    if (decode_sequence_example(encode_sequence_example(s)) != s) __builtin_trap();
  } catch (const kiln::Error&) {
  }
  static const ExampleSpec context{{"label", FixedLenFeature{Feature::kInt64, {}, Feature::of_ints({0})}}};
  static const SequenceSpec sequence{
      {"x", FixedLenSequenceFeature{Feature::kFloat, {2}, true}},
      {"i", FixedLenSequenceFeature{Feature::kInt64, {}, true}},
      {"b", VarLenFeature{Feature::kBytes}},
      {"f", VarLenFeature{Feature::kFloat}},
  };
  try {
    parse_sequence_example(in, context, sequence);
  } catch (const kiln::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  check_examples(in);
  check_sequences(in);
  return 0;
}
