// Checkpoint files (docs/formats/checkpoint.md): round trips of every dtype, the
// safetensors layout checked by hand, corruption (truncation, flipped bytes, malformed
// headers), atomic saves, CheckpointManager pruning/fallback and variable restore.
#include "kiln/train/checkpoint.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "kiln/autodiff/variable.h"
#include "kiln/core/crc32c.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "test_util.h"
#include "core/tensor_file_internal.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using kiln::testing::make;
using kiln::testing::rand_tensor;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln_checkpoint_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string dir_;
};

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string raw_bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.raw_data()), t.nbytes()); }

// A safetensors image: 8-byte little-endian header length, header, data.
std::string st_image(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

uint64_t header_len(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  return n;
}

// Every dtype, plus scalar and empty tensors.
CheckpointData sample() {
  CheckpointData d;
  d.tensors.emplace_back("dense/kernel", rand_tensor({3, 4}, DType::kF32, -2, 2, 7));
  d.tensors.emplace_back("flag", make<bool>({true, false, true}, {3}));
  d.tensors.emplace_back("f64", rand_tensor({2, 1, 3}, DType::kF64, -1e6, 1e6, 8));
  d.tensors.emplace_back("f16", rand_tensor({5}, DType::kF16, -4, 4, 9));
  d.tensors.emplace_back("bf16", rand_tensor({2, 3}, DType::kBF16, -4, 4, 10));
  d.tensors.emplace_back("i64", make<int64_t>({-(int64_t{1} << 60), 0, 42}, {3}));
  d.tensors.emplace_back("i32", make<int32_t>({-7, 2147483647}, {2, 1}));
  d.tensors.emplace_back("i8", make<int8_t>({-128, 5, 127}, {3}));
  d.tensors.emplace_back("u8", make<uint8_t>({0, 200, 255, 1}, {2, 2}));
  d.tensors.emplace_back("scalar", Tensor::scalar<float>(3.25f));
  d.tensors.emplace_back("empty", Tensor::zeros({0, 3}, DType::kF64));
  d.tensors.emplace_back("w2", make<float>({1, 2, 3, 4, 5, 6, 7, 8}, {8}));
  d.metadata["step"] = "100";
  d.metadata["note"] = "quotes \" backslash \\ newline \n unicode \xc3\xa9 \xe2\x82\xac";
  d.metadata["empty"] = "";
  return d;
}

void expect_same(const CheckpointData& a, const CheckpointData& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].first, b.tensors[i].first);
    const Tensor& x = a.tensors[i].second;
    const Tensor& y = b.tensors[i].second;
    EXPECT_EQ(x.dtype(), y.dtype()) << a.tensors[i].first;
    EXPECT_EQ(x.shape(), y.shape()) << a.tensors[i].first;
    EXPECT_EQ(raw_bytes(x), raw_bytes(y)) << a.tensors[i].first;  // bit-exact, NaNs included
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

// Recomputes kiln.header_crc32c per the spec (CRC-32C of the compact dump without the
// key) after `edit`, keeping the data section. Used to forge otherwise-valid files.
std::string rewrite_header(const std::string& file, const std::function<void(Json&)>& edit) {
  uint64_t n = header_len(file);
  Json h = Json::parse(file.substr(8, n));
  edit(h);
  h["__metadata__"].erase("kiln.header_crc32c");
  std::string canon = h.dump();
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32c(canon.data(), canon.size()));
  h["__metadata__"]["kiln.header_crc32c"] = hex;
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return st_image(text, file.substr(8 + n));
}

// ---------------------------------------------------------------------------------------

TEST_F(CheckpointTest, RoundTripsEveryDtypeScalarEmptyAndMetadata) {
  CheckpointData d = sample();
  save_checkpoint(path("a.ckpt"), d);
  CheckpointData back = load_checkpoint(path("a.ckpt"));
  expect_same(d, back);
  ASSERT_NE(back.find("i64"), nullptr);
  EXPECT_EQ(back.find("i64")->to_vector<int64_t>(), (std::vector<int64_t>{-(int64_t{1} << 60), 0, 42}));
  EXPECT_EQ(back.find("scalar")->rank(), 0);
  EXPECT_EQ(back.find("scalar")->item<float>(), 3.25f);
  EXPECT_EQ(back.find("empty")->shape(), (Shape{0, 3}));
  EXPECT_EQ(back.find("nope"), nullptr);
  EXPECT_EQ(listing(), std::vector<std::string>{"a.ckpt"});  // no temp files left
}

TEST_F(CheckpointTest, RoundTripsNothingAndSpecialFloats) {
  CheckpointData empty;
  save_checkpoint(path("e.ckpt"), empty);
  expect_same(empty, load_checkpoint(path("e.ckpt")));

  CheckpointData d;
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  d.tensors.emplace_back("x", make<float>({nan, inf, -inf, -0.0f, 1e-45f}, {5}));
  save_checkpoint(path("s.ckpt"), d);
  expect_same(d, load_checkpoint(path("s.ckpt")));
}

TEST_F(CheckpointTest, LayoutIsSafetensorsWithKilnMetadata) {
  CheckpointData d = sample();
  save_checkpoint(path("a.ckpt"), d);
  std::string f = read_file(path("a.ckpt"));
  uint64_t n = header_len(f);
  ASSERT_LE(8 + n, f.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  std::string text = f.substr(8, n);
  EXPECT_EQ(text[0], '{');
  size_t close = text.rfind('}');
  EXPECT_EQ(text.find_first_not_of(' ', close + 1), std::string::npos) << "header is padded with spaces only";
  Json h = Json::parse(text);
  std::string data = f.substr(8 + n);

  const std::map<std::string, std::string> st_name = {
      {"dense/kernel", "F32"}, {"flag", "BOOL"}, {"f64", "F64"}, {"f16", "F16"},   {"bf16", "BF16"},   {"i64", "I64"},
      {"i32", "I32"},          {"i8", "I8"},     {"u8", "U8"},   {"scalar", "F32"}, {"empty", "F64"}, {"w2", "F32"}};
  const Json& meta = h.at("__metadata__");
  EXPECT_EQ(meta.at("kiln.format"), "kiln-checkpoint-1");
  EXPECT_EQ(meta.at("step"), "100");
  EXPECT_EQ(meta.at("note"), d.metadata["note"]);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string> header_order;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    header_order.push_back(name);
    const Tensor* t = d.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(e.at("dtype"), st_name.at(name));
    EXPECT_EQ(e.at("shape").get<std::vector<int64_t>>(), t->shape().vec());
    uint64_t b = e.at("data_offsets")[0], en = e.at("data_offsets")[1];
    EXPECT_EQ(b % t->itemsize(), 0u) << name << " is not aligned to its item size";
    ASSERT_LE(en, data.size());
    EXPECT_EQ(data.substr(b, en - b), raw_bytes(*t)) << name;
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", crc32c(t->raw_data(), t->nbytes()));
    EXPECT_EQ(meta.at("kiln.crc32c." + name), hex) << name;
    ranges.emplace_back(b, en);
  }
  std::vector<std::string> saved_order;
  for (const auto& [name, _] : d.tensors) saved_order.push_back(name);
  EXPECT_EQ(header_order, saved_order);
  // Contiguous and covering, as safetensors readers require.
  std::sort(ranges.begin(), ranges.end());
  uint64_t pos = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, pos);
    pos = e;
  }
  EXPECT_EQ(pos, data.size());
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32c(data.data(), data.size()));
  EXPECT_EQ(meta.at("kiln.data_crc32c"), hex);
  // The header checksum as the spec defines it: re-deriving it reproduces the file.
  EXPECT_EQ(rewrite_header(f, [](Json&) {}), f);
}

TEST_F(CheckpointTest, ReadsPlainSafetensorsFromOtherWriters) {
  // As Python's safetensors writes it: spaces in the JSON, no kiln checksums.
  std::string header =
      R"({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
      R"("h": {"dtype": "F16", "shape": [1], "data_offsets": [8, 10]}, )"
      R"("g": {"dtype": "BF16", "shape": [1], "data_offsets": [10, 12]}, )"
      R"("b": {"dtype": "I8", "shape": [3], "data_offsets": [12, 15]}, )"
      R"("m": {"dtype": "BOOL", "shape": [2], "data_offsets": [15, 17]}})";
  // 1.5f = 0x3fc00000, -2.0f = 0xc0000000, f16 1.0 = 0x3c00, bf16 -1.0 = 0xbf80.
  std::string data("\x00\x00\xc0\x3f\x00\x00\x00\xc0\x00\x3c\x80\xbf\x01\xff\x7f\x02\x00", 17);
  write_raw(path("p.safetensors"), st_image(header, data));
  CheckpointData d = load_checkpoint(path("p.safetensors"));
  ASSERT_EQ(d.tensors.size(), 5u);
  EXPECT_EQ(d.tensors[0].first, "a");
  EXPECT_EQ(d.find("a")->to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(d.find("h")->to_vector<float>(), (std::vector<float>{1.0f}));
  EXPECT_EQ(d.find("g")->to_vector<float>(), (std::vector<float>{-1.0f}));
  EXPECT_EQ(d.find("b")->to_vector<int32_t>(), (std::vector<int32_t>{1, -1, 127}));
  EXPECT_EQ(d.find("m")->dtype(), DType::kBool);
  EXPECT_EQ(raw_bytes(*d.find("m")), std::string("\x01\x00", 2)) << "non-zero bools read as 1";
  EXPECT_EQ(d.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
}

// ---------------------------------------------------------------------------------------

TEST_F(CheckpointTest, MissingFileIsNotFound) {
  EXPECT_KILN_ERROR(load_checkpoint(path("nope.ckpt")), kNotFound, "nope.ckpt");
}

TEST_F(CheckpointTest, EveryTruncationIsDataLossNamingTheFile) {
  save_checkpoint(path("a.ckpt"), sample());
  std::string f = read_file(path("a.ckpt"));
  uint64_t n = header_len(f);
  // Through files at the interesting cut points: inside the length prefix, inside the
  // header, at the end of the header, inside the data, one byte short.
  for (size_t cut : {size_t{0}, size_t{5}, size_t{8}, size_t{8 + n / 2}, size_t{8 + n}, size_t{8 + n + 3}, f.size() - 1}) {
    write_raw(path("t.ckpt"), f.substr(0, cut));
    SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(f.size()));
    EXPECT_KILN_ERROR(load_checkpoint(path("t.ckpt")), kDataLoss, path("t.ckpt") + " is corrupted");
  }
  for (size_t cut = 0; cut < f.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(f.size()));
    EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(f.substr(0, cut), "t.ckpt"), kDataLoss, "truncated");
  }
}

TEST_F(CheckpointTest, EveryFlippedBitIsDetected) {
  std::string f = kiln::internal::serialize_tensor_file(sample());
  for (int bit : {0, 5}) {
    for (size_t i = 0; i < f.size(); ++i) {
      std::string g = f;
      g[i] = static_cast<char>(g[i] ^ (1 << bit));
      SCOPED_TRACE("bit " + std::to_string(bit) + " of byte " + std::to_string(i));
      EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(g, "mem.ckpt"), kDataLoss, "mem.ckpt is corrupted");
    }
  }
}

TEST_F(CheckpointTest, FlippedDataByteNamesTheTensor) {
  std::string f = kiln::internal::serialize_tensor_file(sample());
  uint64_t n = header_len(f);
  Json h = Json::parse(f.substr(8, n));
  uint64_t b = h["w2"]["data_offsets"][0];
  f[8 + n + b + 5] ^= 0x10;
  write_raw(path("c.ckpt"), f);
  EXPECT_KILN_ERROR(load_checkpoint(path("c.ckpt")), kDataLoss, "checksum mismatch in tensor 'w2'");
  EXPECT_KILN_ERROR(load_checkpoint(path("c.ckpt")), kDataLoss, path("c.ckpt"));
}

TEST_F(CheckpointTest, EditedMetadataFailsTheHeaderChecksum) {
  std::string f = kiln::internal::serialize_tensor_file(sample());
  size_t at = f.find("\"step\":\"100\"");
  ASSERT_NE(at, std::string::npos);
  f[at + 10] = '7';  // still valid JSON, still a string: only the header CRC can tell
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(f, "m.ckpt"), kDataLoss, "header checksum mismatch");
}

TEST_F(CheckpointTest, HeaderLengthTooLarge) {
  std::string f = kiln::internal::serialize_tensor_file(sample());
  std::string g = f;
  g[5] = 1;  // 2^40 bytes
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(g, "m"), kDataLoss, "exceeds the limit");
  g = f;
  uint64_t n = f.size();  // more than what follows the prefix
  std::memcpy(g.data(), &n, 8);
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(g, "m"), kDataLoss, "header length " + std::to_string(n));
}

TEST_F(CheckpointTest, ForgedKilnMetadataIsChecked) {
  std::string f = kiln::internal::serialize_tensor_file(sample());
  // Each forgery carries a correct header checksum, so the later checks must fire.
  auto ghost = rewrite_header(f, [](Json& h) { h["__metadata__"]["kiln.crc32c.ghost"] = "00000000"; });
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(ghost, "m"), kDataLoss, "'kiln.crc32c.ghost' names no tensor");
  auto missing = rewrite_header(f, [](Json& h) { h["__metadata__"].erase("kiln.crc32c.i8"); });
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(missing, "m"), kDataLoss, "'kiln.crc32c.i8' is missing");
  auto upper = rewrite_header(f, [](Json& h) { h["__metadata__"]["kiln.data_crc32c"] = "ABCDEF01"; });
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(upper, "m"), kDataLoss, "8 lowercase hex digits");
  auto data_crc = rewrite_header(f, [](Json& h) {
    std::string v = h["__metadata__"]["kiln.data_crc32c"];
    v[0] = v[0] == '0' ? '1' : '0';
    h["__metadata__"]["kiln.data_crc32c"] = v;
  });
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(data_crc, "m"), kDataLoss, "data section checksum mismatch");
  auto v2 = rewrite_header(f, [](Json& h) { h["__metadata__"]["kiln.format"] = "kiln-checkpoint-2"; });
  EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(v2, "m"), kDataLoss, "unsupported format 'kiln-checkpoint-2'");
  // Unknown kiln.* keys are tolerated (forward compatibility) and not returned.
  auto extra = rewrite_header(f, [](Json& h) { h["__metadata__"]["kiln.writer"] = "future"; });
  CheckpointData d = kiln::internal::parse_tensor_file(extra, "m");
  EXPECT_EQ(d.metadata, sample().metadata);
}

struct Malformed {
  std::string header;
  int data_bytes;
  const char* error;
};

TEST_F(CheckpointTest, MalformedHeadersAreDataLoss) {
  using namespace std::string_literals;
  const Malformed cases[] = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "overlaps tensor 'a'"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12, "gap of 4 bytes before tensor 'b'"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6, "2 bytes after the last tensor"},
      {R"({"a":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}})", 2, "unsupported dtype 'I16'"},
      {R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4, "unsupported dtype 'f32'"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12 bytes"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-1,4]}})", 4, "non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0.0,4]}})", 4, "non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4, "non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}})", 4, "must be [begin, end]"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8, "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 2, "file truncated"},
      {R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1, "maximum rank 8"},
      {R"({"a":{"dtype":"U8","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]}})", 0,
       "too large"},
      {R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0, "too large"},
      {R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8, "needs 36893488147419103232"},
      {R"({"a":{"dtype":"U8","shape":[1e30],"data_offsets":[0,1]}})", 1, "non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[1]}})", 4, "needs 'dtype', 'shape' and 'data_offsets'"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4, "unexpected key 'x'"},
      {R"({"a":5})", 0, "entry must be a JSON object"},
      {R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, "empty name"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "duplicate key 'a'"},
      {R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, "duplicate key 'dtype'"},
      {R"({"a":{"dtype":{"x":{}},"shape":[1],"data_offsets":[0,4]}})", 4, "nests deeper"},
      {R"({"a":[[[[[[[[[[[[]]]]]]]]]]]]})", 0, "nests deeper"},
      {R"({"__metadata__":{"a":1}})", 0, "value of 'a' must be a string"},
      {R"({"__metadata__":[]})", 0, "'__metadata__' must be an object"},
      {R"({"__metadata__":{"kiln.x":"1"}})", 0, "without 'kiln.format'"},
      {R"({"a":)", 0, "malformed JSON header"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"s + "\0\0"s, 4, "NUL byte in the JSON header"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"s + "\0garbage"s, 4, "NUL byte"},
      {R"({"a":"\ud800"})", 0, "malformed JSON header"},
      {R"( {})", 0, "does not start with '{'"},
      {R"([])", 0, "does not start with '{'"},
      {"", 0, "does not start with '{'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    std::string img = st_image(c.header, std::string(static_cast<size_t>(c.data_bytes), '\x01'));
    EXPECT_KILN_ERROR(kiln::internal::parse_tensor_file(img, "bad.ckpt"), kDataLoss, c.error);
  }
}

TEST_F(CheckpointTest, RandomMutationsThrowOnlyDataLoss) {
  // Without kiln checksums every structural check is reachable; whatever the bytes,
  // the loader must load or throw DataLossError, and what loads must save again.
  std::string base = st_image(
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[1,2],"data_offsets":[8,10]}})",
      std::string(10, '\x05'));
  std::mt19937 rng(1234);
  int loaded = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string g = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      size_t at = rng() % g.size();
      switch (rng() % 3) {
        case 0: g[at] = static_cast<char>(rng()); break;
        case 1: g[at] = "0123456789[]{},:\"-e."[rng() % 20]; break;
        default: g.erase(at, 1 + rng() % 3); break;
      }
    }
    try {
      CheckpointData d = kiln::internal::parse_tensor_file(g, "m");
      ++loaded;
      expect_same(d, kiln::internal::parse_tensor_file(kiln::internal::serialize_tensor_file(d), "m2"));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDataLoss) << e.what();
    }
  }
  EXPECT_GT(loaded, 0);  // some mutations (e.g. of data bytes) stay valid
}

// ---------------------------------------------------------------------------------------

TEST_F(CheckpointTest, SaveRejectsBadNamesAndReservedKeys) {
  CheckpointData d;
  d.tensors.emplace_back("a", Tensor::zeros({1}));
  d.tensors.emplace_back("a", Tensor::zeros({2}));
  EXPECT_KILN_ERROR(save_checkpoint(path("x.ckpt"), d), kInvalidArgument, "duplicate checkpoint tensor name 'a'");
  d.tensors = {{"", Tensor::zeros({1})}};
  EXPECT_KILN_ERROR(save_checkpoint(path("x.ckpt"), d), kInvalidArgument, "empty name");
  d.tensors = {{"__metadata__", Tensor::zeros({1})}};
  EXPECT_KILN_ERROR(save_checkpoint(path("x.ckpt"), d), kInvalidArgument, "reserved");
  d.tensors = {{"u", Tensor()}};
  EXPECT_KILN_ERROR(save_checkpoint(path("x.ckpt"), d), kInvalidArgument, "undefined");
  d.tensors = {{"ok", Tensor::zeros({1})}};
  d.metadata = {{"kiln.format", "mine"}};
  EXPECT_KILN_ERROR(save_checkpoint(path("x.ckpt"), d), kInvalidArgument, "'kiln.format'");
  d.metadata = {{"bad", "\xff\xfe"}};
  EXPECT_KILN_ERROR(save_checkpoint(path("x.ckpt"), d), kInvalidArgument, "UTF-8");
  EXPECT_TRUE(listing().empty());
}

TEST_F(CheckpointTest, FailedSaveLeavesThePreviousFileIntact) {
  CheckpointData v1 = sample();
  save_checkpoint(path("a.ckpt"), v1);
  std::string before = read_file(path("a.ckpt"));

  CheckpointData bad;
  bad.tensors = {{"a", Tensor::zeros({1})}, {"a", Tensor::zeros({1})}};
  EXPECT_THROW(save_checkpoint(path("a.ckpt"), bad), InvalidArgumentError);
  EXPECT_EQ(read_file(path("a.ckpt")), before);

  // An I/O failure: the temp file cannot be created because a directory has its name.
  fs::create_directory(path("a.ckpt.tmp." + std::to_string(::getpid())));
  CheckpointData v2;
  v2.tensors = {{"other", Tensor::zeros({4})}};
  EXPECT_THROW(save_checkpoint(path("a.ckpt"), v2), Error);
  fs::remove(path("a.ckpt.tmp." + std::to_string(::getpid())));
  EXPECT_EQ(read_file(path("a.ckpt")), before);
  expect_same(v1, load_checkpoint(path("a.ckpt")));

  // Rename onto a non-empty directory fails after the temp file was written: the temp
  // file must be gone afterwards.
  fs::create_directories(path("d.ckpt/inside"));
  EXPECT_THROW(save_checkpoint(path("d.ckpt"), v2), Error);
  EXPECT_EQ(listing(), (std::vector<std::string>{"a.ckpt", "d.ckpt"}));
}

TEST_F(CheckpointTest, SaveIntoMissingDirectoryFailsWithoutPartialFiles) {
  EXPECT_THROW(save_checkpoint(path("missing/x.ckpt"), sample()), Error);
  EXPECT_TRUE(listing().empty());
  EXPECT_FALSE(fs::exists(path("missing")));
}

// ---------------------------------------------------------------------------------------

CheckpointData with_step(int64_t step) {
  CheckpointData d;
  d.tensors.emplace_back("w", make<int64_t>({step, 2 * step}, {2}));
  d.metadata["step"] = std::to_string(step);
  return d;
}

TEST_F(CheckpointTest, ManagerNamesPrunesAndListsByStep) {
  std::string dir = path("run/ckpts");  // created, parents included
  CheckpointManager m(dir, 3);
  EXPECT_EQ(m.directory(), dir);
  EXPECT_TRUE(m.checkpoints().empty());
  EXPECT_EQ(m.latest(), std::nullopt);
  for (int64_t s : {1, 2, 5, 10, 20}) EXPECT_EQ(m.save(with_step(s), s), dir + "/ckpt-" + std::to_string(s) + ".ckpt");
  std::vector<std::string> want = {dir + "/ckpt-5.ckpt", dir + "/ckpt-10.ckpt", dir + "/ckpt-20.ckpt"};
  EXPECT_EQ(m.checkpoints(), want);  // numeric, not lexicographic, order
  EXPECT_FALSE(fs::exists(dir + "/ckpt-1.ckpt"));
  EXPECT_FALSE(fs::exists(dir + "/ckpt-2.ckpt"));
  EXPECT_EQ(m.latest(), dir + "/ckpt-20.ckpt");

  // Other files in the directory are neither listed nor pruned.
  for (const char* junk : {"ckpt-abc.ckpt", "ckpt-07.ckpt", "other-30.ckpt", "ckpt-30.ckpt.tmp.99", "ckpt--3.ckpt",
                           "ckpt-.ckpt", "ckpt-99999999999999999999.ckpt"})
    write_raw(dir + "/" + junk, "x");
  CheckpointManager again(dir, 3);
  EXPECT_EQ(again.checkpoints(), want);
  again.save(with_step(30), 30);
  EXPECT_EQ(again.latest(), dir + "/ckpt-30.ckpt");
  EXPECT_EQ(again.checkpoints().size(), 3u);
  EXPECT_TRUE(fs::exists(dir + "/ckpt-07.ckpt"));
  EXPECT_TRUE(fs::exists(dir + "/other-30.ckpt"));

  // A step below the newest is kept by its own save; older ones make room.
  again.save(with_step(3), 3);
  EXPECT_EQ(again.checkpoints(),
            (std::vector<std::string>{dir + "/ckpt-3.ckpt", dir + "/ckpt-20.ckpt", dir + "/ckpt-30.ckpt"}));

  // Prefixes separate runs sharing a directory.
  CheckpointManager other(dir, 1, "other");
  EXPECT_EQ(other.checkpoints(), (std::vector<std::string>{dir + "/other-30.ckpt"}));
  EXPECT_EQ(again.checkpoints().size(), 3u);
}

TEST_F(CheckpointTest, ManagerKeepsAllWhenMaxToKeepIsZeroAndChecksArguments) {
  CheckpointManager m(path("all"), 0);
  for (int64_t s = 0; s < 7; ++s) m.save(with_step(s), s);
  EXPECT_EQ(m.checkpoints().size(), 7u);
  EXPECT_KILN_ERROR(m.save(with_step(1), -1), kInvalidArgument, "step");
  EXPECT_KILN_ERROR(CheckpointManager(path("p"), 3, "a/b"), kInvalidArgument, "prefix");
  write_raw(path("file"), "x");
  EXPECT_KILN_ERROR(CheckpointManager(path("file"), 3), kFailedPrecondition, path("file"));
}

TEST_F(CheckpointTest, RestoreLatestFallsBackPastCorruptedCheckpoints) {
  CheckpointManager m(path("c"), 5);
  std::vector<std::pair<std::string, std::string>> skipped;
  EXPECT_EQ(m.restore_latest(&skipped), std::nullopt);
  EXPECT_TRUE(skipped.empty());

  std::string p1 = m.save(with_step(1), 1), p2 = m.save(with_step(2), 2), p3 = m.save(with_step(3), 3);
  auto r = m.restore_latest(&skipped);
  ASSERT_TRUE(r.has_value());
  expect_same(*r, with_step(3));
  EXPECT_TRUE(skipped.empty());

  // Torn newest file (as if the machine died mid-write without atomic rename).
  std::string f3 = read_file(p3);
  write_raw(p3, f3.substr(0, f3.size() - 3));
  r = m.restore_latest(&skipped);
  ASSERT_TRUE(r.has_value());
  expect_same(*r, with_step(2));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].first, p3);
  EXPECT_NE(skipped[0].second.find("truncated"), std::string::npos) << skipped[0].second;
  EXPECT_TRUE(fs::exists(p3)) << "corrupted checkpoints are left in place";
  EXPECT_EQ(m.latest(), p3) << "latest() does not validate";

  // Bit rot in the next one as well.
  std::string f2 = read_file(p2);
  f2[f2.size() - 1] ^= 0x40;
  write_raw(p2, f2);
  r = m.restore_latest(&skipped);
  ASSERT_TRUE(r.has_value());
  expect_same(*r, with_step(1));
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[1].first, p2);
  EXPECT_NE(skipped[1].second.find("checksum mismatch in tensor 'w'"), std::string::npos) << skipped[1].second;

  write_raw(p1, "");
  EXPECT_EQ(m.restore_latest(&skipped), std::nullopt);
  EXPECT_EQ(skipped.size(), 3u);
  EXPECT_EQ(m.restore_latest(), std::nullopt);  // the out-param is optional
}

// ---------------------------------------------------------------------------------------

TEST_F(CheckpointTest, VariablesRoundTripThroughAFile) {
  Variable w(rand_tensor({3, 2}, DType::kF32, -1, 1, 3), "dense/w");
  Variable b(make<int32_t>({4, 5}, {2}), "dense/b", false);
  CheckpointData d;
  d.metadata["epoch"] = "3";
  add_variables(d, {w, b});
  Tensor w0 = w.peek().clone();
  // The checkpoint holds a snapshot: later in-place updates do not leak into it.
  static_cast<float*>(w.peek().raw_data())[0] += 1.0f;
  EXPECT_EQ(raw_bytes(*d.find("dense/w")), raw_bytes(w0));
  save_checkpoint(path("v.ckpt"), d);

  Variable w2(Tensor::zeros({3, 2}), "dense/w");
  Variable b2(Tensor::zeros({2}, DType::kI32), "dense/b");
  CheckpointData back = load_checkpoint(path("v.ckpt"));
  restore_variables(back, {w2, b2});
  EXPECT_EQ(raw_bytes(w2.peek()), raw_bytes(w0));
  EXPECT_EQ(b2.peek().to_vector<int32_t>(), (std::vector<int32_t>{4, 5}));
  EXPECT_FALSE(w2.peek().is_same(*back.find("dense/w"))) << "restored values are copies";
  EXPECT_EQ(back.metadata.at("epoch"), "3");
}

TEST_F(CheckpointTest, AddVariablesRejectsNameClashes) {
  Variable a(Tensor::zeros({1}), "a");
  CheckpointData d;
  d.tensors.emplace_back("a", Tensor::zeros({1}));
  EXPECT_KILN_ERROR(add_variables(d, {a}), kInvalidArgument, "already has a tensor named 'a'");
  CheckpointData e;
  EXPECT_KILN_ERROR(add_variables(e, {Variable(Tensor::zeros({1}), "x"), Variable(Tensor::zeros({2}), "x")}),
                    kInvalidArgument, "'x'");
  EXPECT_TRUE(e.tensors.empty()) << "nothing added on error";
}

TEST_F(CheckpointTest, RestoreVariablesValidatesBeforeAssigning) {
  CheckpointData d;
  d.tensors.emplace_back("a", make<float>({1, 2}, {2}));
  d.tensors.emplace_back("b", make<float>({3, 4, 5, 6}, {2, 2}));
  Variable a(make<float>({9, 9}, {2}), "a");
  Variable b_shape(Tensor::zeros({4}), "b");
  Variable b_dtype(Tensor::zeros({2, 2}, DType::kF64), "b");
  Variable c(Tensor::zeros({1}), "c");

  EXPECT_KILN_ERROR(restore_variables(d, {a, c}), kNotFound, "'c'");
  EXPECT_KILN_ERROR(restore_variables(d, {a, b_shape}), kInvalidArgument, "variable 'b' is f32[4]");
  EXPECT_KILN_ERROR(restore_variables(d, {a, b_dtype}), kInvalidArgument, "f64[2, 2]");
  EXPECT_EQ(a.peek().to_vector<float>(), (std::vector<float>{9, 9})) << "nothing assigned on error";
  restore_variables(d, {a});
  EXPECT_EQ(a.peek().to_vector<float>(), (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace kiln::train
