// Writes tf.train.Example and SequenceExample records with kiln's encoder into
// DIR/examples.tfrecord and DIR/sequence_examples.tfrecord, and what they hold into
// DIR/expected.json; read_examples_tf.py then reads them back with TensorFlow.
// JSON: floats as IEEE-754 bit patterns ("bits"), bytes as hex, int64 as numbers.
#include <bit>
#include <cstdio>
#include <exception>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/data/example.h"
#include "kiln/data/tfrecord.h"

namespace {

using kiln::data::Feature;
using kiln::data::Features;
using Json = nlohmann::ordered_json;

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (unsigned char c : s) {
    h.push_back(d[c >> 4]);
    h.push_back(d[c & 15]);
  }
  return h;
}

Json feature_json(const Feature& f) {
  Json j;
  j["kind"] = f.kind == Feature::kNone ? "none" : std::string(kiln::data::feature_kind_name(f.kind));
  if (f.kind == Feature::kBytes) {
    j["hex"] = Json::array();
    for (const auto& s : f.bytes) j["hex"].push_back(hex(s));
  } else if (f.kind == Feature::kFloat) {
    j["bits"] = Json::array();
    for (float x : f.floats) j["bits"].push_back(std::bit_cast<uint32_t>(x));
  } else if (f.kind == Feature::kInt64) {
    j["values"] = f.ints;
  }
  return j;
}

Json features_json(const Features& fs) {
  Json j = Json::object();
  for (const auto& [k, f] : fs) j[k] = feature_json(f);
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  try {
    std::string dir = argv[1];
    Json expected;
    expected["examples"] = Json::array();
    std::vector<std::string> records;
    const float inf = std::numeric_limits<float>::infinity();
    for (int i = 0; i < 12; ++i) {
      Features fs;
      std::string image(784, '\0');
      for (size_t k = 0; k < image.size(); ++k) image[k] = static_cast<char>((k * 31 + i * 7) & 0xff);
      fs["image"] = Feature::of_bytes({image});
      fs["label"] = Feature::of_ints({i % 10});
      fs["vec"] = Feature::of_floats({0.5f * i, -0.0f, i % 2 ? inf : 1e-45f});
      std::vector<int64_t> ids;
      for (int k = 0; k < i % 4; ++k)
        ids.push_back(k == 1 ? std::numeric_limits<int64_t>::min() : int64_t{1} << (8 * k + i));
      if (i % 3) fs["ids"] = Feature::of_ints(ids);  // absent from every third record
      std::vector<std::string> tags(i % 3, std::string("t") + std::to_string(i));
      fs["tags"] = i == 5 ? Feature{} : Feature::of_bytes(tags);  // record 5: a Feature with no list
      fs["empty"] = Feature::of_floats({});
      if (i == 0) fs["ключ/ü"] = Feature::of_bytes({std::string("\0\xff", 2)});
      records.push_back(kiln::data::encode_example(fs));
      expected["examples"].push_back(features_json(fs));
    }
    kiln::data::write_tfrecords(dir + "/examples.tfrecord", records);
    // The same records compressed, for TF's compression_type GZIP and ZLIB.
    using kiln::data::Compression;
    for (auto [ext, c] : {std::pair{".gz", Compression::kGzip}, std::pair{".zz", Compression::kZlib}}) {
      kiln::data::TFRecordWriter w(dir + "/examples.tfrecord" + ext, {.atomic = true, .compression = c});
      for (const auto& r : records) w.write(r);
      w.close();
    }

    expected["sequence_examples"] = Json::array();
    records.clear();
    for (int i = 0; i < 4; ++i) {
      kiln::data::SequenceExample s;
      s.context["length"] = Feature::of_ints({i});
      s.context["name"] = Feature::of_bytes({"seq" + std::to_string(i)});
      for (int t = 0; t < i; ++t) {
        s.feature_lists["frames"].push_back(Feature::of_floats({float(t), float(-t), 0.25f}));
        s.feature_lists["tokens"].push_back(Feature::of_ints({100 * i + t}));
        s.feature_lists["words"].push_back(Feature::of_bytes(std::vector<std::string>(t, "w")));
      }
      if (i == 0) s.feature_lists["frames"];  // present with no steps
      records.push_back(kiln::data::encode_sequence_example(s));
      Json j;
      j["context"] = features_json(s.context);
      j["feature_lists"] = Json::object();
      for (const auto& [k, steps] : s.feature_lists) {
        j["feature_lists"][k] = Json::array();
        for (const Feature& f : steps) j["feature_lists"][k].push_back(feature_json(f));
      }
      expected["sequence_examples"].push_back(j);
    }
    kiln::data::write_tfrecords(dir + "/sequence_examples.tfrecord", records);
    std::ofstream(dir + "/expected.json") << expected.dump(1) << "\n";
    std::printf("%s\n", dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_examples: %s\n", e.what());
    return 1;
  }
  return 0;
}
