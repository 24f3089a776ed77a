// tf.train.Example / SequenceExample: the hand-written codec against libprotobuf's
// generated classes (proto/tensorflow/*.proto), hand-assembled bytes, and records
// written and parsed by TensorFlow (tests/fixtures/example, scripts/make_example_fixtures.py).
#include "kiln/data/example.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/data/tfrecord.h"
#include "tensorflow/example.pb.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using Json = nlohmann::json;

// ---- libprotobuf reference ----

tensorflow::Feature to_proto(const Feature& f) {
  tensorflow::Feature p;
  switch (f.kind) {
    case Feature::kBytes:
      p.mutable_bytes_list();
      for (const auto& s : f.bytes) p.mutable_bytes_list()->add_value(s);
      break;
    case Feature::kFloat:
      p.mutable_float_list();
      for (float x : f.floats) p.mutable_float_list()->add_value(x);
      break;
    case Feature::kInt64:
      p.mutable_int64_list();
      for (int64_t x : f.ints) p.mutable_int64_list()->add_value(x);
      break;
    case Feature::kNone: break;
  }
  return p;
}

Feature from_proto(const tensorflow::Feature& p) {
  switch (p.kind_case()) {
    case tensorflow::Feature::kBytesList:
      return Feature::of_bytes({p.bytes_list().value().begin(), p.bytes_list().value().end()});
    case tensorflow::Feature::kFloatList:
      return Feature::of_floats({p.float_list().value().begin(), p.float_list().value().end()});
    case tensorflow::Feature::kInt64List:
      return Feature::of_ints({p.int64_list().value().begin(), p.int64_list().value().end()});
    default: return Feature{};
  }
}

tensorflow::Example to_proto(const Features& fs) {
  tensorflow::Example ex;
  auto* map = ex.mutable_features()->mutable_feature();
  for (const auto& [k, f] : fs) (*map)[k] = to_proto(f);
  return ex;
}

Features from_proto(const tensorflow::Features& p) {
  Features fs;
  for (const auto& [k, f] : p.feature()) fs[k] = from_proto(f);
  return fs;
}

tensorflow::SequenceExample to_proto(const SequenceExample& s) {
  tensorflow::SequenceExample p;
  auto* ctx = p.mutable_context()->mutable_feature();
  for (const auto& [k, f] : s.context) (*ctx)[k] = to_proto(f);
  auto* lists = p.mutable_feature_lists()->mutable_feature_list();
  for (const auto& [k, steps] : s.feature_lists) {
    auto& fl = (*lists)[k];
    for (const Feature& f : steps) *fl.add_feature() = to_proto(f);
  }
  return p;
}

SequenceExample from_proto(const tensorflow::SequenceExample& p) {
  SequenceExample s;
  s.context = from_proto(p.context());
  for (const auto& [k, fl] : p.feature_lists().feature_list()) {
    auto& steps = s.feature_lists[k];
    for (const auto& f : fl.feature()) steps.push_back(from_proto(f));
  }
  return s;
}

std::string deterministic(const google::protobuf::MessageLite& m) {
  std::string s;
  {
    google::protobuf::io::StringOutputStream sos(&s);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    EXPECT_TRUE(m.SerializeToCodedStream(&cos));
  }
  return s;
}

// ---- random data ----

struct Gen {
  std::mt19937_64 rng;
  explicit Gen(uint64_t seed) : rng(seed) {}
  uint64_t u(uint64_t n) { return rng() % n; }

  float any_float() {
    switch (u(6)) {
      case 0: return std::numeric_limits<float>::quiet_NaN();
      case 1: return -0.0f;
      case 2: return std::numeric_limits<float>::infinity();
      case 3: return std::bit_cast<float>(static_cast<uint32_t>(rng()));  // any bits, NaN payloads too
      default: return std::uniform_real_distribution<float>(-1e6f, 1e6f)(rng);
    }
  }
  int64_t any_int() {
    switch (u(5)) {
      case 0: return std::numeric_limits<int64_t>::min();
      case 1: return std::numeric_limits<int64_t>::max();
      case 2: return -static_cast<int64_t>(u(1000));
      case 3: return static_cast<int64_t>(rng());
      default: return static_cast<int64_t>(u(300));
    }
  }
  std::string any_bytes(size_t max_len) {
    std::string s(u(max_len + 1), '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  }
  std::string key() {  // proto3 map keys are strings: libprotobuf insists on UTF-8
    static const char* kKeys[] = {"", "a", "image", "label", "x/y", "ключ", "long_feature_name_0123456789"};
    return u(3) == 0 ? kKeys[u(7)] : "k" + std::to_string(u(40));
  }
  Feature feature() {
    size_t n = u(4) == 0 ? u(300) : u(5);
    switch (u(7)) {
      case 0: return Feature{};
      case 1:
      case 2: {
        std::vector<std::string> v(n);
        for (auto& s : v) s = any_bytes(u(4) == 0 ? 300 : 8);
        return Feature::of_bytes(std::move(v));
      }
      case 3:
      case 4: {
        std::vector<float> v(n);
        for (auto& x : v) x = any_float();
        return Feature::of_floats(std::move(v));
      }
      default: {
        std::vector<int64_t> v(n);
        for (auto& x : v) x = any_int();
        return Feature::of_ints(std::move(v));
      }
    }
  }
  Features features() {
    Features fs;
    size_t n = u(8);
    for (size_t i = 0; i < n; ++i) fs[key()] = feature();
    return fs;
  }
  SequenceExample sequence() {
    SequenceExample s;
    s.context = features();
    size_t n = u(5);
    for (size_t i = 0; i < n; ++i) {
      auto& steps = s.feature_lists[key()];
      steps.clear();
      size_t t = u(6);
      for (size_t j = 0; j < t; ++j) steps.push_back(feature());
    }
    return s;
  }
};

// ---- hand-assembled wire format ----

std::string varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}
std::string tag(int field, int wire) { return varint((static_cast<uint64_t>(field) << 3) | wire); }
std::string len_field(int field, const std::string& payload) {
  return tag(field, 2) + varint(payload.size()) + payload;
}
std::string fixed32(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(b >> (8 * i)));
  return s;
}
// An Example holding one feature whose Feature message body is `feature`.
std::string entry(const std::string& key, const std::string& feature) {
  return len_field(1, len_field(1, key) + len_field(2, feature));
}
std::string example_of(const std::string& entries) { return len_field(1, entries); }

std::vector<std::string> strs(const Value& v) { return v.strings().values; }
template <typename T>
std::vector<T> vals(const Value& v) {
  return v.tensor().to_vector<T>();
}

// ---- encode / decode ----

TEST(ExampleCodec, EncodesTheBytesTensorFlowDoes) {
  // Example{features{feature{key:"a" value{int64_list{value:[1, 300]}}}}} by hand.
  Features fs{{"a", Feature::of_ints({1, 300})}};
  const std::string want =
      "\x0a\x0e"               // Example.features, 14 bytes
      "\x0a\x0c"               // Features.feature: a map entry, 12 bytes
      "\x0a\x01\x61"           // key "a"
      "\x12\x07"               // value: Feature, 7 bytes
      "\x1a\x05"               // int64_list: Int64List, 5 bytes
      "\x0a\x03\x01\xac\x02";  // value, packed: varints 1 and 300
  EXPECT_EQ(encode_example(fs), want);
  std::string feature = len_field(3, len_field(1, varint(1) + varint(300)));
  EXPECT_EQ(encode_example(fs), example_of(entry("a", feature)));
  // Floats are packed little-endian fixed32; bytes one field per value; empty lists
  // still select the kind; a Feature with no list is an empty message.
  Features more{{"b", Feature::of_bytes({"xy", ""})},
                {"e", Feature::of_floats({})},
                {"f", Feature::of_floats({1.5f})},
                {"n", Feature{}}};
  std::string entries = entry("b", len_field(1, len_field(1, "xy") + len_field(1, ""))) + entry("e", len_field(2, "")) +
                        entry("f", len_field(2, len_field(1, fixed32(1.5f)))) + entry("n", "");
  EXPECT_EQ(encode_example(more), example_of(entries));
  EXPECT_EQ(encode_example({}), std::string("\x0a\x00", 2));
  EXPECT_EQ(decode_example(example_of(entries)), more);
  EXPECT_TRUE(decode_example("").empty());
}

TEST(ExampleCodec, AppendsToAString) {
  std::string out = "prefix";
  Features fs{{"a", Feature::of_floats({1, 2})}};
  encode_example(fs, &out);
  EXPECT_EQ(out, "prefix" + encode_example(fs));
}

TEST(ExampleCodec, RandomRoundTripsAgainstLibprotobuf) {
  Gen g(1);
  for (int it = 0; it < 400; ++it) {
    Features fs = g.features();
    tensorflow::Example ref = to_proto(fs);
    std::string ours = encode_example(fs);
    // Byte-identical to libprotobuf's deterministic serialization.
    ASSERT_EQ(ours, deterministic(ref)) << "iteration " << it;
    // libprotobuf reads ours back to the same features.
    tensorflow::Example parsed;
    ASSERT_TRUE(parsed.ParseFromString(ours));
    EXPECT_EQ(from_proto(parsed.features()), fs);
    // We read libprotobuf's (default, unordered) serialization.
    EXPECT_EQ(decode_example(ref.SerializeAsString()), fs) << "iteration " << it;
  }
}

TEST(ExampleCodec, SequenceExampleRoundTripsAgainstLibprotobuf) {
  Gen g(2);
  for (int it = 0; it < 200; ++it) {
    SequenceExample s = g.sequence();
    tensorflow::SequenceExample ref = to_proto(s);
    std::string ours = encode_sequence_example(s);
    ASSERT_EQ(ours, deterministic(ref)) << "iteration " << it;
    tensorflow::SequenceExample parsed;
    ASSERT_TRUE(parsed.ParseFromString(ours));
    EXPECT_EQ(from_proto(parsed), s);
    EXPECT_EQ(decode_sequence_example(ref.SerializeAsString()), s);
  }
}

TEST(ExampleCodec, MergesConcatenatedMessagesLikeLibprotobuf) {
  // Concatenated messages merge: a key given again replaces the feature, and a Feature
  // merges list by list (oneof: the last kind wins; the same kind appends).
  Gen g(3);
  for (int it = 0; it < 200; ++it) {
    std::string a = encode_example(g.features()), b = encode_example(g.features());
    tensorflow::Example ref;
    ASSERT_TRUE(ref.ParseFromString(a + b));
    EXPECT_EQ(decode_example(a + b), from_proto(ref.features()));
    SequenceExample s1 = g.sequence(), s2 = g.sequence();
    std::string sa = encode_sequence_example(s1), sb = encode_sequence_example(s2);
    tensorflow::SequenceExample sref;
    ASSERT_TRUE(sref.ParseFromString(sa + sb));
    EXPECT_EQ(decode_sequence_example(sa + sb), from_proto(sref));
  }
  // Inside one map entry: two value fields merge, two key fields keep the last.
  std::string f1 = len_field(3, len_field(1, varint(1))), f2 = len_field(3, len_field(1, varint(2)));
  std::string f3 = len_field(2, tag(1, 5) + fixed32(2.5f));
  std::string e = len_field(1, len_field(1, "x") + len_field(2, f1) + len_field(1, "y") + len_field(2, f2));
  std::string bytes = example_of(e + len_field(1, len_field(1, "z") + len_field(2, f1 + f3)));
  tensorflow::Example ref;
  ASSERT_TRUE(ref.ParseFromString(bytes));
  Features want{{"y", Feature::of_ints({1, 2})}, {"z", Feature::of_floats({2.5f})}};
  EXPECT_EQ(from_proto(ref.features()), want);
  EXPECT_EQ(decode_example(bytes), want);
}

TEST(ExampleCodec, ReadsUnpackedListsAndSkipsUnknownFields) {
  std::string ints = tag(1, 0) + varint(7) + len_field(1, varint(8) + varint(uint64_t(-1))) + tag(1, 0) + varint(9);
  std::string floats =
      tag(1, 5) + fixed32(1.0f) + len_field(1, fixed32(2.0f) + fixed32(3.0f)) + tag(1, 5) + fixed32(4.0f);
  std::string unknown =
      tag(7, 0) + varint(5) + tag(9, 1) + std::string(8, 'x') + tag(12, 5) + "abcd" + len_field(100000, "junk");
  std::string bytes = example_of(entry("i", len_field(3, ints + unknown) + unknown) + unknown +
                                 entry("f", unknown + len_field(2, unknown + floats))) +
                      unknown;
  tensorflow::Example ref;
  ASSERT_TRUE(ref.ParseFromString(bytes));
  Features want{{"i", Feature::of_ints({7, 8, -1, 9})}, {"f", Feature::of_floats({1, 2, 3, 4})}};
  EXPECT_EQ(from_proto(ref.features()), want);
  EXPECT_EQ(decode_example(bytes), want);
  // A varint with bits past 64 in its 10th byte keeps the low 64, like libprotobuf.
  std::string wide = tag(1, 0) + std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 10);
  std::string w = example_of(entry("w", len_field(3, wide)));
  ASSERT_TRUE(ref.ParseFromString(w));
  EXPECT_EQ(decode_example(w), from_proto(ref.features()));
  EXPECT_EQ(decode_example(w).at("w").ints, std::vector<int64_t>{-1});
}

TEST(ExampleCodec, EveryTruncationFailsOrAgreesWithLibprotobuf) {
  google::protobuf::LogSilencer quiet;  // libprotobuf logs each cut-off UTF-8 key it rejects
  Gen g(4);
  int failures = 0;
  for (int it = 0; it < 40; ++it) {
    std::string full = encode_example(g.features());
    for (size_t n = 0; n < full.size(); ++n) {
      std::string cut = full.substr(0, n);
      tensorflow::Example ref;
      bool ok = ref.ParseFromString(cut);
      try {
        Features got = decode_example(cut);
        EXPECT_TRUE(ok) << "kiln accepted a prefix libprotobuf rejects, " << n << " of " << full.size();
        if (ok) {
          EXPECT_EQ(got, from_proto(ref.features()));
        }
      } catch (const DataLossError& e) {
        EXPECT_FALSE(ok) << "kiln rejected a prefix libprotobuf accepts: " << e.what();
        EXPECT_NE(std::string(e.what()).find("malformed Example: "), std::string::npos) << e.what();
        ++failures;
      }
    }
  }
  EXPECT_GT(failures, 100);
}

TEST(ExampleCodec, CorruptBytesFailCleanlyOrAgreeWithLibprotobuf) {
  google::protobuf::LogSilencer quiet;  // libprotobuf logs each non-UTF-8 key it rejects
  Gen g(5);
  int rejected = 0, agreed = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string s = it % 2 ? encode_example(g.features()) : encode_sequence_example(g.sequence());
    if (s.empty()) continue;
    int flips = 1 + static_cast<int>(g.u(3));
    for (int k = 0; k < flips; ++k) s[g.u(s.size())] = static_cast<char>(g.rng());
    if (it % 2) {
      tensorflow::Example ref;
      bool ok = ref.ParseFromString(s);
      try {
        Features got = decode_example(s);
        if (ok) {
          EXPECT_EQ(got, from_proto(ref.features()));
          ++agreed;
        }
      } catch (const DataLossError&) {
        ++rejected;
      }
    } else {
      tensorflow::SequenceExample ref;
      bool ok = ref.ParseFromString(s);
      try {
        SequenceExample got = decode_sequence_example(s);
        if (ok) {
          EXPECT_EQ(got, from_proto(ref));
          ++agreed;
        }
      } catch (const DataLossError&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 100);
  EXPECT_GT(agreed, 100);
}

TEST(ExampleCodec, MalformedInputNamesWhatAndWhere) {
  std::string f = len_field(3, len_field(1, varint(1)));
  std::string ok = example_of(entry("x", f));
  ASSERT_EQ(decode_example(ok).at("x").ints, std::vector<int64_t>{1});
  // Truncated varint: a tag byte with its continuation bit set, at the end.
  EXPECT_KILN_ERROR(decode_example(ok + "\x80"), kDataLoss, "malformed Example: truncated varint at byte 14");
  // Length past the end: Example.features claims 100 bytes.
  EXPECT_KILN_ERROR(decode_example(std::string("\x0a\x64\x0a", 3)), kDataLoss,
                    "field 1: length 100 past the end (1 bytes left) at byte 1");
  // Nested overrun: the map entry's length exceeds its enclosing Features message.
  std::string nested = "\x0a\x03\x0a\x05\x0a\x01x";
  EXPECT_KILN_ERROR(decode_example(nested + "\x12\x00"), kDataLoss, "length 5 past the end (1 bytes left) at byte 3");
  // Wrong wire type for a known field.
  EXPECT_KILN_ERROR(decode_example(tag(1, 0) + varint(3)), kDataLoss,
                    "Example.features (field 1) has wire type varint, expected length-delimited at byte 0");
  EXPECT_KILN_ERROR(decode_example(example_of(entry("x", len_field(2, tag(1, 0) + varint(1))))), kDataLoss,
                    "FloatList.value (field 1) has wire type varint, expected fixed32");
  EXPECT_KILN_ERROR(decode_example(example_of(entry("x", tag(3, 0) + varint(1)))), kDataLoss,
                    "Feature.int64_list (field 3) has wire type varint");
  EXPECT_KILN_ERROR(decode_example(example_of(len_field(1, tag(1, 5) + "abcd"))), kDataLoss, "map key (field 1)");
  // Packed floats not a multiple of 4 bytes; a packed int64 ending mid-varint.
  EXPECT_KILN_ERROR(decode_example(example_of(entry("x", len_field(2, len_field(1, "abcde"))))), kDataLoss,
                    "packed FloatList.value of 5 bytes, not a multiple of 4");
  EXPECT_KILN_ERROR(decode_example(example_of(entry("x", len_field(3, len_field(1, "\x01\x81"))))), kDataLoss,
                    "truncated varint in packed Int64List.value");
  // Varints longer than 10 bytes, field number 0, groups, wire types 6 and 7.
  EXPECT_KILN_ERROR(
      decode_example(example_of(entry("x", len_field(3, len_field(1, std::string(10, '\x80') + "\x01"))))), kDataLoss,
      "varint longer than 10 bytes");
  EXPECT_KILN_ERROR(decode_example(std::string("\x02\x00", 2)), kDataLoss, "invalid tag 2 (field number 0");
  EXPECT_KILN_ERROR(decode_example(tag(5, 3) + tag(5, 4)), kDataLoss, "unsupported wire type 3 (start-group)");
  EXPECT_KILN_ERROR(decode_example(tag(5, 6)), kDataLoss, "unsupported wire type 6");
  EXPECT_KILN_ERROR(decode_example(tag(5, 5) + "ab"), kDataLoss, "truncated fixed32 at byte 1");
  EXPECT_KILN_ERROR(decode_example(tag(5, 1) + "abcdefg"), kDataLoss, "truncated fixed64");
  // A tag past 32 bits.
  EXPECT_KILN_ERROR(decode_example(varint(uint64_t{1} << 35)), kDataLoss, "invalid tag");
  EXPECT_KILN_ERROR(decode_sequence_example(tag(2, 0) + varint(3)), kDataLoss,
                    "malformed SequenceExample: SequenceExample.feature_lists (field 2)");
  EXPECT_KILN_ERROR(decode_sequence_example(len_field(2, len_field(1, len_field(2, tag(1, 0) + varint(1))))), kDataLoss,
                    "FeatureList.feature (field 1) has wire type varint");
}

TEST(ExampleCodec, FeatureEqualityIsBitwiseForFloats) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Feature::of_floats({nan}), Feature::of_floats({nan}));
  EXPECT_NE(Feature::of_floats({0.0f}), Feature::of_floats({-0.0f}));
  EXPECT_NE(Feature::of_floats({}), Feature::of_ints({}));
  EXPECT_NE(Feature::of_floats({}), Feature{});
  EXPECT_EQ(Feature::of_ints({1, 2}).size(), 2u);
  EXPECT_EQ(feature_kind_name(Feature::kInt64), "int64_list");
}

// ---- parse_example ----

ExampleSpec image_spec() {
  return {{"image", FixedLenFeature{Feature::kFloat, {2, 2}}},
          {"label", FixedLenFeature{Feature::kInt64, {}, Feature::of_ints({-1})}},
          {"name", FixedLenFeature{Feature::kBytes, {}}},
          {"tags", VarLenFeature{Feature::kBytes}},
          {"ids", VarLenFeature{Feature::kInt64}}};
}

TEST(ExampleParse, FixedAndVarLenFeatures) {
  Features fs{{"image", Feature::of_floats({1, 2, 3, 4})},
              {"label", Feature::of_ints({7})},
              {"name", Feature::of_bytes({"cat"})},
              {"tags", Feature::of_bytes({"a", "bb"})},
              {"ids", Feature::of_ints({})},
              {"unused", Feature::of_floats({9, 9})}};
  Element e = parse_example(encode_example(fs), image_spec());
  ASSERT_EQ(e.names(), (std::vector<std::string>{"ids", "image", "label", "name", "tags"}));
  EXPECT_EQ(e["image"].tensor().dtype(), DType::kF32);
  EXPECT_EQ(e["image"].shape(), (Shape{2, 2}));
  EXPECT_EQ(vals<float>(e["image"]), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(e["label"].tensor().dtype(), DType::kI64);
  EXPECT_EQ(e["label"].shape(), Shape{});
  EXPECT_EQ(vals<int64_t>(e["label"]), std::vector<int64_t>{7});
  EXPECT_TRUE(e["name"].is_string());
  EXPECT_EQ(e["name"].strings().item(), "cat");
  EXPECT_EQ(e["tags"].shape(), Shape{2});
  EXPECT_EQ(strs(e["tags"]), (std::vector<std::string>{"a", "bb"}));
  EXPECT_EQ(e["ids"].shape(), Shape{0});
  EXPECT_EQ(e["ids"].tensor().dtype(), DType::kI64);
}

TEST(ExampleParse, MissingFeaturesUseDefaultsOrFail) {
  ExampleSpec spec = image_spec();
  // No label: its default. No tags/ids: empty. An empty Feature counts as absent (as in TF).
  Features fs{{"image", Feature::of_floats({1, 2, 3, 4})}, {"name", Feature::of_bytes({""})}, {"ids", Feature{}}};
  Element e = parse_example(encode_example(fs), spec);
  EXPECT_EQ(vals<int64_t>(e["label"]), std::vector<int64_t>{-1});
  EXPECT_EQ(e["tags"].shape(), Shape{0});
  EXPECT_EQ(e["ids"].shape(), Shape{0});
  fs["label"] = Feature{};
  EXPECT_EQ(vals<int64_t>(parse_example(encode_example(fs), spec)["label"]), std::vector<int64_t>{-1});
  fs.erase("image");
  EXPECT_KILN_ERROR(parse_example(encode_example(fs), spec), kInvalidArgument,
                    "feature 'image' is missing and has no default (FixedLenFeature float_list [2, 2])");
  // A string default.
  spec["name"] = FixedLenFeature{Feature::kBytes, {2}, Feature::of_bytes({"p", "q"})};
  Element d = parse_example(encode_example({{"image", Feature::of_floats({0, 0, 0, 0})}}), spec);
  EXPECT_EQ(strs(d["name"]), (std::vector<std::string>{"p", "q"}));
}

TEST(ExampleParse, WrongKindOrCountNamesTheFeature) {
  ExampleSpec spec = image_spec();
  Features fs{{"image", Feature::of_floats({1, 2, 3, 4})}, {"name", Feature::of_bytes({"x"})}};
  fs["label"] = Feature::of_floats({1});
  EXPECT_KILN_ERROR(parse_example(encode_example(fs), spec), kInvalidArgument,
                    "feature 'label': expected int64_list (FixedLenFeature int64_list []), got float_list");
  fs["label"] = Feature::of_ints({1, 2});
  EXPECT_KILN_ERROR(parse_example(encode_example(fs), spec), kInvalidArgument,
                    "feature 'label': expected 1 values (FixedLenFeature int64_list []), got 2");
  fs["label"] = Feature::of_ints({});  // an empty list of the right kind is not absent (as in TF)
  EXPECT_KILN_ERROR(parse_example(encode_example(fs), spec), kInvalidArgument, "expected 1 values");
  fs["label"] = Feature::of_ints({1});
  fs["tags"] = Feature::of_floats({});  // VarLen checks the kind even of an empty list (as in TF)
  EXPECT_KILN_ERROR(parse_example(encode_example(fs), spec), kInvalidArgument,
                    "feature 'tags': expected bytes_list (VarLenFeature bytes_list), got float_list");
  fs.erase("tags");
  fs["image"] = Feature::of_floats({1, 2, 3});
  EXPECT_KILN_ERROR(parse_example(encode_example(fs), spec), kInvalidArgument,
                    "feature 'image': expected 4 values (FixedLenFeature float_list [2, 2]), got 3");
}

TEST(ExampleParse, FollowsProtobufMergingSemantics) {
  ExampleSpec spec{{"x", FixedLenFeature{Feature::kInt64, {2}}}, {"v", VarLenFeature{Feature::kFloat}}};
  // A key given twice: the last entry wins (TensorFlow does the same), for FixedLen and
  // VarLen, including a last entry that is an empty Feature (absent).
  std::string a = encode_example({{"x", Feature::of_ints({1, 2})}, {"v", Feature::of_floats({1, 2, 3})}});
  std::string b = encode_example({{"x", Feature::of_ints({3, 4})}, {"v", Feature::of_floats({5})}});
  Element e = parse_example(a + b, spec);
  EXPECT_EQ(vals<int64_t>(e["x"]), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(vals<float>(e["v"]), std::vector<float>{5});
  Element e2 = parse_example(a + encode_example({{"v", Feature{}}}), spec);
  EXPECT_EQ(e2["v"].shape(), Shape{0});
  Element batch = parse_examples(std::vector<std::string_view>{a + b, b + a}, spec);
  EXPECT_EQ(vals<float>(batch["v"]), (std::vector<float>{5, 0, 0, 1, 2, 3}));
  EXPECT_EQ(vals<int64_t>(batch["v/lengths"]), (std::vector<int64_t>{1, 3}));
  // Lists of one Feature merge; the last kind wins (TensorFlow's fast parser would take
  // the first kind here; libprotobuf and kiln take the last).
  std::string f = len_field(2, len_field(1, fixed32(9))) + len_field(3, len_field(1, varint(1))) +
                  len_field(3, tag(1, 0) + varint(2));
  Element m = parse_example(example_of(entry("x", f)), spec);
  EXPECT_EQ(vals<int64_t>(m["x"]), (std::vector<int64_t>{1, 2}));
}

TEST(ExampleParse, SkipsUnrequestedFeaturesWithoutDecodingThem) {
  // The framing of every map entry is checked; the contents of features the spec does
  // not ask for are not (like TensorFlow's fast parser).
  std::string junk_feature = len_field(2, len_field(1, "abc"));  // a packed float list of 3 bytes
  std::string bytes = example_of(entry("junk", junk_feature) + entry("x", len_field(3, len_field(1, varint(5)))));
  ExampleSpec spec{{"x", FixedLenFeature{Feature::kInt64, {}}}};
  EXPECT_EQ(vals<int64_t>(parse_example(bytes, spec)["x"]), std::vector<int64_t>{5});
  EXPECT_THROW(decode_example(bytes), DataLossError);
  spec["junk"] = VarLenFeature{Feature::kFloat};
  EXPECT_KILN_ERROR(parse_example(bytes, spec), kDataLoss, "packed FloatList.value of 3 bytes");
}

TEST(ExampleParse, BatchStacksAndPads) {
  Gen g(6);
  ExampleSpec spec = image_spec();
  spec["label"] = FixedLenFeature{Feature::kInt64, {}, Feature::of_ints({-1})};
  std::vector<std::string> records;
  std::vector<Features> fss;
  for (int i = 0; i < 17; ++i) {
    Features fs = g.features();  // noise features, overwritten below when they collide
    std::vector<float> img(4);
    for (float& x : img) x = g.any_float();
    fs["image"] = Feature::of_floats(img);
    if (i % 3)
      fs["label"] = Feature::of_ints({g.any_int()});
    else
      fs.erase("label");
    fs["name"] = Feature::of_bytes({g.any_bytes(20)});
    std::vector<std::string> tags(g.u(4));
    for (auto& t : tags) t = g.any_bytes(5);
    fs["tags"] = Feature::of_bytes(tags);
    std::vector<int64_t> ids(g.u(6));
    for (auto& x : ids) x = g.any_int();
    if (i % 4)
      fs["ids"] = Feature::of_ints(ids);
    else
      fs.erase("ids");
    records.push_back(encode_example(fs));
    fss.push_back(fs);
  }
  std::vector<std::string_view> views(records.begin(), records.end());
  ExampleParser parser(spec);
  Element batch = parser.parse_batch(views);
  ASSERT_EQ(batch.names(),
            (std::vector<std::string>{"ids", "ids/lengths", "image", "label", "name", "tags", "tags/lengths"}));
  const int64_t n = 17;
  EXPECT_EQ(batch["image"].shape(), (Shape{n, 2, 2}));
  EXPECT_EQ(batch["label"].shape(), Shape{n});
  EXPECT_EQ(batch["name"].shape(), Shape{n});
  int64_t max_tags = 0, max_ids = 0;
  for (auto& fs : fss) {
    max_tags = std::max<int64_t>(max_tags, fs["tags"].size());
    max_ids = std::max<int64_t>(max_ids, fs.count("ids") ? fs["ids"].size() : 0);
  }
  EXPECT_EQ(batch["tags"].shape(), (Shape{n, max_tags}));
  EXPECT_EQ(batch["ids"].shape(), (Shape{n, max_ids}));
  auto image = vals<float>(batch["image"]);
  auto label = vals<int64_t>(batch["label"]);
  auto ids = vals<int64_t>(batch["ids"]);
  auto ids_len = vals<int64_t>(batch["ids/lengths"]);
  auto tags_len = vals<int64_t>(batch["tags/lengths"]);
  for (int64_t i = 0; i < n; ++i) {
    Features& fs = fss[i];
    EXPECT_EQ(Feature::of_floats({image.begin() + 4 * i, image.begin() + 4 * i + 4}), fs["image"]);
    EXPECT_EQ(label[i], fs.count("label") ? fs["label"].ints[0] : -1);
    EXPECT_EQ(batch["name"].strings().values[i], fs["name"].bytes[0]);
    std::vector<std::string> tags(fs["tags"].bytes);
    tags.resize(max_tags);
    const auto& all_tags = batch["tags"].strings().values;
    EXPECT_EQ(std::vector<std::string>(all_tags.begin() + i * max_tags, all_tags.begin() + (i + 1) * max_tags), tags);
    EXPECT_EQ(tags_len[i], static_cast<int64_t>(fs["tags"].size()));
    std::vector<int64_t> want_ids = fs.count("ids") ? fs["ids"].ints : std::vector<int64_t>{};
    EXPECT_EQ(ids_len[i], static_cast<int64_t>(want_ids.size()));
    want_ids.resize(max_ids, 0);
    EXPECT_EQ(std::vector<int64_t>(ids.begin() + i * max_ids, ids.begin() + (i + 1) * max_ids), want_ids);
    // The batch row equals parsing the record alone.
    Element one = parser.parse(records[i]);
    EXPECT_EQ(one["name"].strings().item(), fs["name"].bytes[0]);
    EXPECT_EQ(strs(one["tags"]), fs["tags"].bytes);
  }
  // The StringTensor overload and the free functions agree.
  StringTensor st(Shape{n}, records);
  Element b2 = parse_examples(st, spec);
  EXPECT_EQ(vals<int64_t>(b2["ids"]), ids);
  EXPECT_EQ(vals<int64_t>(parse_examples(std::span<const std::string_view>(views), spec)["label"]), label);
  // An empty batch.
  Element empty = parser.parse_batch(std::vector<std::string_view>{});
  EXPECT_EQ(empty["image"].shape(), (Shape{0, 2, 2}));
  EXPECT_EQ(empty["tags"].shape(), (Shape{0, 0}));
}

TEST(ExampleParse, BatchErrorsNameTheRecord) {
  ExampleSpec spec{{"x", FixedLenFeature{Feature::kInt64, {}}}};
  std::string good = encode_example({{"x", Feature::of_ints({1})}});
  std::string wrong = encode_example({{"x", Feature::of_floats({1})}});
  std::vector<std::string_view> v{good, good, wrong};
  EXPECT_KILN_ERROR(parse_examples(v, spec), kInvalidArgument,
                    "feature 'x' (record 2): expected int64_list (FixedLenFeature int64_list []), got float_list");
  std::string missing = encode_example({});
  v = {good, missing};
  EXPECT_KILN_ERROR(parse_examples(v, spec), kInvalidArgument, "feature 'x' (record 1) is missing and has no default");
  std::string cut = good.substr(0, good.size() - 1);
  v = {good, good, good, cut};
  EXPECT_KILN_ERROR(parse_examples(v, spec), kDataLoss, "malformed Example (record 3): ");
}

TEST(ExampleParse, RejectsBadSpecs) {
  EXPECT_KILN_ERROR(ExampleParser({{"x", FixedLenFeature{Feature::kNone, {}}}}), kInvalidArgument,
                    "feature 'x': the spec's kind must be");
  EXPECT_KILN_ERROR(ExampleParser({{"x", FixedLenFeature{Feature::kFloat, {-1, 2}}}}), kInvalidArgument,
                    "must be fully defined");
  EXPECT_KILN_ERROR(ExampleParser({{"x", FixedLenFeature{Feature::kFloat, {2}, Feature::of_ints({1, 2})}}}),
                    kInvalidArgument, "default value is a int64_list, the spec's kind is float_list");
  EXPECT_KILN_ERROR(ExampleParser({{"x", FixedLenFeature{Feature::kFloat, {2}, Feature::of_floats({1})}}}),
                    kInvalidArgument, "default value has 1 values, shape [2] needs 2");
  EXPECT_KILN_ERROR(
      ExampleParser({{"x", VarLenFeature{Feature::kFloat}}, {"x/lengths", FixedLenFeature{Feature::kInt64, {}}}}),
      kInvalidArgument, "output name 'x/lengths' given twice");
  EXPECT_KILN_ERROR(ExampleParser({{"x", FixedLenFeature{Feature::kFloat, {1, 1, 1, 1, 1, 1, 1, 1}}}}),
                    kInvalidArgument, "shape of rank 8");
  EXPECT_KILN_ERROR(ExampleParser({{"x", FixedLenFeature{Feature::kFloat, {1 << 30, 1 << 30}}}}), kInvalidArgument,
                    "too large");
  EXPECT_KILN_ERROR(
      parse_sequence_example("", {{"x", VarLenFeature{Feature::kFloat}}}, {{"x", VarLenFeature{Feature::kFloat}}}),
      kInvalidArgument, "output name 'x' given twice");
}

TEST(ExampleParse, ManyFeaturesUseTheHashLookup) {
  ExampleSpec spec;
  Features fs;
  for (int i = 0; i < 40; ++i) {
    spec["f" + std::to_string(i)] = FixedLenFeature{Feature::kInt64, {}};
    fs["f" + std::to_string(i)] = Feature::of_ints({i * 10});
  }
  Element e = parse_example(encode_example(fs), spec);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(vals<int64_t>(e["f" + std::to_string(i)]), std::vector<int64_t>{i * 10});
}

// ---- parse_sequence_example ----

TEST(ExampleParse, SequenceExample) {
  SequenceExample s;
  s.context = {{"len", Feature::of_ints({3})}, {"id", Feature::of_bytes({"seq"})}};
  s.feature_lists = {
      {"tok", {Feature::of_ints({1}), Feature::of_ints({2}), Feature::of_ints({3})}},
      {"emb", {Feature::of_floats({1, 2}), Feature::of_floats({3, 4})}},
      {"words", {Feature::of_bytes({"a"}), Feature::of_bytes({}), Feature{}, Feature::of_bytes({"b", "c"})}},
  };
  ExampleSpec ctx{{"len", FixedLenFeature{Feature::kInt64, {}}}, {"id", FixedLenFeature{Feature::kBytes, {}}}};
  SequenceSpec seq{{"tok", FixedLenSequenceFeature{Feature::kInt64, {}}},
                   {"emb", FixedLenSequenceFeature{Feature::kFloat, {2}}},
                   {"words", VarLenFeature{Feature::kBytes}},
                   {"gone", FixedLenSequenceFeature{Feature::kFloat, {3}, true}}};
  std::string bytes = encode_sequence_example(s);
  Element e = parse_sequence_example(bytes, ctx, seq);
  EXPECT_EQ(e.names(), (std::vector<std::string>{"id", "len", "emb", "gone", "tok", "words", "words/lengths"}));
  EXPECT_EQ(e["id"].strings().item(), "seq");
  EXPECT_EQ(vals<int64_t>(e["len"]), std::vector<int64_t>{3});
  EXPECT_EQ(e["tok"].shape(), Shape{3});
  EXPECT_EQ(vals<int64_t>(e["tok"]), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(e["emb"].shape(), (Shape{2, 2}));
  EXPECT_EQ(vals<float>(e["emb"]), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(e["gone"].shape(), (Shape{0, 3}));
  EXPECT_EQ(e["words"].shape(), (Shape{4, 2}));
  EXPECT_EQ(strs(e["words"]), (std::vector<std::string>{"a", "", "", "", "", "", "b", "c"}));
  EXPECT_EQ(vals<int64_t>(e["words/lengths"]), (std::vector<int64_t>{1, 0, 0, 2}));

  seq["gone"] = FixedLenSequenceFeature{Feature::kFloat, {3}};
  EXPECT_KILN_ERROR(parse_sequence_example(bytes, ctx, seq), kInvalidArgument,
                    "feature list 'gone' is missing (FixedLenSequenceFeature float_list [3]; allow_missing is false)");
  seq.erase("gone");
  seq["emb"] = FixedLenSequenceFeature{Feature::kFloat, {3}};
  EXPECT_KILN_ERROR(parse_sequence_example(bytes, ctx, seq), kInvalidArgument,
                    "feature list 'emb' (step 0): expected 3 values (FixedLenSequenceFeature float_list [3]), got 2");
  seq["emb"] = FixedLenSequenceFeature{Feature::kFloat, {2}};
  s.feature_lists["emb"].push_back(Feature{});
  EXPECT_KILN_ERROR(parse_sequence_example(encode_sequence_example(s), ctx, seq), kInvalidArgument,
                    "feature list 'emb' (step 2): expected 2 values (FixedLenSequenceFeature float_list [2]), got an "
                    "empty Feature");
  s.feature_lists["emb"].back() = Feature::of_ints({1, 2});
  EXPECT_KILN_ERROR(parse_sequence_example(encode_sequence_example(s), ctx, seq), kInvalidArgument,
                    "feature list 'emb' (step 2): expected float_list");
  EXPECT_KILN_ERROR(parse_sequence_example(bytes.substr(0, bytes.size() - 2), ctx, seq), kDataLoss,
                    "malformed SequenceExample: ");
  EXPECT_KILN_ERROR(parse_sequence_example(encode_sequence_example({}), ctx, {}), kInvalidArgument,
                    "feature 'id' is missing");
}

// ---- TensorFlow's records ----

Json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return Json::parse(in);
}

std::string unhex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return s;
}

Feature feature_from_json(const Json& j) {
  std::string kind = j.at("kind");
  if (kind == "bytes_list") {
    std::vector<std::string> v;
    for (const auto& h : j.at("hex")) v.push_back(unhex(h));
    return Feature::of_bytes(v);
  }
  if (kind == "float_list") {
    std::vector<float> v;
    for (const auto& b : j.at("bits")) v.push_back(std::bit_cast<float>(b.get<uint32_t>()));
    return Feature::of_floats(v);
  }
  if (kind == "int64_list") return Feature::of_ints(j.at("values").get<std::vector<int64_t>>());
  EXPECT_EQ(kind, "none");
  return Feature{};
}

Features features_from_json(const Json& j) {
  Features fs;
  for (const auto& [k, v] : j.items()) fs[k] = feature_from_json(v);
  return fs;
}

Feature::Kind kind_from_json(const std::string& k) {
  return k == "bytes_list" ? Feature::kBytes : k == "float_list" ? Feature::kFloat : Feature::kInt64;
}

ExampleSpec spec_from_json(const Json& j) {
  ExampleSpec spec;
  for (const auto& [name, s] : j.items()) {
    Feature::Kind kind = kind_from_json(s.at("kind"));
    if (s.at("type") == "varlen") {
      spec[name] = VarLenFeature{kind};
    } else {
      FixedLenFeature f{kind, s.at("shape").get<std::vector<int64_t>>()};
      if (s.contains("default")) f.default_value = feature_from_json(s.at("default"));
      spec[name] = f;
    }
  }
  return spec;
}

SequenceSpec sequence_spec_from_json(const Json& j) {
  SequenceSpec spec;
  for (const auto& [name, s] : j.items()) {
    Feature::Kind kind = kind_from_json(s.at("kind"));
    if (s.at("type") == "varlen")
      spec[name] = VarLenFeature{kind};
    else
      spec[name] = FixedLenSequenceFeature{kind, s.at("shape").get<std::vector<int64_t>>(), s.at("allow_missing")};
  }
  return spec;
}

// Compares a parsed element with TensorFlow's outputs: same names, types, shapes, values.
void expect_outputs(const Element& got, const Json& want) {
  std::vector<std::string> names;
  for (const auto& [k, v] : want.items()) names.push_back(k);
  std::vector<std::string> got_names = got.names();
  std::sort(got_names.begin(), got_names.end());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(got_names, names);
  for (const auto& [name, w] : want.items()) {
    SCOPED_TRACE(name);
    const Value& v = got[name];
    EXPECT_EQ(v.shape(), Shape(w.at("shape").get<std::vector<int64_t>>()));
    std::string dt = w.at("dtype");
    if (dt == "string") {
      ASSERT_TRUE(v.is_string());
      std::vector<std::string> want_s;
      for (const auto& h : w.at("hex")) want_s.push_back(unhex(h));
      EXPECT_EQ(strs(v), want_s);
    } else if (dt == "f32") {
      ASSERT_EQ(v.tensor().dtype(), DType::kF32);
      std::vector<uint32_t> bits;
      for (float x : vals<float>(v)) bits.push_back(std::bit_cast<uint32_t>(x));
      EXPECT_EQ(bits, w.at("bits").get<std::vector<uint32_t>>());
    } else {
      ASSERT_EQ(v.tensor().dtype(), DType::kI64);
      EXPECT_EQ(vals<int64_t>(v), w.at("values").get<std::vector<int64_t>>());
    }
  }
}

TEST(ExampleFixtures, DecodesTensorFlowsExamples) {
  Json want = load_json(kiln::testing::fixture("example/expected.json"));
  auto records = read_tfrecords(kiln::testing::fixture("example/examples.tfrecord"));
  ASSERT_EQ(records.size(), want.at("examples").size());
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE(i);
    Features fs = decode_example(records[i]);
    EXPECT_EQ(fs, features_from_json(want["examples"][i]));
    // TensorFlow wrote deterministic (key-sorted) serializations: kiln's are the same
    // bytes, unless a key is a prefix of another (Python's upb then puts the longer key
    // first; C++ libprotobuf and kiln sort bytewise, shorter first).
    bool prefix_keys = false;
    for (auto a = fs.begin(); a != fs.end(); ++a)
      for (auto b = std::next(a); b != fs.end(); ++b) prefix_keys |= b->first.starts_with(a->first);
    if (!prefix_keys) {
      EXPECT_EQ(encode_example(fs), records[i]);
    }
    // Re-encoded, libprotobuf reads the same message TensorFlow wrote.
    tensorflow::Example a, b;
    ASSERT_TRUE(a.ParseFromString(records[i]));
    ASSERT_TRUE(b.ParseFromString(encode_example(fs)));
    EXPECT_EQ(deterministic(a), deterministic(b));
  }
  EXPECT_EQ(decode_example(records[0]).at("image").bytes.at(0).size(), 784u);
  EXPECT_EQ(encode_example(decode_example(records[0])), records[0]);
  EXPECT_EQ(decode_example(records[1]).at("no_list").kind, Feature::kNone);
}

TEST(ExampleFixtures, DecodesTensorFlowsSequenceExamples) {
  Json want = load_json(kiln::testing::fixture("example/expected.json"));
  auto records = read_tfrecords(kiln::testing::fixture("example/sequence_examples.tfrecord"));
  ASSERT_EQ(records.size(), want.at("sequence_examples").size());
  for (size_t i = 0; i < records.size(); ++i) {
    SequenceExample s = decode_sequence_example(records[i]);
    EXPECT_EQ(encode_sequence_example(s), records[i]);
    const Json& w = want["sequence_examples"][i];
    EXPECT_EQ(s.context, features_from_json(w.at("context")));
    FeatureLists lists;
    for (const auto& [k, steps] : w.at("feature_lists").items()) {
      lists[k];
      for (const auto& f : steps) lists[k].push_back(feature_from_json(f));
    }
    EXPECT_EQ(s.feature_lists, lists);
  }
}

TEST(ExampleFixtures, ParsesLikeTensorFlow) {
  Json want = load_json(kiln::testing::fixture("example/expected.json"));
  auto records = read_tfrecords(kiln::testing::fixture("example/examples.tfrecord"));
  const Json& p = want.at("parse");
  ExampleSpec spec = spec_from_json(p.at("spec"));
  std::vector<std::string_view> batch;
  for (int r : p.at("batch_records")) batch.push_back(records.at(r));
  {
    SCOPED_TRACE("tf.io.parse_example");
    expect_outputs(parse_examples(batch, spec), p.at("batch"));
  }
  {
    SCOPED_TRACE("tf.io.parse_single_example");
    expect_outputs(parse_example(records.at(p.at("single_record").get<int>()), spec), p.at("single"));
  }
  const Json& ps = want.at("parse_sequence");
  ExampleSpec ctx = spec_from_json(ps.at("context_spec"));
  SequenceSpec seq = sequence_spec_from_json(ps.at("sequence_spec"));
  auto seqs = read_tfrecords(kiln::testing::fixture("example/sequence_examples.tfrecord"));
  ASSERT_EQ(seqs.size(), ps.at("outputs").size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    SCOPED_TRACE("tf.io.parse_single_sequence_example " + std::to_string(i));
    expect_outputs(parse_sequence_example(seqs[i], ctx, seq), ps["outputs"][i]);
  }
}

}  // namespace
}  // namespace kiln::data
