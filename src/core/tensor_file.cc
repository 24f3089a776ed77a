// Tensor files (checkpoints, package weights): safetensors layout plus kiln's CRC-32C
// integrity metadata. The format, and why each check exists, is specified in
// docs/formats/checkpoint.md.
#include "kiln/core/tensor_file.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <tuple>
#include <unordered_set>

#include "kiln/core/crc32c.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "tensor_file_internal.h"

namespace kiln {
namespace {

static_assert(std::endian::native == std::endian::little, "checkpoint I/O assumes a little-endian host");

// ordered_json keeps the header's key order: tensors load in the order they were
// saved, and the header checksum is over a canonical dump that must reproduce it.
using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kKilnPrefix = "kiln.";
constexpr std::string_view kTensorCrcPrefix = "kiln.crc32c.";
constexpr const char* kFormatKey = "kiln.format";
constexpr const char* kHeaderCrcKey = "kiln.header_crc32c";
constexpr const char* kDataCrcKey = "kiln.data_crc32c";

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"BOOL", DType::kBool}, {"U8", DType::kU8},     {"I8", DType::kI8},   {"I32", DType::kI32}, {"I64", DType::kI64},
    {"F16", DType::kF16},   {"BF16", DType::kBF16}, {"F32", DType::kF32}, {"F64", DType::kF64},
};

const char* safetensors_dtype(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  KILN_CHECK_INTERNAL(false, "no safetensors name for dtype ", dtype_name(t));
  return nullptr;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Exactly eight lowercase hex digits, as the writer produces.
std::optional<uint32_t> parse_hex32(const std::string& s) {
  if (s.size() != 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  return v;
}

std::string u128_str(unsigned __int128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v);
  return s;
}

std::string sq(std::string_view s) { return "'" + std::string(s) + "'"; }

class Corrupt {
 public:
  explicit Corrupt(const std::string& source) : source_(source) {}
  [[noreturn]] void operator()(const std::string& why) const {
    throw DataLossError("checkpoint " + source_ + " is corrupted: " + why);
  }

 private:
  const std::string& source_;
};

// Thrown out of the JSON parser callback to stop parsing early.
struct HeaderReject {
  std::string why;
};

Json parse_header(std::string_view text, const Corrupt& corrupt) {
  // A valid header nests at most three deep (root, entry or metadata, shape or
  // offsets array); stopping deeper input bounds memory on hostile files. Duplicate
  // keys would be silently merged by the parser, hiding a tensor, so they are errors.
  std::vector<std::unordered_set<std::string>> keys;
  auto cb = [&](int depth, Json::parse_event_t ev, Json& parsed) -> bool {
    switch (ev) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= 3) throw HeaderReject{"JSON header nests deeper than a checkpoint header can"};
        if (ev == Json::parse_event_t::object_start) keys.emplace_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.back().insert(parsed.get<std::string>()).second)
          throw HeaderReject{"duplicate key " + sq(parsed.get<std::string>()) + " in JSON header"};
        break;
      case Json::parse_event_t::object_end:
        keys.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), cb);
  } catch (const HeaderReject& r) {
    corrupt(r.why);
  } catch (const Json::exception& e) {
    corrupt(std::string("malformed JSON header: ") + e.what());
  }
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
  size_t index;  // position in the header
};

uint64_t get_u64(const Json& v, const std::string& what, const Corrupt& corrupt) {
  if (!v.is_number_unsigned()) corrupt(what + " must be a non-negative integer, got " + v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const Json& v, uint64_t data_size, const Corrupt& corrupt) {
  std::string t = "tensor " + sq(name);
  if (name.empty()) corrupt("a tensor has an empty name");
  if (!v.is_object()) corrupt(t + ": entry must be a JSON object, got " + v.dump());
  for (const auto& [k, _] : v.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets") corrupt(t + ": unexpected key " + sq(k));
  if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    corrupt(t + ": entry needs 'dtype', 'shape' and 'data_offsets'");
  Entry e{name, DType::kF32, Shape{}, 0, 0, 0};

  const Json& dt = v["dtype"];
  if (!dt.is_string()) corrupt(t + ": dtype must be a string, got " + dt.dump());
  const std::string& dts = dt.get_ref<const std::string&>();
  auto it = std::find_if(std::begin(kDTypeNames), std::end(kDTypeNames), [&](const DTypeName& d) { return dts == d.name; });
  if (it == std::end(kDTypeNames))
    corrupt(t + ": unknown or unsupported dtype " + sq(dts) + " (kiln reads BOOL U8 I8 I32 I64 F16 BF16 F32 F64)");
  e.dtype = it->dtype;

  const Json& sh = v["shape"];
  if (!sh.is_array()) corrupt(t + ": shape must be an array, got " + sh.dump());
  if (sh.size() > static_cast<size_t>(Shape::kMaxRank))
    corrupt(t + ": rank " + std::to_string(sh.size()) + " exceeds kiln's maximum rank " + std::to_string(Shape::kMaxRank));
  std::vector<int64_t> dims;
  // The product of the non-zero dims must stay far from int64 overflow, so that
  // Shape::numel and byte counts are exact even for zero-element shapes.
  unsigned __int128 nonzero = 1;
  for (const Json& d : sh) {
    uint64_t x = get_u64(d, t + ": shape dimension", corrupt);
    if (x != 0) nonzero *= x;
    if (x > (uint64_t{1} << 62) || nonzero > (static_cast<unsigned __int128>(1) << 62))
      corrupt(t + ": shape " + sh.dump() + " is too large");
    dims.push_back(static_cast<int64_t>(x));
  }
  e.shape = Shape(dims);

  const Json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2) corrupt(t + ": data_offsets must be [begin, end], got " + off.dump());
  e.begin = get_u64(off[0], t + ": data offset", corrupt);
  e.end = get_u64(off[1], t + ": data offset", corrupt);
  if (e.begin > e.end) corrupt(t + ": data_offsets " + off.dump() + " end before they begin");
  if (e.end > data_size)
    corrupt(t + ": data ends at offset " + std::to_string(e.end) + " but the data section has only " +
            std::to_string(data_size) + " bytes (file truncated?)");
  unsigned __int128 want = static_cast<unsigned __int128>(e.shape.numel()) * dtype_size(e.dtype);
  if (want != e.end - e.begin)
    corrupt(t + ": " + dts + e.shape.str() + " needs " + u128_str(want) +
            " bytes but data_offsets " + off.dump() + " hold " + std::to_string(e.end - e.begin));
  return e;
}

uint32_t stored_crc(const std::map<std::string, std::string>& kiln_meta, const std::string& key,
                    const Corrupt& corrupt) {
  auto it = kiln_meta.find(key);
  if (it == kiln_meta.end()) corrupt("checksum " + sq(key) + " is missing from the metadata");
  auto v = parse_hex32(it->second);
  if (!v) corrupt("checksum " + sq(key) + " must be 8 lowercase hex digits, got " + sq(it->second));
  return *v;
}

}  // namespace

// ---------------------------------------------------------------------------------------

namespace internal {

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // Multiplication modulo the (reflected) CRC-32C polynomial; appending len_b bytes
  // multiplies crc_a by x^(8*len_b). Port of zlib 1.2.12's multmodp/x2nmodp.
  constexpr uint32_t kPoly = 0x82f63b78u;
  auto multmodp = [](uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
      if (a & m) {
        p ^= b;
        if ((a & (m - 1)) == 0) break;
      }
      m >>= 1;
      b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
    }
    return p;
  };
  // x2n[k] = x^(2^k) mod p.
  static const auto x2n = [&] {
    std::array<uint32_t, 64> t{};
    uint32_t p = 1u << 30;  // x^1
    for (auto& e : t) {
      e = p;
      p = multmodp(p, p);
    }
    return t;
  }();
  uint32_t p = 1u << 31;  // x^0
  unsigned k = 3;         // 8 bits per byte: x^(2^3 * n)
  for (uint64_t n = len_b; n; n >>= 1, ++k)
    if (n & 1) p = multmodp(x2n[k & 63], p);
  return multmodp(p, crc_a) ^ crc_b;
}

std::string serialize_tensor_file(const TensorFile& data) {
  const size_t n = data.tensors.size();
  std::unordered_set<std::string> names;
  std::vector<Tensor> host(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, t] = data.tensors[i];
    KILN_CHECK_ARG(!name.empty(), "checkpoint tensor #", i, " has an empty name");
    KILN_CHECK_ARG(name != kMetadataKey, "'__metadata__' is reserved and cannot name a checkpoint tensor");
    KILN_CHECK_ARG(names.insert(name).second, "duplicate checkpoint tensor name '", name, "'");
    KILN_CHECK_ARG(t.defined(), "checkpoint tensor '", name, "' is undefined");
    host[i] = t.to(Device::cpu());
  }
  for (const auto& [k, _] : data.metadata)
    KILN_CHECK_ARG(!starts_with(k, kKilnPrefix), "checkpoint metadata key '", k,
                   "' uses the prefix 'kiln.', which is reserved for the file format");

  // Data order: larger items first (stable), so every tensor starts at a multiple of
  // its item size without padding, which safetensors forbids between tensors.
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return host[a].itemsize() > host[b].itemsize(); });
  std::vector<uint64_t> begin(n);
  std::vector<uint32_t> crc(n);
  uint64_t data_size = 0;
  uint32_t data_crc = 0;
  for (size_t i : order) {
    begin[i] = data_size;
    crc[i] = crc32c(host[i].raw_data(), host[i].nbytes());
    data_crc = crc32c_combine(data_crc, crc[i], host[i].nbytes());
    data_size += host[i].nbytes();
  }

  Json meta = Json::object();
  meta[kFormatKey] = kFormatVersion;
  for (const auto& [k, v] : data.metadata) meta[k] = v;
  for (size_t i = 0; i < n; ++i) meta[std::string(kTensorCrcPrefix) + data.tensors[i].first] = hex32(crc[i]);
  meta[kDataCrcKey] = hex32(data_crc);
  Json h = Json::object();
  h[std::string(kMetadataKey)] = std::move(meta);
  for (size_t i = 0; i < n; ++i) {
    Json e = Json::object();
    e["dtype"] = safetensors_dtype(host[i].dtype());
    e["shape"] = host[i].shape().vec();
    e["data_offsets"] = {begin[i], begin[i] + host[i].nbytes()};
    h[data.tensors[i].first] = std::move(e);
  }
  std::string text;
  try {
    // The header checksum covers the compact dump without its own key.
    std::string canon = h.dump();
    h[std::string(kMetadataKey)][kHeaderCrcKey] = hex32(crc32c(canon.data(), canon.size()));
    text = h.dump();
  } catch (const Json::exception& e) {
    throw InvalidArgumentError(std::string("checkpoint tensor names and metadata must be valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  std::string out;
  out.reserve(8 + text.size() + data_size);
  uint64_t hlen = text.size();
  char len_bytes[8];
  std::memcpy(len_bytes, &hlen, 8);
  out.append(len_bytes, 8);
  out += text;
  for (size_t i : order) out.append(static_cast<const char*>(host[i].raw_data()), host[i].nbytes());
  return out;
}

TensorFile parse_tensor_file(std::string_view bytes, const std::string& source,
                             const std::shared_ptr<const void>& owner) {
  Corrupt corrupt(source);
  if (bytes.size() < 8)
    corrupt("file is truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  if (hlen > kMaxHeaderBytes)
    corrupt("header length " + std::to_string(hlen) + " exceeds the limit of " + std::to_string(kMaxHeaderBytes) +
            " bytes");
  if (hlen > bytes.size() - 8)
    corrupt("file is truncated or the header length is wrong: header length " + std::to_string(hlen) + " but only " +
            std::to_string(bytes.size() - 8) + " bytes follow");
  std::string_view text = bytes.substr(8, hlen);
  if (text.empty() || text[0] != '{') corrupt("JSON header does not start with '{'");
  // The JSON parser stops at a NUL byte, which would let anything after one pass
  // unchecked; valid JSON never contains a raw NUL.
  if (size_t z = text.find('\0'); z != std::string_view::npos)
    corrupt("NUL byte in the JSON header at offset " + std::to_string(8 + z));
  Json h = parse_header(text, corrupt);
  if (!h.is_object()) corrupt("JSON header is not an object");  // unreachable after the '{' check
  const uint64_t data_size = bytes.size() - 8 - hlen;
  const char* data = bytes.data() + 8 + hlen;

  // Metadata: string -> string. Keys starting with "kiln." are the format's own.
  TensorFile out;
  std::map<std::string, std::string> kiln_meta;
  if (auto it = h.find(std::string(kMetadataKey)); it != h.end()) {
    if (!it->is_object()) corrupt("'__metadata__' must be an object, got " + it->dump());
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string()) corrupt("metadata value of " + sq(k) + " must be a string, got " + v.dump());
      (starts_with(k, kKilnPrefix) ? kiln_meta : out.metadata)[k] = v.get<std::string>();
    }
  }
  // Any kiln key marks a kiln file, so one flipped byte in "kiln.format" cannot turn
  // the checks off; files from other safetensors writers have none.
  const bool kiln_file = !kiln_meta.empty();
  if (kiln_file) {
    auto f = kiln_meta.find(kFormatKey);
    if (f == kiln_meta.end()) corrupt("kiln metadata without 'kiln.format'");
    if (f->second != kFormatVersion)
      corrupt("unsupported format " + sq(f->second) + " (this build reads " + kFormatVersion + ")");
    uint32_t want = stored_crc(kiln_meta, kHeaderCrcKey, corrupt);
    Json canon_h = h;
    canon_h[std::string(kMetadataKey)].erase(kHeaderCrcKey);
    std::string canon = canon_h.dump();
    uint32_t got = crc32c(canon.data(), canon.size());
    if (got != want) corrupt("header checksum mismatch: stored " + hex32(want) + ", computed " + hex32(got));
  }

  std::vector<Entry> entries;
  for (const auto& [name, v] : h.items()) {
    if (name == kMetadataKey) continue;
    entries.push_back(parse_entry(name, v, data_size, corrupt));
    entries.back().index = entries.size() - 1;
  }
  // Tensors must tile the data section exactly: no overlap (two tensors sharing
  // bytes), no gaps, nothing after the last one.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end, a->index) < std::tie(b->begin, b->end, b->index);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < pos)
      corrupt("tensor " + sq(e->name) + " data [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
              ") overlaps tensor " + sq(prev->name) + " [" + std::to_string(prev->begin) + ", " +
              std::to_string(prev->end) + ")");
    if (e->begin > pos)
      corrupt("gap of " + std::to_string(e->begin - pos) + " bytes before tensor " + sq(e->name) +
              " at data offset " + std::to_string(pos));
    pos = e->end;
    prev = e;
  }
  if (pos != data_size)
    corrupt(std::to_string(data_size - pos) + " bytes after the last tensor (data offset " + std::to_string(pos) +
            ") belong to no tensor");

  if (kiln_file) {
    std::unordered_set<std::string> names;
    for (const auto& e : entries) names.insert(e.name);
    for (const auto& [k, _] : kiln_meta)
      if (starts_with(k, kTensorCrcPrefix) && !names.count(k.substr(kTensorCrcPrefix.size())))
        corrupt("checksum " + sq(k) + " names no tensor in the file");
    uint32_t data_crc = 0;
    std::vector<uint32_t> crc(entries.size());
    for (const Entry* e : by_offset) {
      crc[e->index] = crc32c(data + e->begin, e->end - e->begin);
      data_crc = crc32c_combine(data_crc, crc[e->index], e->end - e->begin);
    }
    for (const auto& e : entries) {
      uint32_t want = stored_crc(kiln_meta, std::string(kTensorCrcPrefix) + e.name, corrupt);
      if (want != crc[e.index])
        corrupt("checksum mismatch in tensor " + sq(e.name) + ": stored " + hex32(want) + ", computed " +
                hex32(crc[e.index]));
    }
    uint32_t want = stored_crc(kiln_meta, kDataCrcKey, corrupt);
    if (want != data_crc)
      corrupt("data section checksum mismatch: stored " + hex32(want) + ", computed " + hex32(data_crc));
  }

  out.tensors.reserve(entries.size());
  for (const auto& e : entries) {
    const size_t nbytes = e.end - e.begin;
    const bool borrow = owner && (e.dtype != DType::kBool || std::all_of(data + e.begin, data + e.end, [](char c) {
                                    return c == 0 || c == 1;
                                  }));
    if (borrow) {
      auto storage = std::make_shared<Storage>(const_cast<char*>(data + e.begin), std::max<size_t>(nbytes, 1),
                                               Device::cpu(), owner);
      out.tensors.emplace_back(e.name, Tensor(std::move(storage), 0, e.shape, e.dtype));
      continue;
    }
    Tensor t = Tensor::from_bytes(data + e.begin, nbytes, e.shape, e.dtype);
    if (e.dtype == DType::kBool) {
      // Other writers may store any non-zero byte for true; kiln's bools are 0/1.
      auto* p = static_cast<uint8_t*>(t.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = p[i] != 0;
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace internal

// ---------------------------------------------------------------------------------------

const Tensor* TensorFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

void save_tensor_file(const std::string& path, const TensorFile& data) {
  write_file_atomic(path, internal::serialize_tensor_file(data));
}

TensorFile load_tensor_file(const std::string& path) { return internal::parse_tensor_file(read_file(path), path); }

TensorFile map_tensor_file(const std::string& path) { return map_tensor_file(MappedFile::open(path)); }

TensorFile map_tensor_file(const std::shared_ptr<MappedFile>& file) {
  return internal::parse_tensor_file(file->bytes(), file->path(), file);
}

}  // namespace kiln

