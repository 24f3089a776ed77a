// TensorFlow Serving's REST JSON <-> kiln tensors and tf.Examples (json_codec.h).
//
// Request bodies are parsed with simdjson's DOM parser (one per thread, reused; the
// parser copies the body into its own padded buffer, so nothing reads past the body).
// Values then go straight into the input tensors' buffers: the shape comes from the
// first element at every nesting level (and the signature's spec where it fixes a
// size), every later list must have that size. The walk over a value is at most the
// spec's rank deep (<= Shape::kMaxRank), so deep nesting cannot recurse far; simdjson
// itself parses iteratively and bounds the depth.
//
// Like TensorFlow Serving (rapidjson with kParseNanAndInfFlag), bodies may carry the
// non-standard literals NaN, Infinity, -Infinity (and Inf, -Inf) where numbers go; as
// simdjson rejects them, a body that fails to parse and holds them is parsed again with
// those tokens (outside strings) rewritten to marker strings ("\u0000NaN" ...), which a
// number position reads as the non-finite value. Responses write them as TF does.
#include "json_codec.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "kiln/core/error.h"
#include "kiln/core/json_string.h"
#include "package/tf_types.h"

namespace kiln::serving::json {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;
using ET = simdjson::dom::element_type;

[[noreturn]] void fail(const std::string& msg) { throw InvalidArgumentError(msg); }

// ------------------------------------------------------------------------------------
// Small text helpers.

// A JSON number as the body may have written it (1.0 stays 1.0: not an integer).
std::string num_str(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

std::string spec_str(const package::TensorInfo& info) {
  return std::string(dtype_name(info.spec.dtype)) + dims_str(info.spec.shape);
}

std::string names_str(const std::vector<package::TensorInfo>& infos) {
  std::string s;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (i) s += ", ";
    s += infos[i].name;
  }
  return s;
}

std::string list_desc(int64_t want) {
  if (want < 0) return "a list";
  return "a list of " + std::to_string(want) + (want == 1 ? " value" : " values");
}

// Floats as TF Serving writes them: shortest round-trip digits, ".0" on whole numbers
// (so that they read back as floats), NaN / Infinity / -Infinity.
template <typename F>
void append_float(std::string& out, F v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[48];
  auto r = std::to_chars(buf, buf + sizeof buf - 2, v);
  char* end = r.ptr;
  bool plain = true;
  for (char* p = buf; p != end; ++p) {
    if (*p == '.' || *p == 'e') {
      plain = false;
      break;
    }
  }
  if (plain) {
    *end++ = '.';
    *end++ = '0';
  }
  out.append(buf, end);
}

template <typename I>
void append_int(std::string& out, I v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// ------------------------------------------------------------------------------------
// Base64 (standard alphabet, '=' padding optional, ASCII whitespace skipped).

int8_t b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return static_cast<int8_t>(c - 'A');
  if (c >= 'a' && c <= 'z') return static_cast<int8_t>(c - 'a' + 26);
  if (c >= '0' && c <= '9') return static_cast<int8_t>(c - '0' + 52);
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Decodes into `out`; returns an error text ("" when fine).
std::string b64_decode(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int nbits = 0;
  size_t chars = 0, pad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == '\v') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    const int8_t v = b64_value(c);
    if (v < 0) {
      return "character " + (c >= 0x20 && c < 0x7f ? "'" + std::string(1, static_cast<char>(c)) + "'"
                                                   : "0x" + std::to_string(c)) +
             " at offset " + std::to_string(i) + " is not base64";
    }
    if (pad) return "base64 data continues after '=' padding at offset " + std::to_string(i);
    ++chars;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    nbits += 6;
    if (nbits >= 8) {
      nbits -= 8;
      out += static_cast<char>((acc >> nbits) & 0xff);
    }
  }
  const size_t rem = chars % 4;
  if (rem == 1) return "base64 data of " + std::to_string(chars) + " characters is truncated";
  if (pad && (pad > 2 || (rem + pad) % 4 != 0)) return "bad base64 padding";
  return {};
}

// ------------------------------------------------------------------------------------
// Parsing.

constexpr size_t kKeepParserCapacity = size_t{8} << 20;  // drop bigger parsers after use

struct ThreadParser {
  simdjson::dom::parser parser;
  bool busy = false;
};

// The calling thread's parser (or a private one when that is in use further up the
// stack); the parsed document lives as long as the lease.
class ParserLease {
 public:
  ParserLease() {
    thread_local ThreadParser tp;
    if (!tp.busy) {
      tp.busy = true;
      tp_ = &tp;
      parser_ = &tp.parser;
    } else {
      own_ = std::make_unique<simdjson::dom::parser>();
      parser_ = own_.get();
    }
  }
  ~ParserLease() {
    if (tp_) {
      if (tp_->parser.capacity() > kKeepParserCapacity) tp_->parser = simdjson::dom::parser();
      tp_->busy = false;
    }
  }
  ParserLease(const ParserLease&) = delete;
  ParserLease& operator=(const ParserLease&) = delete;
  simdjson::dom::parser& parser() { return *parser_; }

 private:
  ThreadParser* tp_ = nullptr;
  simdjson::dom::parser* parser_ = nullptr;
  std::unique_ptr<simdjson::dom::parser> own_;
};

// Typed views of an element whose type was checked (by value: no reference into a
// temporary simdjson_result survives the expression).
array as_array(const element& e) {
  array a;
  if (e.get_array().get(a) != simdjson::SUCCESS) return {};
  return a;
}
object as_object(const element& e) {
  object o;
  if (e.get_object().get(o) != simdjson::SUCCESS) return {};
  return o;
}
std::string_view as_string(const element& e) {
  std::string_view s;
  if (e.get_string().get(s) != simdjson::SUCCESS) return {};
  return s;
}
int64_t as_int64(const element& e) {
  int64_t v = 0;
  if (e.get_int64().get(v) != simdjson::SUCCESS) return {};
  return v;
}
uint64_t as_uint64(const element& e) {
  uint64_t v = 0;
  if (e.get_uint64().get(v) != simdjson::SUCCESS) return {};
  return v;
}
double as_double(const element& e) {
  double v = 0;
  if (e.get_double().get(v) != simdjson::SUCCESS) return {};
  return v;
}
bool as_bool(const element& e) {
  bool v = false;
  if (e.get_bool().get(v) != simdjson::SUCCESS) return {};
  return v;
}

enum class Marker { kNone, kNaN, kPosInf, kNegInf };
constexpr std::string_view kNaNMarker("\0NaN", 4);
constexpr std::string_view kPosInfMarker("\0Infinity", 9);
constexpr std::string_view kNegInfMarker("\0-Infinity", 10);

// Rewrites NaN / Infinity / Inf / -Infinity / -Inf outside strings to marker strings.
// Returns false when there was nothing to rewrite (or the body could confuse markers).
bool rewrite_nonfinite(std::string_view body, std::string& out) {
  if (body.find("\\u0000") != std::string_view::npos) return false;
  out.clear();
  out.reserve(body.size() + 64);
  bool in_string = false, changed = false;
  for (size_t i = 0; i < body.size();) {
    const char c = body[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < body.size()) {
        out += body[i + 1];
        i += 2;
        continue;
      }
      if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      ++i;
      continue;
    }
    const std::string_view rest = body.substr(i);
    const auto take = [&](std::string_view token, std::string_view marker_escaped) {
      if (rest.substr(0, token.size()) != token) return false;
      out += marker_escaped;
      i += token.size();
      changed = true;
      return true;
    };
    if (c == 'N' && take("NaN", "\"\\u0000NaN\"")) continue;
    if (c == 'I' && (take("Infinity", "\"\\u0000Infinity\"") || take("Inf", "\"\\u0000Infinity\""))) continue;
    if (c == '-' && (take("-Infinity", "\"\\u0000-Infinity\"") || take("-Inf", "\"\\u0000-Infinity\""))) continue;
    out += c;
    ++i;
  }
  return changed;
}

// Parses a request body; `markers` says whether non-finite markers may appear.
element parse_body(ParserLease& lease, std::string_view body, bool* markers) {
  *markers = false;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    fail("JSON parse error: the request body is empty (expected a JSON object)");
  }
  element root;
  auto err = lease.parser().parse(body.data(), body.size(), true).get(root);
  if (err == simdjson::MEMALLOC) throw ResourceExhaustedError("out of memory parsing a JSON body of " +
                                                              std::to_string(body.size()) + " bytes");
  if (err && err != simdjson::CAPACITY &&
      (body.find("NaN") != std::string_view::npos || body.find("Inf") != std::string_view::npos)) {
    std::string rewritten;
    if (rewrite_nonfinite(body, rewritten)) {
      element root2;
      if (!lease.parser().parse(rewritten.data(), rewritten.size(), true).get(root2)) {
        *markers = true;
        root = root2;
        err = simdjson::SUCCESS;
      }
    }
  }
  if (err == simdjson::CAPACITY) {
    fail("JSON parse error: the request body of " + std::to_string(body.size()) + " bytes is too large");
  }
  if (err) fail(std::string("JSON parse error: ") + simdjson::error_message(err));
  if (root.type() != ET::OBJECT) {
    fail("JSON parse error: the request body must be a JSON object, got " +
         std::string(root.type() == ET::ARRAY ? "a list" : "a scalar"));
  }
  return root;
}

Marker marker_of(const element& e, bool markers) {
  if (!markers || e.type() != ET::STRING) return Marker::kNone;
  const std::string_view s = as_string(e);
  if (s.empty() || s[0] != '\0') return Marker::kNone;
  if (s == kNaNMarker) return Marker::kNaN;
  if (s == kPosInfMarker) return Marker::kPosInf;
  if (s == kNegInfMarker) return Marker::kNegInf;
  return Marker::kNone;
}

double marker_value(Marker m) {
  switch (m) {
    case Marker::kNaN: return std::numeric_limits<double>::quiet_NaN();
    case Marker::kPosInf: return std::numeric_limits<double>::infinity();
    case Marker::kNegInf: return -std::numeric_limits<double>::infinity();
    case Marker::kNone: break;
  }
  return 0;
}

bool is_b64(const element& e) {
  if (e.type() != ET::OBJECT) return false;
  const object o = as_object(e);
  if (o.size() != 1) return false;
  const auto kv = *o.begin();
  return kv.key == "b64" && kv.value.type() == ET::STRING;
}

std::string type_desc(const element& e, bool markers) {
  switch (e.type()) {
    case ET::ARRAY: return "a list";
    case ET::OBJECT: return is_b64(e) ? "a b64 value" : "an object";
    case ET::INT64: return std::to_string(as_int64(e));
    case ET::UINT64: return std::to_string(as_uint64(e));
    case ET::DOUBLE: return num_str(as_double(e));
    case ET::STRING: {
      const Marker m = marker_of(e, markers);
      return m == Marker::kNone ? "a string" : num_str(marker_value(m));
    }
    case ET::BOOL: return as_bool(e) ? "true" : "false";
    case ET::NULL_VALUE: return "null";
  }
  return "a value";
}

size_t array_size(const array& a) {
  size_t n = a.size();
  if (n < 0xFFFFFF) return n;
  n = 0;
  for (auto it = a.begin(); it != a.end(); ++it) ++n;  // the tape's count saturates
  return n;
}

std::string_view b64_text(const element& e) {
  const object o = as_object(e);
  return as_string((*o.begin()).value);
}

// Where in the body a value sits, for messages: instances[2]['x'][0][5].
struct Where {
  const char* top = "";
  int64_t item = -1;
  std::string_view key;
  bool has_key = false;
  int depth = 0;
  int64_t idx[Shape::kMaxRank + 2] = {};
  std::string str() const {
    std::string s = top;
    if (item >= 0) s += "[" + std::to_string(item) + "]";
    if (has_key) {
      s += "['";
      s.append(key.data(), key.size());
      s += "']";
    }
    for (int i = 0; i < depth; ++i) s += "[" + std::to_string(idx[i]) + "]";
    return s;
  }
  Where at(int64_t i) const {
    Where w = *this;
    w.idx[w.depth++] = i;
    return w;
  }
};

// A value's place: a Where and, inside the innermost list, the element's index (-1:
// none), so that the hot loop builds no path unless it fails.
struct Loc {
  const Where* w;
  int64_t idx = -1;
  std::string str() const { return idx < 0 ? w->str() : w->at(idx).str(); }
};

// ------------------------------------------------------------------------------------
// Predict: values -> tensors.

// One signature input being decoded.
struct Slot {
  const package::TensorInfo* info = nullptr;
  int base = 0;  // spec dims the value does not hold: 1 (the batch) in row format
  int rank = 0;  // the value's rank
  int64_t dims[Shape::kMaxRank] = {};
  int64_t inner[Shape::kMaxRank + 1] = {};  // elements under one entry at each level
  element first;                            // the value the shape comes from
  bool has_first = false;
  Tensor tensor;
};

int64_t spec_dim(const Slot& s, int level) { return s.info->spec.shape[s.base + level]; }

int64_t sat_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > std::numeric_limits<int64_t>::max() / b) return std::numeric_limits<int64_t>::max();
  return a * b;
}

[[noreturn]] void fail_b64_dtype(const Slot& s, const Where& w) {
  fail(w.str() + ": input '" + s.info->name + "' is " + std::string(dtype_name(s.info->spec.dtype)) +
       "; b64 values need a u8 or i8 input (kiln has no string tensors)");
}

std::string decode_b64_value(const element& e, const Where& w) {
  std::string bytes;
  const std::string err = b64_decode(b64_text(e), bytes);
  if (!err.empty()) fail(w.str() + ": bad b64 value: " + err);
  return bytes;
}

// The bytes of a b64 value at `level` fill the remaining dims: resolve unknown ones.
void resolve_byte_dims(Slot& s, int level, int64_t nbytes, const Where& w) {
  int64_t known = 1;
  int unknown = -1, n_unknown = 0;
  for (int l = level; l < s.rank; ++l) {
    const int64_t d = spec_dim(s, l);
    if (d < 0) {
      unknown = l;
      ++n_unknown;
    } else {
      known = sat_mul(known, d);
    }
    s.dims[l] = d;
  }
  const std::string note = " (input '" + s.info->name + "' is " + spec_str(*s.info) + ")";
  if (n_unknown == 0) {
    if (nbytes != known) {
      fail(w.str() + ": expected " + std::to_string(known) + " bytes in the b64 value, got " +
           std::to_string(nbytes) + note);
    }
  } else if (n_unknown == 1) {
    if (known == 0 ? nbytes != 0 : nbytes % known != 0) {
      fail(w.str() + ": " + std::to_string(nbytes) + " b64 bytes do not split into rows of " +
           std::to_string(known) + note);
    }
    s.dims[unknown] = known == 0 ? 0 : nbytes / known;
  } else {
    fail(w.str() + ": cannot shape " + std::to_string(nbytes) +
         " b64 bytes: the input has several unknown sizes there" + note);
  }
}

// The value's shape from its first element at every level and the spec.
void discover(Slot& s, const Where& where0, bool markers) {
  element v = s.first;
  Where w = where0;
  for (int l = 0; l < s.rank; ++l) {
    const int64_t want = spec_dim(s, l);
    if (v.type() == ET::ARRAY) {
      const array a = as_array(v);
      const int64_t n = static_cast<int64_t>(array_size(a));
      if (want >= 0 && n != want) {
        fail(w.str() + ": expected " + list_desc(want) + ", got " + std::to_string(n) + " (input '" +
             s.info->name + "' is " + spec_str(*s.info) + ")");
      }
      s.dims[l] = n;
      if (n == 0) {
        for (int k = l + 1; k < s.rank; ++k) s.dims[k] = std::max<int64_t>(spec_dim(s, k), 0);
        break;
      }
      v = *a.begin();
      w = w.at(0);
    } else if (is_b64(v)) {
      if (s.info->spec.dtype != DType::kU8 && s.info->spec.dtype != DType::kI8) fail_b64_dtype(s, w);
      resolve_byte_dims(s, l, static_cast<int64_t>(decode_b64_value(v, w).size()), w);
      break;
    } else {
      fail(w.str() + ": expected " + list_desc(want) + ", got " + type_desc(v, markers) + " (input '" +
           s.info->name + "' is " + spec_str(*s.info) + ")");
    }
  }
  s.inner[s.rank] = 1;
  for (int l = s.rank - 1; l >= 0; --l) s.inner[l] = sat_mul(s.inner[l + 1], s.dims[l]);
}

struct FillCtx {
  bool markers = false;
  std::string scratch;  // b64 bytes
};

template <typename T>
constexpr const char* expected_scalar() {
  if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_integral_v<T>) {
    return "an integer";
  } else {
    return "a number";
  }
}

template <typename T>
[[noreturn]] void fail_range(const Slot& s, Loc w, const std::string& value) {
  fail(w.str() + ": " + value + " does not fit in " + std::string(dtype_name(s.info->spec.dtype)) + " (input '" +
       s.info->name + "')");
}

template <typename T>
void store_int(const Slot& s, int64_t i, T* out, Loc w) {
  if constexpr (std::is_integral_v<T>) {
    if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        i > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      fail_range<T>(s, w, std::to_string(i));
    }
    if (out) *out = static_cast<T>(i);
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    // Integers must convert exactly (as TF Serving's lossless check).
    const T f = static_cast<T>(i);
    if (static_cast<long double>(f) != static_cast<long double>(i)) {
      fail(w.str() + ": " + std::to_string(i) + " cannot be converted to " +
           std::string(dtype_name(s.info->spec.dtype)) + " without loss of precision (input '" + s.info->name + "')");
    }
    if (out) *out = f;
  } else {  // half, bfloat16
    const T h(static_cast<float>(i));
    if (std::isinf(static_cast<float>(h))) fail_range<T>(s, w, std::to_string(i));
    if (out) *out = h;
  }
}

template <typename T>
void store_double(const Slot& s, double d, T* out, Loc w) {
  if constexpr (std::is_same_v<T, double>) {
    if (out) *out = d;
  } else if constexpr (std::is_same_v<T, float>) {
    const float f = static_cast<float>(d);
    if (std::isinf(f) && std::isfinite(d)) fail_range<T>(s, w, num_str(d));
    if (out) *out = f;
  } else {
    const T h(static_cast<float>(d));
    if (std::isinf(static_cast<float>(h)) && std::isfinite(d)) fail_range<T>(s, w, num_str(d));
    if (out) *out = h;
  }
}

template <typename T>
void put_scalar(const Slot& s, const element& v, T* out, Loc w, const FillCtx& ctx) {
  switch (v.type()) {
    case ET::INT64:
      if constexpr (!std::is_same_v<T, bool>) {
        store_int<T>(s, as_int64(v), out, w);
        return;
      }
      break;
    case ET::UINT64:
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        fail_range<T>(s, w, std::to_string(as_uint64(v)));
      } else if constexpr (!std::is_same_v<T, bool>) {
        const uint64_t u = as_uint64(v);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          const T f = static_cast<T>(u);
          if (static_cast<long double>(f) != static_cast<long double>(u)) {
            fail(w.str() + ": " + std::to_string(u) + " cannot be converted to " +
                 std::string(dtype_name(s.info->spec.dtype)) + " without loss of precision (input '" +
                 s.info->name + "')");
          }
          if (out) *out = f;
        } else {
          const T h(static_cast<float>(u));
          if (std::isinf(static_cast<float>(h))) fail_range<T>(s, w, std::to_string(u));
          if (out) *out = h;
        }
        return;
      }
      break;
    case ET::DOUBLE:
      if constexpr (!std::is_integral_v<T>) {
        store_double<T>(s, as_double(v), out, w);
        return;
      }
      break;
    case ET::BOOL:
      if constexpr (std::is_same_v<T, bool>) {
        if (out) *out = as_bool(v);
        return;
      }
      break;
    case ET::STRING:
      if constexpr (!std::is_integral_v<T>) {
        const Marker m = marker_of(v, ctx.markers);
        if (m != Marker::kNone) {
          store_double<T>(s, marker_value(m), out, w);
          return;
        }
      }
      break;
    default:
      break;
  }
  fail(w.str() + ": expected " + expected_scalar<T>() + ", got " + type_desc(v, ctx.markers));
}

// Copies the bytes of a b64 value filling the dims from `level` on.
template <typename T>
void put_bytes(const Slot& s, const element& v, int level, T* out, const Where& w, FillCtx& ctx) {
  if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
    const std::string err = b64_decode(b64_text(v), ctx.scratch);
    if (!err.empty()) fail(w.str() + ": bad b64 value: " + err);
    const int64_t want = s.inner[level];
    if (static_cast<int64_t>(ctx.scratch.size()) != want) {
      fail(w.str() + ": expected " + std::to_string(want) + " bytes in the b64 value, got " +
           std::to_string(ctx.scratch.size()) + " (input '" + s.info->name + "' is " + spec_str(*s.info) + ")");
    }
    if (out && want > 0) std::memcpy(out, ctx.scratch.data(), static_cast<size_t>(want));
  } else {
    fail_b64_dtype(s, w);
  }
}

// Writes value `v` (at nesting `level` of the value) to `out` (nullptr: checks only).
template <typename T>
void fill(const Slot& s, const element& v, int level, T* out, const Where& w, FillCtx& ctx) {
  if (level == s.rank) {
    if (v.type() == ET::OBJECT && is_b64(v)) {
      put_bytes<T>(s, v, level, out, w, ctx);
      return;
    }
    put_scalar<T>(s, v, out, Loc{&w}, ctx);
    return;
  }
  if (v.type() == ET::ARRAY) {
    const array a = as_array(v);
    const int64_t want = s.dims[level];
    const int64_t n = static_cast<int64_t>(array_size(a));
    if (n != want) {
      fail(w.str() + ": expected " + list_desc(want) + ", got " + std::to_string(n) + " (input '" + s.info->name +
           "' is " + spec_str(*s.info) + ")");
    }
    int64_t i = 0;
    if (level + 1 == s.rank) {
      for (const element c : a) {
        if (c.type() == ET::OBJECT && is_b64(c)) {
          put_bytes<T>(s, c, level + 1, out ? out + i : nullptr, w.at(i), ctx);
        } else if (c.type() == ET::ARRAY || c.type() == ET::OBJECT) {
          fail(w.at(i).str() + ": expected " + expected_scalar<T>() + ", got " + type_desc(c, ctx.markers));
        } else {
          put_scalar<T>(s, c, out ? out + i : nullptr, Loc{&w, i}, ctx);
        }
        ++i;
      }
      return;
    }
    const int64_t step = s.inner[level + 1];
    for (const element c : a) {
      fill<T>(s, c, level + 1, out ? out + i * step : nullptr, w.at(i), ctx);
      ++i;
    }
    return;
  }
  if (is_b64(v)) {
    put_bytes<T>(s, v, level, out, w, ctx);
    return;
  }
  fail(w.str() + ": expected " + list_desc(s.dims[level]) + ", got " + type_desc(v, ctx.markers) + " (input '" +
       s.info->name + "' is " + spec_str(*s.info) + ")");
}

void check_rank(const package::TensorInfo& info) {
  if (info.spec.shape.size() > static_cast<size_t>(Shape::kMaxRank)) {
    fail("input '" + info.name + "' has rank " + std::to_string(info.spec.shape.size()) + " (at most " +
         std::to_string(Shape::kMaxRank) + ")");
  }
}

// Allocates the slot's tensor ([rows, dims...] or [dims...]), after checking that the
// body can hold that many values (a ragged body found first otherwise).
void allocate(Slot& s, int64_t rows, size_t body_size, const std::vector<element>& values,
              const std::vector<Where>& wheres, FillCtx& ctx) {
  std::vector<int64_t> dims;
  if (rows >= 0) dims.push_back(rows);
  dims.insert(dims.end(), s.dims, s.dims + s.rank);
  const int64_t total = sat_mul(std::max<int64_t>(rows, 1), s.inner[0]);
  if (total > static_cast<int64_t>(body_size)) {
    // Impossible for a well-formed value (each element takes a byte of the body at
    // least): some list is ragged. Find it without writing.
    visit_dtype(s.info->spec.dtype, [&](auto tag) {
      using T = decltype(tag);
      for (size_t i = 0; i < values.size(); ++i) fill<T>(s, values[i], 0, static_cast<T*>(nullptr), wheres[i], ctx);
    });
    fail(wheres.empty() ? "input '" + s.info->name + "' is too large" : wheres[0].str() + ": value too large");
  }
  s.tensor = Tensor::empty(Shape(dims), s.info->spec.dtype);
}

template <typename T>
void fill_into(Slot& s, const element& v, int64_t row, const Where& w, FillCtx& ctx) {
  T* base = static_cast<T*>(s.tensor.raw_data());
  fill<T>(s, v, 0, base + row * s.inner[0], w, ctx);
}

void fill_value(Slot& s, const element& v, int64_t row, const Where& w, FillCtx& ctx) {
  visit_dtype(s.info->spec.dtype, [&](auto tag) { fill_into<decltype(tag)>(s, v, row, w, ctx); });
}

// The input index of a body key; -1 when the signature has no such input.
int input_index(const package::Signature& sig, std::string_view key) {
  for (size_t i = 0; i < sig.inputs.size(); ++i) {
    if (sig.inputs[i].name == key) return static_cast<int>(i);
  }
  return -1;
}

// {"a": value, "b": value}: one value per signature input, each exactly once.
std::vector<element> named_values(const package::Signature& sig, const object& o, const Where& w) {
  std::vector<element> values(sig.inputs.size());
  std::vector<bool> seen(sig.inputs.size(), false);
  for (const auto kv : o) {
    const int k = input_index(sig, kv.key);
    if (k < 0) {
      fail(w.str() + ": unknown input '" + std::string(kv.key) + "' (the signature's inputs: " +
           names_str(sig.inputs) + ")");
    }
    if (seen[k]) fail(w.str() + ": input '" + std::string(kv.key) + "' appears twice");
    seen[k] = true;
    values[k] = kv.value;
  }
  for (size_t k = 0; k < sig.inputs.size(); ++k) {
    if (!seen[k]) {
      fail(w.str() + ": missing input '" + sig.inputs[k].name + "' (the signature's inputs: " +
           names_str(sig.inputs) + ")");
    }
  }
  return values;
}

bool is_named_object(const element& e) { return e.type() == ET::OBJECT && !is_b64(e); }

void decode_rows(const element& instances, const package::Signature& sig, size_t body_size, FillCtx& ctx,
                 TensorMap& out) {
  if (instances.type() != ET::ARRAY) {
    fail("'instances' must be a list (one entry per row), got " + type_desc(instances, ctx.markers));
  }
  const array rows = as_array(instances);
  const int64_t n = static_cast<int64_t>(array_size(rows));
  if (n == 0) fail("'instances' is an empty list: send at least one instance");
  const element first = *rows.begin();
  const bool named = is_named_object(first);
  if (!named && sig.inputs.size() > 1) {
    fail("instances[0]: expected an object with the signature's inputs (" + names_str(sig.inputs) + "), got " +
         type_desc(first, ctx.markers));
  }
  std::vector<Slot> slots(sig.inputs.size());
  for (size_t k = 0; k < slots.size(); ++k) {
    const auto& info = sig.inputs[k];
    check_rank(info);
    if (info.spec.shape.empty()) {
      fail("input '" + info.name +
           "' is a scalar (shape []): row format (\"instances\") needs a batch dimension; send it in "
           "\"inputs\" (columnar format)");
    }
    slots[k].info = &info;
    slots[k].base = 1;
    slots[k].rank = static_cast<int>(info.spec.shape.size()) - 1;
  }
  Where w0;
  w0.top = "instances";
  w0.item = 0;
  std::vector<element> firsts = named ? named_values(sig, as_object(first), w0)
                                      : std::vector<element>{first};
  for (size_t k = 0; k < slots.size(); ++k) {
    Where w = w0;
    if (named) {
      w.has_key = true;
      w.key = slots[k].info->name;
    }
    slots[k].first = firsts[k];
    discover(slots[k], w, ctx.markers);
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    Where w = w0;
    if (named) {
      w.has_key = true;
      w.key = slots[k].info->name;
    }
    // Values of every row, for the ragged-body check only when it is needed.
    if (sat_mul(n, slots[k].inner[0]) > static_cast<int64_t>(body_size)) {
      std::vector<element> values;
      std::vector<Where> wheres;
      int64_t i = 0;
      for (const element r : rows) {
        Where wi = w;
        wi.item = i++;
        if (named) {
          if (!is_named_object(r)) continue;
          values.push_back(named_values(sig, as_object(r), wi)[k]);
        } else {
          values.push_back(r);
        }
        wheres.push_back(wi);
      }
      allocate(slots[k], n, body_size, values, wheres, ctx);
    } else {
      allocate(slots[k], n, body_size, {}, {}, ctx);
    }
  }
  int64_t i = 0;
  for (const element r : rows) {
    Where w = w0;
    w.item = i;
    if (named) {
      if (!is_named_object(r)) {
        fail(w.str() + ": expected an object with the signature's inputs (" + names_str(sig.inputs) + "), got " +
             type_desc(r, ctx.markers));
      }
      const std::vector<element> values = i == 0 ? firsts : named_values(sig, as_object(r), w);
      for (size_t k = 0; k < slots.size(); ++k) {
        Where wk = w;
        wk.has_key = true;
        wk.key = slots[k].info->name;
        fill_value(slots[k], values[k], i, wk, ctx);
      }
    } else {
      if (is_named_object(r)) {
        fail(w.str() + ": expected a value like instances[0], got an object");
      }
      fill_value(slots[0], r, i, w, ctx);
    }
    ++i;
  }
  for (auto& s : slots) out.emplace(s.info->name, std::move(s.tensor));
}

void decode_columns(const element& inputs, const package::Signature& sig, size_t body_size, FillCtx& ctx,
                    TensorMap& out) {
  Where w0;
  w0.top = "inputs";
  std::vector<element> values;
  const bool named = is_named_object(inputs);
  if (named) {
    values = named_values(sig, as_object(inputs), w0);
  } else {
    if (sig.inputs.size() > 1) {
      fail("inputs: expected an object with the signature's inputs (" + names_str(sig.inputs) + "), got " +
           type_desc(inputs, ctx.markers));
    }
    values.push_back(inputs);
  }
  for (size_t k = 0; k < sig.inputs.size(); ++k) {
    const auto& info = sig.inputs[k];
    check_rank(info);
    Slot s;
    s.info = &info;
    s.base = 0;
    s.rank = static_cast<int>(info.spec.shape.size());
    s.first = values[k];
    Where w = w0;
    if (named) {
      w.has_key = true;
      w.key = info.name;
    }
    discover(s, w, ctx.markers);
    allocate(s, -1, body_size, {values[k]}, {w}, ctx);
    fill_value(s, values[k], 0, w, ctx);
    out.emplace(info.name, std::move(s.tensor));
  }
}

// ------------------------------------------------------------------------------------
// Predict: tensors -> JSON.

template <typename T>
void append_scalar(std::string& out, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    out += v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
    append_int(out, static_cast<int>(v));
  } else if constexpr (std::is_integral_v<T>) {
    append_int(out, v);
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    append_float(out, v);
  } else {  // half, bfloat16
    append_float(out, static_cast<float>(v));
  }
}

template <typename T>
void append_block(std::string& out, const T* p, const int64_t* dims, int rank) {
  if (rank == 0) {
    append_scalar(out, *p);
    return;
  }
  out += '[';
  if (rank == 1) {
    for (int64_t i = 0; i < dims[0]; ++i) {
      if (i) out += ',';
      append_scalar(out, p[i]);
    }
  } else {
    int64_t inner = 1;
    for (int k = 1; k < rank; ++k) inner *= dims[k];
    for (int64_t i = 0; i < dims[0]; ++i) {
      if (i) out += ',';
      append_block(out, p + i * inner, dims + 1, rank - 1);
    }
  }
  out += ']';
}

// The tensor's value (or its row `row`, when row >= 0) as JSON.
void append_tensor(std::string& out, const Tensor& t, int64_t row) {
  const Shape& shape = t.shape();
  int64_t dims[Shape::kMaxRank];
  int rank = shape.rank();
  for (int k = 0; k < rank; ++k) dims[k] = shape[k];
  int64_t offset = 0;
  const int64_t* d = dims;
  if (row >= 0) {
    int64_t inner = 1;
    for (int k = 1; k < rank; ++k) inner *= dims[k];
    offset = row * inner;
    d = dims + 1;
    rank -= 1;
  }
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    append_block(out, static_cast<const T*>(t.raw_data()) + offset, d, rank);
  });
}

size_t estimate_chars(const Tensor& t) {
  const size_t per = t.dtype() == DType::kBool ? 6 : (is_floating(t.dtype()) ? 14 : 8);
  return static_cast<size_t>(t.numel()) * per + 16;
}

// ------------------------------------------------------------------------------------
// Examples.

void fill_feature(const element& v, Feature& f, const std::string& where, FillCtx& ctx) {
  // The elements: the list's entries, or the value itself.
  std::vector<element> elems;
  if (v.type() == ET::ARRAY) {
    for (const element e : as_array(v)) elems.push_back(e);
  } else {
    elems.push_back(v);
  }
  const bool list = v.type() == ET::ARRAY;
  const auto at = [&](size_t i) { return list ? where + "[" + std::to_string(i) + "]" : where; };
  bool any_bytes = false, any_number = false, any_float = false;
  for (size_t i = 0; i < elems.size(); ++i) {
    const element& e = elems[i];
    switch (e.type()) {
      case ET::STRING:
        if (marker_of(e, ctx.markers) != Marker::kNone) {
          any_number = any_float = true;
        } else {
          any_bytes = true;
        }
        break;
      case ET::OBJECT:
        if (!is_b64(e)) {
          fail(at(i) + ": expected a number, a string or {\"b64\": \"...\"}, got an object");
        }
        any_bytes = true;
        break;
      case ET::DOUBLE:
        any_number = any_float = true;
        break;
      case ET::INT64:
      case ET::UINT64:
      case ET::BOOL:
        any_number = true;
        break;
      case ET::ARRAY:
        fail(at(i) + ": expected a number, a string or {\"b64\": \"...\"}, got a list (features are flat lists)");
      case ET::NULL_VALUE:
        fail(at(i) + ": expected a number, a string or {\"b64\": \"...\"}, got null");
    }
  }
  if (any_bytes && any_number) {
    fail(where + ": mixes strings and numbers (a feature is one bytes_list, float_list or int64_list)");
  }
  if (elems.empty()) return;  // an empty feature (no kind), as TF Serving makes it
  if (any_bytes) {
    f.kind = Feature::kBytes;
    auto* l = &f.bytes;
    l->reserve(elems.size());
    for (size_t i = 0; i < elems.size(); ++i) {
      const element& e = elems[i];
      if (e.type() == ET::STRING) {
        const std::string_view s = as_string(e);
        l->emplace_back(s);
      } else {
        const std::string err = b64_decode(b64_text(e), ctx.scratch);
        if (!err.empty()) fail(at(i) + ": bad b64 value: " + err);
        l->push_back(ctx.scratch);
      }
    }
  } else if (any_float) {
    f.kind = Feature::kFloat;
    auto* l = &f.floats;
    l->reserve(elems.size());
    for (size_t i = 0; i < elems.size(); ++i) {
      const element& e = elems[i];
      double d = 0;
      switch (e.type()) {
        case ET::DOUBLE: d = as_double(e); break;
        case ET::STRING: d = marker_value(marker_of(e, ctx.markers)); break;
        case ET::BOOL: d = as_bool(e) ? 1 : 0; break;
        case ET::INT64: {
          const int64_t x = as_int64(e);
          if (static_cast<long double>(static_cast<float>(x)) != static_cast<long double>(x)) {
            fail(at(i) + ": " + std::to_string(x) + " cannot be converted to float without loss of precision");
          }
          d = static_cast<double>(x);
          break;
        }
        case ET::UINT64: {
          const uint64_t x = as_uint64(e);
          if (static_cast<long double>(static_cast<float>(x)) != static_cast<long double>(x)) {
            fail(at(i) + ": " + std::to_string(x) + " cannot be converted to float without loss of precision");
          }
          d = static_cast<double>(x);
          break;
        }
        default: break;
      }
      const float fl = static_cast<float>(d);
      if (std::isinf(fl) && std::isfinite(d)) fail(at(i) + ": " + num_str(d) + " does not fit in a float_list");
      l->push_back(fl);
    }
  } else {
    f.kind = Feature::kInt64;
    auto* l = &f.ints;
    l->reserve(elems.size());
    for (size_t i = 0; i < elems.size(); ++i) {
      const element& e = elems[i];
      switch (e.type()) {
        case ET::INT64: l->push_back(as_int64(e)); break;
        case ET::BOOL: l->push_back(as_bool(e) ? 1 : 0); break;
        case ET::UINT64:
          fail(at(i) + ": " + std::to_string(as_uint64(e)) + " does not fit in an int64_list");
        default: break;
      }
    }
  }
}

void fill_example(const element& v, const std::string& where, Features& features, FillCtx& ctx) {
  if (v.type() != ET::OBJECT) {
    fail(where + ": expected an object of features, got " + type_desc(v, ctx.markers));
  }
  for (const auto kv : as_object(v)) {
    std::string name(kv.key);
    std::string at = where + "['" + name + "']";
    if (features.count(name)) fail(at + ": the feature appears twice");
    fill_feature(kv.value, features[name], at, ctx);
  }
}

// Top-level members we know, each at most once.
struct TopLevel {
  std::string signature_name;
  element instances, inputs, context, examples;
  bool has_instances = false, has_inputs = false, has_context = false, has_examples = false;
};

TopLevel top_level(const element& root, bool markers) {
  TopLevel t;
  bool has_sig = false;
  for (const auto kv : as_object(root)) {
    const auto take = [&](std::string_view name, element& slot, bool& has) {
      if (kv.key != name) return false;
      if (has) fail("the request has two '" + std::string(name) + "' keys");
      slot = kv.value;
      has = true;
      return true;
    };
    if (kv.key == "signature_name") {
      if (has_sig) fail("the request has two 'signature_name' keys");
      has_sig = true;
      if (kv.value.type() != ET::STRING) {
        fail("'signature_name' must be a string, got " + type_desc(kv.value, markers));
      }
      t.signature_name = std::string(as_string(kv.value));
      continue;
    }
    if (take("instances", t.instances, t.has_instances) || take("inputs", t.inputs, t.has_inputs) ||
        take("context", t.context, t.has_context) || take("examples", t.examples, t.has_examples)) {
      continue;
    }
    // Other keys are ignored, as TF Serving does.
  }
  return t;
}

}  // namespace

// ------------------------------------------------------------------------------------

PredictRequest decode_predict(std::string_view body,
                              const std::function<const package::Signature&(const std::string&)>& lookup) {
  ParserLease lease;
  FillCtx ctx;
  const element root = parse_body(lease, body, &ctx.markers);
  TopLevel top = top_level(root, ctx.markers);
  PredictRequest req;
  req.signature_name = top.signature_name;
  const package::Signature& sig = lookup(req.signature_name);
  if (top.has_instances && top.has_inputs) {
    fail("the request has both 'instances' (row format) and 'inputs' (columnar format): send one of them");
  }
  if (!top.has_instances && !top.has_inputs) {
    fail("missing 'inputs' or 'instances' key: expected {\"instances\": [...]} or {\"inputs\": ...}");
  }
  if (sig.inputs.empty()) {
    fail("signature '" + (sig.name.empty() ? req.signature_name : sig.name) + "' has no inputs");
  }
  req.row_format = top.has_instances;
  if (req.row_format) {
    decode_rows(top.instances, sig, body.size(), ctx, req.inputs);
  } else {
    decode_columns(top.inputs, sig, body.size(), ctx, req.inputs);
  }
  return req;
}

std::string encode_predict(const package::Signature& sig, const TensorMap& outputs, bool row_format) {
  if (sig.outputs.empty()) fail("signature '" + sig.name + "' has no outputs to write");
  std::vector<std::pair<const std::string*, Tensor>> ts;
  ts.reserve(sig.outputs.size());
  size_t chars = 32;
  for (const auto& info : sig.outputs) {
    auto it = outputs.find(info.name);
    if (it == outputs.end() || !it->second.defined()) {
      throw InternalError("output '" + info.name + "' of signature '" + sig.name + "' is missing from the results");
    }
    Tensor t = it->second.device() == Device::cpu() ? it->second : it->second.to(Device::cpu());
    chars += estimate_chars(t) + info.name.size() + 8;
    ts.emplace_back(&info.name, std::move(t));
  }
  std::string out;
  if (row_format) {
    int64_t rows = -1;
    for (const auto& [name, t] : ts) {
      if (t.rank() == 0) {
        fail("output '" + *name +
             "' has no shape information (a scalar): row format (\"instances\") needs outputs with a batch "
             "dimension; send \"inputs\" (columnar format) instead");
      }
      if (rows >= 0 && t.dim(0) != rows) {
        fail("output '" + *name + "' has inconsistent batch size: " + std::to_string(t.dim(0)) + " expecting: " +
             std::to_string(rows) + " (row format needs every output batched alike; send \"inputs\" instead)");
      }
      rows = t.dim(0);
    }
    const bool several = ts.size() > 1;
    out.reserve(chars + static_cast<size_t>(rows) * (several ? 2 : 1));
    out += "{\"predictions\":[";
    for (int64_t r = 0; r < rows; ++r) {
      if (r) out += ',';
      if (several) out += '{';
      for (size_t k = 0; k < ts.size(); ++k) {
        if (several) {
          if (k) out += ',';
          append_json_string(out, *ts[k].first);
          out += ':';
        }
        append_tensor(out, ts[k].second, r);
      }
      if (several) out += '}';
    }
    out += "]}";
  } else {
    out.reserve(chars);
    out += "{\"outputs\":";
    if (ts.size() == 1) {
      append_tensor(out, ts[0].second, -1);
    } else {
      out += '{';
      for (size_t k = 0; k < ts.size(); ++k) {
        if (k) out += ',';
        append_json_string(out, *ts[k].first);
        out += ':';
        append_tensor(out, ts[k].second, -1);
      }
      out += '}';
    }
    out += '}';
  }
  return out;
}

ExamplesRequest decode_examples(std::string_view body) {
  ParserLease lease;
  FillCtx ctx;
  const element root = parse_body(lease, body, &ctx.markers);
  TopLevel top = top_level(root, ctx.markers);
  ExamplesRequest req;
  req.signature_name = top.signature_name;
  if (top.has_context) {
    req.has_context = true;
    fill_example(top.context, "context", req.context, ctx);
  }
  if (!top.has_examples) fail("missing 'examples' key: expected {\"examples\": [{...}, ...]}");
  if (top.examples.type() != ET::ARRAY) {
    fail("'examples' must be a list of objects, got " + type_desc(top.examples, ctx.markers));
  }
  const array list = as_array(top.examples);
  const size_t n = array_size(list);
  if (n == 0) fail("'examples' is an empty list: send at least one example");
  req.examples.resize(n);
  size_t i = 0;
  for (const element e : list) {
    fill_example(e, "examples[" + std::to_string(i) + "]", req.examples[i], ctx);
    ++i;
  }
  return req;
}

std::string encode_classify(const std::vector<std::vector<std::pair<std::string, float>>>& results) {
  std::string out = "{\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    if (i) out += ',';
    out += '[';
    for (size_t k = 0; k < results[i].size(); ++k) {
      if (k) out += ',';
      out += '[';
      append_json_string(out, results[i][k].first);
      out += ',';
      append_float(out, results[i][k].second);
      out += ']';
    }
    out += ']';
  }
  out += "]}";
  return out;
}

std::string encode_regress(const std::vector<float>& results) {
  std::string out;
  out.reserve(results.size() * 14 + 16);
  out += "{\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    if (i) out += ',';
    append_float(out, results[i]);
  }
  out += "]}";
  return out;
}

std::string encode_status(const std::vector<VersionStatus>& versions) {
  std::string out = "{\"model_version_status\":[";
  for (size_t i = 0; i < versions.size(); ++i) {
    const VersionStatus& v = versions[i];
    if (i) out += ',';
    out += "{\"version\":\"";
    append_int(out, v.version);
    out += "\",\"state\":";
    append_json_string(out, state_name(v.state));
    out += ",\"status\":{\"error_code\":";
    append_json_string(out, code_name(v.status.code));
    out += ",\"error_message\":";
    append_json_string(out, v.status.message);
    out += "}}";
  }
  out += "]}";
  return out;
}

namespace {

void append_tensor_info(std::string& out, const package::TensorInfo& info) {
  out += "{\"dtype\":";
  append_json_string(out, tf::tf_dtype_name(info.spec.dtype));
  out += ",\"tensor_shape\":{\"dim\":[";
  for (size_t i = 0; i < info.spec.shape.size(); ++i) {
    if (i) out += ',';
    out += "{\"size\":\"";
    append_int(out, info.spec.shape[i]);
    out += "\",\"name\":\"\"}";
  }
  out += "],\"unknown_rank\":false},\"name\":";
  append_json_string(out, info.tensor_name.empty() ? info.name : info.tensor_name);
  out += '}';
}

void append_tensor_infos(std::string& out, const std::vector<package::TensorInfo>& infos) {
  out += '{';
  for (size_t i = 0; i < infos.size(); ++i) {
    if (i) out += ',';
    append_json_string(out, infos[i].name);
    out += ':';
    append_tensor_info(out, infos[i]);
  }
  out += '}';
}

}  // namespace

std::string encode_metadata(const std::string& model, int64_t version, const std::vector<package::Signature>& sigs) {
  std::string out = "{\"model_spec\":{\"name\":";
  append_json_string(out, model);
  out += ",\"signature_name\":\"\",\"version\":\"";
  append_int(out, version);
  out += "\"},\"metadata\":{\"signature_def\":{\"signature_def\":{";
  for (size_t i = 0; i < sigs.size(); ++i) {
    const package::Signature& s = sigs[i];
    if (i) out += ',';
    append_json_string(out, s.name);
    out += ":{\"inputs\":";
    append_tensor_infos(out, s.inputs);
    out += ",\"outputs\":";
    append_tensor_infos(out, s.outputs);
    out += ",\"method_name\":";
    append_json_string(out, s.method);
    out += ",\"defaults\":{}}";
  }
  out += "}}}}";
  return out;
}

std::string encode_error(std::string_view message) {
  std::string out = "{\"error\":";
  append_json_string(out, message);
  out += '}';
  return out;
}

}  // namespace kiln::serving::json
