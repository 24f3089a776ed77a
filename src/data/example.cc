// tf.train.Example / SequenceExample: a hand-written protobuf wire-format decoder and
// encoder for TensorFlow's feature.proto and example.proto (docs/formats/example.md).
//
// Decoding is two passes over each feature: scan_feature() walks the Feature message
// to find the list kind that protobuf's oneof semantics leave in place and counts its
// values (validating the framing), then the values are decoded straight into their
// destination (an output tensor slot, or a Feature's vector). Every read is bounds
// checked against the end of the enclosing message; any inconsistency throws
// DataLossError with the byte offset in the record.
#include "kiln/data/example.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "kiln/core/error.h"

namespace kiln::data {
namespace {

using detail::str_cat;
using u8 = uint8_t;

// ---- wire format: reading ----

enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

struct Span {
  const u8* p;
  const u8* end;
  size_t size() const { return static_cast<size_t>(end - p); }
  std::string_view view() const { return {reinterpret_cast<const char*>(p), size()}; }
};

Span span_of(std::string_view s) {
  auto* p = reinterpret_cast<const u8*>(s.data());
  return {p, p + s.size()};
}

// Where a parse is, for error messages.
struct Ctx {
  const char* message;  // "Example" or "SequenceExample"
  const u8* base;       // first byte of the record: offsets count from here
  int64_t record = -1;  // index in a batch; -1 for a single record
};

[[noreturn, gnu::cold, gnu::noinline]] void malformed(const Ctx& c, const std::string& what, const u8* at) {
  std::string rec = c.record >= 0 ? str_cat(" (record ", c.record, ")") : std::string();
  throw DataLossError(str_cat("malformed ", c.message, rec, ": ", what, " at byte ", at - c.base));
}

[[gnu::noinline]] uint64_t read_varint_slow(const u8*& p, const u8* end, const Ctx& c) {
  const u8* start = p;
  uint64_t v = 0;
  for (int i = 0; i < 10; ++i) {
    if (p == end) malformed(c, "truncated varint", start);
    uint64_t b = *p++;
    v |= (b & 0x7f) << (7 * i);  // bits past 64 (10th byte) drop, as in libprotobuf
    if (b < 0x80) return v;
  }
  malformed(c, "varint longer than 10 bytes", start);
}

inline uint64_t read_varint(const u8*& p, const u8* end, const Ctx& c) {
  if (p < end && *p < 0x80) return *p++;
  return read_varint_slow(p, end, c);
}

struct Field {
  uint32_t number;
  uint32_t wire;
  uint64_t value;   // kVarint, kFixed64, kFixed32 (raw bits)
  Span bytes;       // kLen payload
  const u8* start;  // the tag
};

const char* wire_name(uint32_t wire) {
  switch (wire) {
    case 0: return "varint";
    case 1: return "fixed64";
    case 2: return "length-delimited";
    case 3: return "start-group";
    case 4: return "end-group";
    case 5: return "fixed32";
    default: return "invalid";
  }
}

// Reads the next field of the message ending at `end`; false at its end. The payload
// is fully bounds checked, so a caller may skip a field by ignoring it.
[[gnu::always_inline]] inline bool next_field(const u8*& p, const u8* end, Field* f, const Ctx& c) {
  if (p == end) return false;
  f->start = p;
  uint64_t tag = read_varint(p, end, c);
  if (tag > std::numeric_limits<uint32_t>::max() || (tag >> 3) == 0)
    malformed(c, str_cat("invalid tag ", tag, " (field number 0 or past 2^29)"), f->start);
  f->number = static_cast<uint32_t>(tag >> 3);
  f->wire = static_cast<uint32_t>(tag & 7);
  switch (f->wire) {
    case kVarint: f->value = read_varint(p, end, c); return true;
    case kLen: {
      const u8* at = p;
      uint64_t n = read_varint(p, end, c);
      if (n > static_cast<uint64_t>(end - p))
        malformed(c, str_cat("field ", f->number, ": length ", n, " past the end (", end - p, " bytes left)"), at);
      f->bytes = {p, p + n};
      p += n;
      return true;
    }
    case kFixed32:
    case kFixed64: {
      size_t n = f->wire == kFixed32 ? 4 : 8;
      if (static_cast<size_t>(end - p) < n) malformed(c, str_cat("truncated ", wire_name(f->wire)), p);
      uint64_t v = 0;
      for (size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
      f->value = v;
      p += n;
      return true;
    }
    default:  // groups (deprecated, absent from these messages) and wire types 6, 7
      malformed(c, str_cat("field ", f->number, ": unsupported wire type ", f->wire, " (", wire_name(f->wire), ")"),
                f->start);
  }
}

inline void expect_wire(const Field& f, uint32_t wire, const char* field, const Ctx& c) {
  if (f.wire != wire) [[unlikely]]
    malformed(
        c, str_cat(field, " (field ", f.number, ") has wire type ", wire_name(f.wire), ", expected ", wire_name(wire)),
        f.start);
}

// ---- Feature: scan, then decode ----

// The values a Feature (given as the segments protobuf merges, usually one) holds:
// the last list field decides the kind (oneof), and only the run of fields of that
// kind since the last switch counts.
struct FeatureScan {
  Feature::Kind kind = Feature::kNone;
  int64_t count = 0;
  size_t seg = 0;           // segment where the run starts
  const u8* run = nullptr;  // tag of the run's first field
};

const char* list_name(Feature::Kind k) {
  switch (k) {
    case Feature::kBytes: return "BytesList.value";
    case Feature::kFloat: return "FloatList.value";
    case Feature::kInt64: return "Int64List.value";
    default: return "?";
  }
}

// Number of values in one BytesList/FloatList/Int64List message; validates framing.
int64_t count_list(Feature::Kind kind, Span list, const Ctx& c) {
  int64_t n = 0;
  const u8* p = list.p;
  Field f;
  while (next_field(p, list.end, &f, c)) {
    if (f.number != 1) continue;  // unknown field
    switch (kind) {
      case Feature::kBytes:
        expect_wire(f, kLen, list_name(kind), c);
        ++n;
        break;
      case Feature::kFloat:
        if (f.wire == kLen) {
          if (f.bytes.size() % 4 != 0)
            malformed(c, str_cat("packed FloatList.value of ", f.bytes.size(), " bytes, not a multiple of 4"), f.start);
          n += static_cast<int64_t>(f.bytes.size() / 4);
        } else {
          expect_wire(f, kFixed32, list_name(kind), c);
          ++n;
        }
        break;
      case Feature::kInt64:
        if (f.wire == kLen) {
          if (f.bytes.size() > 0 && f.bytes.end[-1] >= 0x80)
            malformed(c, "truncated varint in packed Int64List.value", f.bytes.end - 1);
          int64_t k = 0;
          for (const u8* q = f.bytes.p; q < f.bytes.end; ++q) k += *q < 0x80;
          n += k;
        } else {
          expect_wire(f, kVarint, list_name(kind), c);
          ++n;
        }
        break;
      default: break;
    }
  }
  return n;
}

FeatureScan scan_feature(std::span<const Span> segs, const Ctx& c) {
  FeatureScan s;
  for (size_t i = 0; i < segs.size(); ++i) {
    const u8* p = segs[i].p;
    Field f;
    while (next_field(p, segs[i].end, &f, c)) {
      if (f.number < 1 || f.number > 3) continue;  // unknown field
      static constexpr const char* kNames[] = {"", "Feature.bytes_list", "Feature.float_list", "Feature.int64_list"};
      expect_wire(f, kLen, kNames[f.number], c);
      auto k = static_cast<Feature::Kind>(f.number);  // 1, 2, 3 = kBytes, kFloat, kInt64
      if (k != s.kind) {
        s = FeatureScan{k, 0, i, f.start};
      }
      s.count += count_list(k, f.bytes, c);
    }
  }
  return s;
}

// Calls fn(list) for every list of the run scan_feature() found.
template <typename Fn>
void for_each_run_list(std::span<const Span> segs, const FeatureScan& s, const Ctx& c, Fn&& fn) {
  for (size_t i = s.seg; i < segs.size(); ++i) {
    const u8* p = i == s.seg ? s.run : segs[i].p;
    Field f;
    while (next_field(p, segs[i].end, &f, c)) {
      if (f.number == static_cast<uint32_t>(s.kind)) fn(f.bytes);
    }
  }
}

// Decoders of one list into out[0, cap); return the number of values written. The
// list was validated by count_list(); `cap` is its count, checked again here.
size_t decode_floats(Span list, float* out, size_t cap, const Ctx& c) {
  size_t n = 0;
  const u8* p = list.p;
  Field f;
  while (next_field(p, list.end, &f, c)) {
    if (f.number != 1) continue;
    if (f.wire == kLen) {
      size_t k = f.bytes.size() / 4;
      KILN_CHECK_INTERNAL(k <= cap - n, "float count changed between passes");
      if constexpr (std::endian::native == std::endian::little) {
        if (k) std::memcpy(out + n, f.bytes.p, 4 * k);
      } else {
        for (size_t j = 0; j < k; ++j) {
          const u8* q = f.bytes.p + 4 * j;
          uint32_t bits = uint32_t{q[0]} | uint32_t{q[1]} << 8 | uint32_t{q[2]} << 16 | uint32_t{q[3]} << 24;
          out[n + j] = std::bit_cast<float>(bits);
        }
      }
      n += k;
    } else {
      KILN_CHECK_INTERNAL(n < cap, "float count changed between passes");
      out[n++] = std::bit_cast<float>(static_cast<uint32_t>(f.value));
    }
  }
  return n;
}

size_t decode_ints(Span list, int64_t* out, size_t cap, const Ctx& c) {
  size_t n = 0;
  const u8* p = list.p;
  Field f;
  while (next_field(p, list.end, &f, c)) {
    if (f.number != 1) continue;
    if (f.wire == kLen) {
      const u8* q = f.bytes.p;
      while (q < f.bytes.end) {
        KILN_CHECK_INTERNAL(n < cap, "int64 count changed between passes");
        out[n++] = static_cast<int64_t>(read_varint(q, f.bytes.end, c));
      }
    } else {
      KILN_CHECK_INTERNAL(n < cap, "int64 count changed between passes");
      out[n++] = static_cast<int64_t>(f.value);
    }
  }
  return n;
}

size_t decode_bytes(Span list, std::string* out, size_t cap, const Ctx& c) {
  size_t n = 0;
  const u8* p = list.p;
  Field f;
  while (next_field(p, list.end, &f, c)) {
    if (f.number != 1) continue;
    KILN_CHECK_INTERNAL(n < cap, "bytes count changed between passes");
    out[n++].assign(reinterpret_cast<const char*>(f.bytes.p), f.bytes.size());
  }
  return n;
}

// Decodes the run of `s` into out[0, s.count).
template <typename T>
void decode_run(std::span<const Span> segs, const FeatureScan& s, T* out, const Ctx& c) {
  size_t cap = static_cast<size_t>(s.count), n = 0;
  for_each_run_list(segs, s, c, [&](Span list) {
    if constexpr (std::is_same_v<T, float>) n += decode_floats(list, out + n, cap - n, c);
    if constexpr (std::is_same_v<T, int64_t>) n += decode_ints(list, out + n, cap - n, c);
    if constexpr (std::is_same_v<T, std::string>) n += decode_bytes(list, out + n, cap - n, c);
  });
  KILN_CHECK_INTERNAL(n == cap, "decoded ", n, " values, counted ", cap);
}

// A whole Feature (protobuf merge of the segments into an empty Feature).
Feature decode_feature(std::span<const Span> segs, const Ctx& c) {
  FeatureScan s = scan_feature(segs, c);
  Feature out;
  out.kind = s.kind;
  switch (s.kind) {
    case Feature::kBytes:
      out.bytes.resize(s.count);
      decode_run(segs, s, out.bytes.data(), c);
      break;
    case Feature::kFloat:
      out.floats.resize(s.count);
      decode_run(segs, s, out.floats.data(), c);
      break;
    case Feature::kInt64:
      out.ints.resize(s.count);
      decode_run(segs, s, out.ints.data(), c);
      break;
    case Feature::kNone: break;
  }
  return out;
}

// Calls fn(key, value_segments) for every entry of a map<string, Message> field
// (number 1) in the message `m`: Features.feature or FeatureLists.feature_list. An
// entry's key is its last key field ("" if none); its value fields (usually one)
// merge. `segs` is scratch space.
template <typename Fn>
void for_each_map_entry(Span m, const char* map_name, std::vector<Span>* segs, const Ctx& c, Fn&& fn) {
  const u8* p = m.p;
  Field f;
  while (next_field(p, m.end, &f, c)) {
    if (f.number != 1) continue;
    expect_wire(f, kLen, map_name, c);
    std::string_view key;
    segs->clear();
    const u8* q = f.bytes.p;
    Field g;
    while (next_field(q, f.bytes.end, &g, c)) {
      if (g.number == 1) {
        expect_wire(g, kLen, "map key", c);
        key = g.bytes.view();
      } else if (g.number == 2) {
        expect_wire(g, kLen, "map value", c);
        segs->push_back(g.bytes);
      }
    }
    fn(key, std::span<const Span>(*segs));
  }
}

// Calls fn(feature) for every Feature of the FeatureList segments (its time steps).
template <typename Fn>
void for_each_step(std::span<const Span> segs, const Ctx& c, Fn&& fn) {
  for (const Span& s : segs) {
    const u8* p = s.p;
    Field f;
    while (next_field(p, s.end, &f, c)) {
      if (f.number != 1) continue;
      expect_wire(f, kLen, "FeatureList.feature", c);
      fn(f.bytes);
    }
  }
}

void decode_features_into(Span m, Features* out, std::vector<Span>* segs, const Ctx& c) {
  for_each_map_entry(m, "Features.feature", segs, c, [&](std::string_view key, std::span<const Span> v) {
    (*out)[std::string(key)] = decode_feature(v, c);
  });
}

// ---- wire format: writing ----

constexpr size_t varint_size(uint64_t v) { return (static_cast<size_t>(std::bit_width(v | 1)) + 6) / 7; }

inline char* put_varint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

// Size of a length-delimited field (1-byte tag) with an n-byte payload.
constexpr size_t len_field_size(size_t n) { return 1 + varint_size(n) + n; }

size_t packed_ints_size(const std::vector<int64_t>& v) {
  size_t n = 0;
  for (int64_t x : v) n += varint_size(static_cast<uint64_t>(x));
  return n;
}

// Size of the list message (the Feature's only field's payload).
size_t list_size(const Feature& f, size_t* packed) {
  switch (f.kind) {
    case Feature::kBytes: {
      size_t n = 0;
      for (const auto& s : f.bytes) n += len_field_size(s.size());
      return n;
    }
    case Feature::kFloat: *packed = 4 * f.floats.size(); return f.floats.empty() ? 0 : len_field_size(*packed);
    case Feature::kInt64: *packed = packed_ints_size(f.ints); return f.ints.empty() ? 0 : len_field_size(*packed);
    case Feature::kNone: return 0;
  }
  return 0;
}

// Sizes computed once and consumed in the same order by the writer.
struct Sizes {
  std::vector<size_t> v;
  size_t next = 0;
  size_t push(size_t n) {
    v.push_back(n);
    return n;
  }
  size_t pop() { return v[next++]; }
};

// Feature message size; pushes list size and packed payload size.
size_t feature_size(const Feature& f, Sizes* sz) {
  size_t packed = 0;
  size_t list = list_size(f, &packed);
  sz->push(list);
  sz->push(packed);
  return f.kind == Feature::kNone ? 0 : len_field_size(list);
}

char* write_feature(char* p, const Feature& f, Sizes* sz) {
  size_t list = sz->pop(), packed = sz->pop();
  if (f.kind == Feature::kNone) return p;
  *p++ = static_cast<char>((static_cast<uint32_t>(f.kind) << 3) | kLen);  // 0x0a, 0x12, 0x1a
  p = put_varint(p, list);
  switch (f.kind) {
    case Feature::kBytes:
      for (const auto& s : f.bytes) {
        *p++ = 0x0a;
        p = put_varint(p, s.size());
        if (!s.empty()) std::memcpy(p, s.data(), s.size());
        p += s.size();
      }
      break;
    case Feature::kFloat:
      if (f.floats.empty()) break;
      *p++ = 0x0a;
      p = put_varint(p, packed);
      if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(p, f.floats.data(), packed);
        p += packed;
      } else {
        for (float x : f.floats) {
          uint32_t b = std::bit_cast<uint32_t>(x);
          for (int i = 0; i < 4; ++i) *p++ = static_cast<char>(b >> (8 * i));
        }
      }
      break;
    case Feature::kInt64:
      if (f.ints.empty()) break;
      *p++ = 0x0a;
      p = put_varint(p, packed);
      for (int64_t x : f.ints) p = put_varint(p, static_cast<uint64_t>(x));
      break;
    case Feature::kNone: break;
  }
  return p;
}

// A map entry {key = 1, value = 2}: libprotobuf always writes both.
size_t entry_size(const std::string& key, size_t value) { return len_field_size(key.size()) + len_field_size(value); }

char* write_key(char* p, const std::string& key) {
  *p++ = 0x0a;
  p = put_varint(p, key.size());
  if (!key.empty()) std::memcpy(p, key.data(), key.size());
  return p + key.size();
}

// Features message body size; pushes entry and value sizes for each feature.
size_t features_size(const Features& fs, Sizes* sz) {
  size_t n = 0;
  for (const auto& [key, f] : fs) {
    size_t e = sz->v.size();
    sz->push(0);
    size_t value = feature_size(f, sz);
    sz->push(value);
    sz->v[e] = entry_size(key, value);
    n += len_field_size(sz->v[e]);
  }
  return n;
}

char* write_features(char* p, const Features& fs, Sizes* sz) {
  for (const auto& [key, f] : fs) {
    size_t entry = sz->pop();
    *p++ = 0x0a;
    p = put_varint(p, entry);
    p = write_key(p, key);
    size_t value = sz->v[sz->next + 2];  // after the list and packed sizes write_feature() pops
    *p++ = 0x12;
    p = put_varint(p, value);
    p = write_feature(p, f, sz);
    sz->next++;  // the value size
  }
  return p;
}

// FeatureLists body size.
size_t feature_lists_size(const FeatureLists& fl, Sizes* sz) {
  size_t n = 0;
  for (const auto& [key, steps] : fl) {
    size_t e = sz->v.size();
    sz->push(0);  // entry
    sz->push(0);  // FeatureList size
    size_t list = 0;
    for (const Feature& f : steps) list += len_field_size(feature_size(f, sz));
    sz->v[e + 1] = list;
    sz->v[e] = entry_size(key, list);
    n += len_field_size(sz->v[e]);
  }
  return n;
}

char* write_feature_lists(char* p, const FeatureLists& fl, Sizes* sz) {
  for (const auto& [key, steps] : fl) {
    size_t entry = sz->pop(), list = sz->pop();
    *p++ = 0x0a;
    p = put_varint(p, entry);
    p = write_key(p, key);
    *p++ = 0x12;
    p = put_varint(p, list);
    for (const Feature& f : steps) {
      // Recompute this step's size from the two sizes feature_size() pushed.
      size_t l = sz->v[sz->next];
      size_t value = f.kind == Feature::kNone ? 0 : len_field_size(l);
      *p++ = 0x0a;
      p = put_varint(p, value);
      p = write_feature(p, f, sz);
    }
  }
  return p;
}

// ---- parsing with a spec ----

// "[2, 3]" (also for dims Shape would reject, for error messages).
std::string shape_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// One spec'd feature, checked and laid out.
struct Slot {
  std::string name;
  Feature::Kind kind = Feature::kFloat;
  bool var_len = false;
  bool sequence = false;       // a feature list: rows are time steps
  std::vector<int64_t> shape;  // per row (FixedLen)
  int64_t numel = 0;
  std::optional<Feature> default_value;
  bool allow_missing = false;

  std::string what() const {
    std::string k(feature_kind_name(kind));
    if (var_len) return str_cat("VarLenFeature ", k);
    return str_cat(sequence ? "FixedLenSequenceFeature " : "FixedLenFeature ", k, " ", shape_str(shape));
  }
};

void check_kind(Feature::Kind k, const std::string& name) {
  KILN_CHECK_ARG(k == Feature::kBytes || k == Feature::kFloat || k == Feature::kInt64, "feature '", name,
                 "': the spec's kind must be kBytes, kFloat or kInt64");
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& name) {
  KILN_CHECK_ARG(static_cast<int>(shape.size()) < Shape::kMaxRank, "feature '", name, "': shape of rank ", shape.size(),
                 " (at most ", Shape::kMaxRank - 1, " leaves room for the batch dimension)");
  int64_t n = 1;
  for (int64_t d : shape) {
    KILN_CHECK_ARG(d >= 0, "feature '", name, "': shape ", shape_str(shape), " must be fully defined (dims >= 0)");
    KILN_CHECK_ARG(d == 0 || n <= (int64_t{1} << 40) / d, "feature '", name, "': shape ", shape_str(shape),
                   " is too large");
    n *= d;
  }
  return n;
}

Slot make_slot(const std::string& name, const FeatureSpec& spec) {
  Slot s;
  s.name = name;
  if (const auto* v = std::get_if<VarLenFeature>(&spec)) {
    check_kind(v->kind, name);
    s.kind = v->kind;
    s.var_len = true;
    return s;
  }
  const auto& fx = std::get<FixedLenFeature>(spec);
  check_kind(fx.kind, name);
  s.kind = fx.kind;
  s.shape = fx.shape;
  s.numel = checked_numel(fx.shape, name);
  if (fx.default_value) {
    const Feature& d = *fx.default_value;
    KILN_CHECK_ARG(d.kind == fx.kind, "feature '", name, "': default value is a ", feature_kind_name(d.kind),
                   ", the spec's kind is ", feature_kind_name(fx.kind));
    KILN_CHECK_ARG(static_cast<int64_t>(d.size()) == s.numel, "feature '", name, "': default value has ", d.size(),
                   " values, shape ", shape_str(fx.shape), " needs ", s.numel);
    s.default_value = d;
  }
  return s;
}

Slot make_sequence_slot(const std::string& name, const SequenceFeatureSpec& spec) {
  Slot s;
  s.name = name;
  s.sequence = true;
  if (const auto* v = std::get_if<VarLenFeature>(&spec)) {
    check_kind(v->kind, name);
    s.kind = v->kind;
    s.var_len = true;
    s.allow_missing = true;
    return s;
  }
  const auto& fx = std::get<FixedLenSequenceFeature>(spec);
  check_kind(fx.kind, name);
  s.kind = fx.kind;
  s.shape = fx.shape;
  s.numel = checked_numel(fx.shape, name);
  s.allow_missing = fx.allow_missing;
  return s;
}

// Slots with a name lookup.
struct SlotSet {
  std::vector<Slot> slots;
  std::unordered_map<std::string_view, int> index;  // views into slots[i].name; built by finish()

  void finish() {
    for (size_t i = 0; i < slots.size(); ++i) index.emplace(slots[i].name, static_cast<int>(i));
  }
  int find(std::string_view key) const {
    if (slots.size() <= 8) {
      for (size_t i = 0; i < slots.size(); ++i)
        if (std::string_view(slots[i].name) == key)  // (memcmp on an empty key's null data is undefined)
          return static_cast<int>(i);
      return -1;
    }
    auto it = index.find(key);
    return it == index.end() ? -1 : it->second;
  }
};

// Output names: "<name>" and, for VarLen with `lengths`, "<name>/lengths".
void add_names(const SlotSet& set, bool lengths, std::vector<std::string>* names) {
  for (const Slot& s : set.slots) {
    names->push_back(s.name);
    if (s.var_len && lengths) names->push_back(s.name + "/lengths");
  }
}

void check_unique(const std::vector<std::string>& names) {
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  KILN_CHECK_ARG(dup == sorted.end(), "output name '", *dup,
                 "' given twice (a VarLen feature's values come with '<name>/lengths')");
}

// VarLen values are padded to the longest row; a few long rows among many short ones
// could ask for far more memory than the records hold.
constexpr int64_t kMaxPaddedValues = int64_t{1} << 31;

DType dtype_of(Feature::Kind k) { return k == Feature::kFloat ? DType::kF32 : DType::kI64; }

// One output component under construction: `rows` rows (records or time steps) of
// one slot.
class Column {
 public:
  // batched: rows are a leading dimension; else rows == 1 and there is none.
  Column(const Slot& slot, int64_t rows, bool batched) : slot_(slot), rows_(rows), batched_(batched) {
    if (slot.var_len) {
      lengths_.assign(rows, 0);
      return;
    }
    std::vector<int64_t> dims;
    if (batched) dims.push_back(rows);
    dims.insert(dims.end(), slot.shape.begin(), slot.shape.end());
    Shape shape(dims);
    if (slot.kind == Feature::kBytes) {
      strings_ = StringTensor(shape, std::vector<std::string>(static_cast<size_t>(shape.numel())));
    } else {
      tensor_ = Tensor::empty(shape, dtype_of(slot.kind));
      raw_ = tensor_.raw_data();
    }
  }

  // The feature (value segments of its map entry) of row `row`; a later call for the
  // same row replaces it (a key given twice: the last entry wins).
  void take(std::span<const Span> segs, int64_t row, const Ctx& c, const char* row_name) {
    FeatureScan s = scan_feature(segs, c);
    if (seen_ == row) {  // replacing this row's earlier entry
      seen_ = -1;
      truncate(start_);
    }
    if (s.kind == Feature::kNone) return;  // an empty Feature counts as absent
    if (s.kind != slot_.kind) [[unlikely]]
      throw InvalidArgumentError(str_cat(where(row, c, row_name), ": expected ", feature_kind_name(slot_.kind), " (",
                                         slot_.what(), "), got ", feature_kind_name(s.kind)));
    if (!slot_.var_len) {
      if (s.count != slot_.numel) [[unlikely]]
        throw InvalidArgumentError(str_cat(where(row, c, row_name), ": expected ", slot_.numel, " values (",
                                           slot_.what(), "), got ", s.count));
      size_t off = static_cast<size_t>(row * slot_.numel);
      switch (slot_.kind) {
        case Feature::kBytes: decode_run(segs, s, strings_.values.data() + off, c); break;
        case Feature::kFloat: decode_run(segs, s, static_cast<float*>(raw_) + off, c); break;
        default: decode_run(segs, s, static_cast<int64_t*>(raw_) + off, c); break;
      }
    } else {
      start_ = size();
      switch (slot_.kind) {
        case Feature::kBytes:
          vs_.resize(start_ + s.count);
          decode_run(segs, s, vs_.data() + start_, c);
          break;
        case Feature::kFloat:
          vf_.resize(start_ + s.count);
          decode_run(segs, s, vf_.data() + start_, c);
          break;
        default:
          vi_.resize(start_ + s.count);
          decode_run(segs, s, vi_.data() + start_, c);
          break;
      }
      lengths_[row] = s.count;
    }
    seen_ = row;
  }

  // After the last take() of `row`: a FixedLen feature the row lacks takes its default
  // (records) or is an error; `absent_is_empty` (time steps) lets a shape with no
  // values pass.
  void end_row(int64_t row, const Ctx& c, const char* row_name, bool absent_is_empty) {
    if (seen_ == row) return;
    if (slot_.var_len) {
      lengths_[row] = 0;
      return;
    }
    if (absent_is_empty && slot_.numel == 0) return;
    if (!slot_.default_value) [[unlikely]] {
      if (absent_is_empty)
        throw InvalidArgumentError(str_cat(where(row, c, row_name), ": expected ", slot_.numel, " values (",
                                           slot_.what(), "), got an empty Feature"));
      throw InvalidArgumentError(
          str_cat(where(row, c, row_name), " is missing and has no default (", slot_.what(), ")"));
    }
    const Feature& d = *slot_.default_value;
    size_t off = static_cast<size_t>(row * slot_.numel);
    switch (slot_.kind) {
      case Feature::kBytes: std::copy(d.bytes.begin(), d.bytes.end(), strings_.values.begin() + off); break;
      case Feature::kFloat: std::copy(d.floats.begin(), d.floats.end(), static_cast<float*>(raw_) + off); break;
      default: std::copy(d.ints.begin(), d.ints.end(), static_cast<int64_t*>(raw_) + off); break;
    }
  }

  // Appends the component(s): the values, and for VarLen with `lengths` the lengths.
  void finish(bool lengths, std::vector<Value>* out) {
    if (!slot_.var_len) {
      if (slot_.kind == Feature::kBytes)
        out->emplace_back(std::move(strings_));
      else
        out->emplace_back(std::move(tensor_));
      return;
    }
    if (!batched_) {  // one row: its values, 1-D
      int64_t n = lengths_[0];
      switch (slot_.kind) {
        case Feature::kBytes: out->emplace_back(StringTensor(Shape{n}, std::move(vs_))); break;
        case Feature::kFloat: out->emplace_back(Tensor::from_vector(vf_, Shape{n})); break;
        default: out->emplace_back(Tensor::from_vector(vi_, Shape{n})); break;
      }
    } else {
      int64_t width = rows_ ? *std::max_element(lengths_.begin(), lengths_.end()) : 0;
      if (width && rows_ > kMaxPaddedValues / width)
        throw ResourceExhaustedError(str_cat(slot_.sequence ? "feature list '" : "feature '", slot_.name, "': padding ",
                                             rows_, " rows to the longest (", width, " values) needs more than ",
                                             kMaxPaddedValues, " values"));
      Shape shape{rows_, width};
      switch (slot_.kind) {
        case Feature::kBytes: {
          std::vector<std::string> padded(static_cast<size_t>(rows_ * width));
          size_t src = 0;
          for (int64_t r = 0; r < rows_; ++r)
            for (int64_t j = 0; j < lengths_[r]; ++j) padded[r * width + j] = std::move(vs_[src++]);
          out->emplace_back(StringTensor(shape, std::move(padded)));
          break;
        }
        case Feature::kFloat: out->emplace_back(pad(vf_, shape)); break;
        default: out->emplace_back(pad(vi_, shape)); break;
      }
    }
    if (lengths) out->emplace_back(Tensor::from_vector(lengths_, Shape{rows_}));
  }

 private:
  template <typename T>
  Tensor pad(const std::vector<T>& flat, const Shape& shape) const {
    Tensor t = Tensor::zeros(shape, dtype_of(slot_.kind));
    T* dst = static_cast<T*>(t.raw_data());
    size_t src = 0;
    int64_t width = shape[1];
    for (int64_t r = 0; r < rows_; ++r) {
      if (lengths_[r]) std::memcpy(dst + r * width, flat.data() + src, sizeof(T) * lengths_[r]);
      src += lengths_[r];
    }
    return t;
  }

  size_t size() const {
    return slot_.kind == Feature::kBytes ? vs_.size() : slot_.kind == Feature::kFloat ? vf_.size() : vi_.size();
  }
  void truncate(size_t n) {
    if (!slot_.var_len) return;
    vs_.resize(std::min(vs_.size(), n));
    vf_.resize(std::min(vf_.size(), n));
    vi_.resize(std::min(vi_.size(), n));
  }
  std::string where(int64_t row, const Ctx& c, const char* row_name) const {
    std::string s = str_cat(slot_.sequence ? "feature list '" : "feature '", slot_.name, "'");
    if (c.record >= 0) s += str_cat(" (record ", c.record, ")");
    if (row_name) s += str_cat(" (", row_name, " ", row, ")");
    return s;
  }

  const Slot& slot_;
  int64_t rows_;
  bool batched_;
  Tensor tensor_;
  StringTensor strings_;
  void* raw_ = nullptr;
  std::vector<float> vf_;
  std::vector<int64_t> vi_;
  std::vector<std::string> vs_;
  std::vector<int64_t> lengths_;
  int64_t seen_ = -1;  // the row of the last take(), -1 after an empty one
  size_t start_ = 0;   // VarLen: values before row seen_'s
};

// The context (Example.features / SequenceExample.context) features of one record,
// or of each of a batch of records, into columns.
struct FeaturesParse {
  const SlotSet& set;
  std::vector<Column> cols;
  std::vector<Span> segs;

  FeaturesParse(const SlotSet& s, int64_t rows, bool batched) : set(s) {
    cols.reserve(s.slots.size());
    for (const Slot& slot : s.slots) cols.emplace_back(slot, rows, batched);
    segs.reserve(4);
  }
  void features(Span m, int64_t row, const Ctx& c) {
    for_each_map_entry(m, "Features.feature", &segs, c, [&](std::string_view key, std::span<const Span> v) {
      int i = set.find(key);
      if (i >= 0) cols[i].take(v, row, c, nullptr);
    });
  }
  void end_row(int64_t row, const Ctx& c) {
    for (Column& col : cols) col.end_row(row, c, nullptr, false);
  }
  void finish(bool lengths, std::vector<Value>* out) {
    for (Column& col : cols) col.finish(lengths, out);
  }
};

}  // namespace

// ---- encode / decode ----

void encode_example(const Features& features, std::string* out) {
  Sizes sz;
  sz.v.reserve(4 * features.size());
  size_t body = features_size(features, &sz);
  size_t total = len_field_size(body);
  size_t old = out->size();
  out->resize(old + total);
  char* p = out->data() + old;
  *p++ = 0x0a;  // Example.features
  p = put_varint(p, body);
  p = write_features(p, features, &sz);
  KILN_CHECK_INTERNAL(p == out->data() + out->size(), "Example size mismatch");
}

std::string encode_example(const Features& features) {
  std::string out;
  encode_example(features, &out);
  return out;
}

std::string encode_sequence_example(const SequenceExample& example) {
  Sizes sz;
  size_t context = features_size(example.context, &sz);
  size_t lists = feature_lists_size(example.feature_lists, &sz);
  std::string out(len_field_size(context) + len_field_size(lists), '\0');
  char* p = out.data();
  *p++ = 0x0a;  // SequenceExample.context
  p = put_varint(p, context);
  p = write_features(p, example.context, &sz);
  *p++ = 0x12;  // SequenceExample.feature_lists
  p = put_varint(p, lists);
  p = write_feature_lists(p, example.feature_lists, &sz);
  KILN_CHECK_INTERNAL(p == out.data() + out.size(), "SequenceExample size mismatch");
  return out;
}

Features decode_example(std::string_view serialized) {
  Span rec = span_of(serialized);
  Ctx c{"Example", rec.p};
  Features out;
  std::vector<Span> segs;
  const u8* p = rec.p;
  Field f;
  while (next_field(p, rec.end, &f, c)) {
    if (f.number != 1) continue;
    expect_wire(f, kLen, "Example.features", c);
    decode_features_into(f.bytes, &out, &segs, c);
  }
  return out;
}

SequenceExample decode_sequence_example(std::string_view serialized) {
  Span rec = span_of(serialized);
  Ctx c{"SequenceExample", rec.p};
  SequenceExample out;
  std::vector<Span> segs;
  const u8* p = rec.p;
  Field f;
  while (next_field(p, rec.end, &f, c)) {
    if (f.number == 1) {
      expect_wire(f, kLen, "SequenceExample.context", c);
      decode_features_into(f.bytes, &out.context, &segs, c);
    } else if (f.number == 2) {
      expect_wire(f, kLen, "SequenceExample.feature_lists", c);
      for_each_map_entry(f.bytes, "FeatureLists.feature_list", &segs, c,
                         [&](std::string_view key, std::span<const Span> v) {
                           std::vector<Feature> steps;
                           for_each_step(v, c, [&](Span step) { steps.push_back(decode_feature({&step, 1}, c)); });
                           out.feature_lists[std::string(key)] = std::move(steps);
                         });
    }
  }
  return out;
}

// ---- ExampleParser ----

struct ExampleParser::Impl {
  SlotSet set;
  std::vector<std::string> single_names, batch_names;
};

ExampleParser::ExampleParser(const ExampleSpec& spec) {
  auto impl = std::make_shared<Impl>();
  for (const auto& [name, s] : spec) impl->set.slots.push_back(make_slot(name, s));
  impl->set.finish();
  add_names(impl->set, false, &impl->single_names);
  add_names(impl->set, true, &impl->batch_names);
  check_unique(impl->batch_names);
  impl_ = std::move(impl);
}
ExampleParser::~ExampleParser() = default;
ExampleParser::ExampleParser(const ExampleParser&) = default;
ExampleParser& ExampleParser::operator=(const ExampleParser&) = default;

Element ExampleParser::parse(std::string_view serialized) const {
  Span rec = span_of(serialized);
  Ctx c{"Example", rec.p};
  FeaturesParse fp(impl_->set, 1, false);
  const u8* p = rec.p;
  Field f;
  while (next_field(p, rec.end, &f, c)) {
    if (f.number != 1) continue;
    expect_wire(f, kLen, "Example.features", c);
    fp.features(f.bytes, 0, c);
  }
  fp.end_row(0, c);
  std::vector<Value> values;
  values.reserve(impl_->single_names.size());
  fp.finish(false, &values);
  return Element(impl_->single_names, std::move(values));
}

Element ExampleParser::parse_batch(std::span<const std::string_view> serialized) const {
  int64_t n = static_cast<int64_t>(serialized.size());
  FeaturesParse fp(impl_->set, n, true);
  for (int64_t r = 0; r < n; ++r) {
    Span rec = span_of(serialized[r]);
    Ctx c{"Example", rec.p, r};
    const u8* p = rec.p;
    Field f;
    while (next_field(p, rec.end, &f, c)) {
      if (f.number != 1) continue;
      expect_wire(f, kLen, "Example.features", c);
      fp.features(f.bytes, r, c);
    }
    fp.end_row(r, c);
  }
  std::vector<Value> values;
  values.reserve(impl_->batch_names.size());
  fp.finish(true, &values);
  return Element(impl_->batch_names, std::move(values));
}

Element ExampleParser::parse_batch(const StringTensor& serialized) const {
  std::vector<std::string_view> views(serialized.values.begin(), serialized.values.end());
  return parse_batch(std::span<const std::string_view>(views));
}

Element parse_example(std::string_view serialized, const ExampleSpec& spec) {
  return ExampleParser(spec).parse(serialized);
}
Element parse_examples(std::span<const std::string_view> serialized, const ExampleSpec& spec) {
  return ExampleParser(spec).parse_batch(serialized);
}
Element parse_examples(const StringTensor& serialized, const ExampleSpec& spec) {
  return ExampleParser(spec).parse_batch(serialized);
}

Element parse_sequence_example(std::string_view serialized, const ExampleSpec& context, const SequenceSpec& sequence) {
  SlotSet ctx_set, seq_set;
  for (const auto& [name, s] : context) ctx_set.slots.push_back(make_slot(name, s));
  for (const auto& [name, s] : sequence) seq_set.slots.push_back(make_sequence_slot(name, s));
  ctx_set.finish();
  seq_set.finish();
  std::vector<std::string> names;
  add_names(ctx_set, false, &names);
  add_names(seq_set, true, &names);
  check_unique(names);

  Span rec = span_of(serialized);
  Ctx c{"SequenceExample", rec.p};
  FeaturesParse fp(ctx_set, 1, false);
  // Per sequence slot, the value segments of its last feature_list entry.
  std::vector<std::vector<Span>> lists(seq_set.slots.size());
  std::vector<bool> present(seq_set.slots.size(), false);
  std::vector<Span> segs;
  const u8* p = rec.p;
  Field f;
  while (next_field(p, rec.end, &f, c)) {
    if (f.number == 1) {
      expect_wire(f, kLen, "SequenceExample.context", c);
      fp.features(f.bytes, 0, c);
    } else if (f.number == 2) {
      expect_wire(f, kLen, "SequenceExample.feature_lists", c);
      for_each_map_entry(f.bytes, "FeatureLists.feature_list", &segs, c,
                         [&](std::string_view key, std::span<const Span> v) {
                           int i = seq_set.find(key);
                           if (i < 0) return;
                           lists[i].assign(v.begin(), v.end());
                           present[i] = true;
                         });
    }
  }
  fp.end_row(0, c);
  std::vector<Value> values;
  values.reserve(names.size());
  fp.finish(false, &values);

  for (size_t i = 0; i < seq_set.slots.size(); ++i) {
    const Slot& slot = seq_set.slots[i];
    if (!present[i] && !slot.allow_missing)
      throw InvalidArgumentError(
          str_cat("feature list '", slot.name, "' is missing (", slot.what(), "; allow_missing is false)"));
    int64_t steps = 0;
    for_each_step(lists[i], c, [&](Span) { ++steps; });
    Column col(slot, steps, true);
    int64_t t = 0;
    for_each_step(lists[i], c, [&](Span step) {
      col.take({&step, 1}, t, c, "step");
      col.end_row(t, c, "step", true);
      ++t;
    });
    col.finish(true, &values);
  }
  return Element(std::move(names), std::move(values));
}

}  // namespace kiln::data
