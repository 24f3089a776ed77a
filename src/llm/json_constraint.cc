#include "kiln/llm/json_constraint.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/core/error.h"

namespace kiln::llm {

using kiln::detail::str_cat;
using Kind = JsonSchema::Node::Kind;

namespace {
// Byte order (unsigned), the order the recognizer's candidate ranges assume.
bool byte_less(const std::string& a, const std::string& b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                      [](char x, char y) { return static_cast<uint8_t>(x) < static_cast<uint8_t>(y); });
}
}  // namespace

// ---- the schema compiler -------------------------------------------------------------

class JsonSchemaCompiler {
 public:
  using Json = nlohmann::ordered_json;
  explicit JsonSchemaCompiler(const Json& document) : doc_(document) {}

  std::shared_ptr<const JsonSchema> run() {
    auto s = std::make_shared<JsonSchema>();
    out_ = s.get();
    out_->root_ = compile(doc_, "");
    // References: resolve now that every definition has a node; a chain of references
    // that never reaches a schema is refused.
    for (auto& [ref, node] : refs_) {
      const Json* target = resolve_pointer(ref);
      if (target == nullptr) throw InvalidArgumentError(str_cat("JSON schema: $ref '", ref, "' does not resolve (at ", ref_site_[ref], ")"));
      out_->nodes_[static_cast<size_t>(node)].target = compile(*target, ref.substr(1));
    }
    for (auto& [ref, node] : refs_) {
      std::set<int32_t> seen;
      for (int32_t n = node; out_->node(n).kind == Kind::kRef; n = out_->node(n).target)
        if (!seen.insert(n).second) throw InvalidArgumentError(str_cat("JSON schema: $ref '", ref, "' refers only to itself"));
    }
    return s;
  }

 private:
  int32_t add(JsonSchema::Node n) {
    if (out_->nodes_.size() >= 10000) throw InvalidArgumentError("JSON schema: more than 10000 nodes");
    out_->nodes_.push_back(std::move(n));
    return static_cast<int32_t>(out_->nodes_.size() - 1);
  }
  [[noreturn]] static void bad(const std::string& at, const std::string& what) {
    throw InvalidArgumentError(str_cat("JSON schema at '", at.empty() ? "#" : "#" + at, "': ", what));
  }
  const Json* resolve_pointer(const std::string& ref) const {
    if (ref == "#") return &doc_;
    if (ref.rfind("#/", 0) != 0) return nullptr;
    try {
      const Json& j = doc_.at(Json::json_pointer(ref.substr(1)));
      return &j;
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  static int64_t count(const Json& s, const char* key, const std::string& at) {
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) bad(at, str_cat("'", key, "' must be a non-negative integer"));
    return v.get<int64_t>();
  }
  // The JSON text of a key as generated (escaped), then its closing quote.
  static std::string key_text(const std::string& key) {
    std::string quoted = Json(key).dump();  // "...", escaped
    return quoted.substr(1);
  }

  int32_t compile(const Json& s, const std::string& at) {
    if (++depth_ > 64) bad(at, "nested more than 64 levels");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    if (s.is_boolean()) {
      if (!s.get<bool>()) bad(at, "the schema false allows no value");
      return add({});
    }
    if (!s.is_object()) bad(at, "a schema must be an object or a boolean");
    static const std::set<std::string> kUnsupported = {
        "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems",
        "contains", "minContains", "maxContains", "not", "if", "then", "else", "dependentRequired",
        "dependentSchemas", "dependencies", "patternProperties", "propertyNames", "minProperties",
        "maxProperties", "prefixItems", "additionalItems", "unevaluatedProperties", "unevaluatedItems"};
    for (const auto& [k, v] : s.items())
      if (kUnsupported.count(k)) bad(at, str_cat("'", k, "' is not supported (kiln enforces type, properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf, allOf of one, $ref)"));
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) bad(at, "'$ref' must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      auto it = refs_.find(ref);
      if (it != refs_.end()) return it->second;
      JsonSchema::Node n;
      n.kind = Kind::kRef;
      const int32_t id = add(std::move(n));
      refs_.emplace(ref, id);
      ref_site_.emplace(ref, at.empty() ? "#" : "#" + at);
      return id;
    }
    if (s.contains("const") || s.contains("enum")) {
      JsonSchema::Node n;
      n.kind = Kind::kLiterals;
      if (s.contains("const")) n.literals.push_back(s["const"].dump());
      if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) bad(at, "'enum' must be a non-empty array");
        for (const Json& v : s["enum"]) n.literals.push_back(v.dump());
      }
      std::sort(n.literals.begin(), n.literals.end(), byte_less);
      n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
      return add(std::move(n));
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key)) continue;
      const Json& alts = s[key];
      if (!alts.is_array() || alts.empty()) bad(at, str_cat("'", key, "' must be a non-empty array of schemas"));
      if (s.contains("type") || s.contains("properties") || s.contains("items"))
        bad(at, str_cat("'", key, "' beside 'type', 'properties' or 'items' is not supported: move them into each alternative"));
      if (std::string(key) == "allOf") {
        if (alts.size() != 1) bad(at, "'allOf' of more than one schema is not supported");
        return compile(alts[0], at + "/allOf/0");
      }
      JsonSchema::Node n;
      n.kind = Kind::kUnion;
      for (size_t i = 0; i < alts.size(); ++i) n.alternatives.push_back(compile(alts[i], str_cat(at, "/", key, "/", i)));
      return add(std::move(n));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty())
        for (const Json& e : t) {
          if (!e.is_string()) bad(at, "'type' must be a string or an array of strings");
          types.push_back(e.get<std::string>());
        }
      else bad(at, "'type' must be a string or an array of strings");
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return add({});  // any value
    }
    if (types.size() == 1) return compile_type(s, types[0], at);
    JsonSchema::Node n;
    n.kind = Kind::kUnion;
    for (const std::string& t : types) n.alternatives.push_back(compile_type(s, t, at));
    return add(std::move(n));
  }

  int32_t compile_type(const Json& s, const std::string& type, const std::string& at) {
    JsonSchema::Node n;
    if (type == "object") {
      n.kind = Kind::kObject;
      std::set<std::string> required;
      if (s.contains("required")) {
        if (!s["required"].is_array()) bad(at, "'required' must be an array of strings");
        for (const Json& r : s["required"]) {
          if (!r.is_string()) bad(at, "'required' must be an array of strings");
          required.insert(r.get<std::string>());
        }
      }
      int32_t additional = -1;
      bool no_additional = false;
      if (s.contains("additionalProperties")) {
        const Json& a = s["additionalProperties"];
        if (a.is_boolean()) no_additional = !a.get<bool>();
        else additional = compile(a, at + "/additionalProperties");
      }
      if (s.contains("properties")) {
        const Json& props = s["properties"];
        if (!props.is_object()) bad(at, "'properties' must be an object of schemas");
        for (const auto& [key, sub] : props.items()) {
          JsonSchema::Property p;
          p.key = key_text(key);
          p.required = required.erase(key) > 0;
          p.node = compile(sub, at + "/properties/" + key);
          n.properties.push_back(std::move(p));
        }
      }
      if (!required.empty()) bad(at, str_cat("required property '", *required.begin(), "' is not in 'properties'"));
      n.free_keys = n.properties.empty() && !no_additional;
      n.values = additional;
      const auto np = static_cast<int32_t>(n.properties.size());
      n.next_required.assign(static_cast<size_t>(np) + 1, np);
      for (int32_t i = np - 1; i >= 0; --i)
        n.next_required[static_cast<size_t>(i)] = n.properties[static_cast<size_t>(i)].required ? i : n.next_required[static_cast<size_t>(i) + 1];
      for (int32_t i = 0; i < np; ++i) n.keys_sorted.push_back(i);
      std::sort(n.keys_sorted.begin(), n.keys_sorted.end(), [&](int32_t a, int32_t b) {
        return byte_less(n.properties[static_cast<size_t>(a)].key, n.properties[static_cast<size_t>(b)].key);
      });
      for (size_t i = 1; i < n.keys_sorted.size(); ++i)
        if (n.properties[static_cast<size_t>(n.keys_sorted[i])].key == n.properties[static_cast<size_t>(n.keys_sorted[i - 1])].key)
          bad(at, "a property is declared twice");
    } else if (type == "array") {
      n.kind = Kind::kArray;
      if (s.contains("items")) {
        if (s["items"].is_array()) bad(at, "'items' as an array (tuples) is not supported");
        n.items = compile(s["items"], at + "/items");
      }
      if (s.contains("minItems")) n.min = count(s, "minItems", at);
      if (s.contains("maxItems")) n.max = count(s, "maxItems", at);
      if (n.max >= 0 && n.max < n.min) bad(at, "'maxItems' is below 'minItems'");
    } else if (type == "string") {
      n.kind = Kind::kString;
      if (s.contains("minLength")) n.min = count(s, "minLength", at);
      if (s.contains("maxLength")) n.max = count(s, "maxLength", at);
      if (n.max >= 0 && n.max < n.min) bad(at, "'maxLength' is below 'minLength'");
    } else if (type == "number" || type == "integer") {
      n.kind = type == "number" ? Kind::kNumber : Kind::kInteger;
    } else if (type == "boolean") {
      n.kind = Kind::kLiterals;
      n.literals = {"false", "true"};
    } else if (type == "null") {
      n.kind = Kind::kLiterals;
      n.literals = {"null"};
    } else {
      bad(at, str_cat("unknown type '", type, "'"));
    }
    return add(std::move(n));
  }

  const Json& doc_;
  JsonSchema* out_ = nullptr;
  std::map<std::string, int32_t> refs_;
  std::map<std::string, std::string> ref_site_;
  int depth_ = 0;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(std::string_view schema_json) {
  JsonSchemaCompiler::Json doc;
  try {
    doc = JsonSchemaCompiler::Json::parse(schema_json);
  } catch (const std::exception& e) {
    throw InvalidArgumentError(str_cat("JSON schema: not JSON (", e.what(), ")"));
  }
  return JsonSchemaCompiler(doc).run();
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> s = compile(R"({"type": "object"})");
  return s;
}

// ---- the recognizer ------------------------------------------------------------------

enum class JsonRecognizer::Mode : uint8_t {
  kValue,         // a value of `node` is expected
  kValueOrClose,  // after '[': a value or ']'
  kKeyOrClose,    // after '{': a key or '}'
  kKey,           // after ',' in an object: a key
  kColon,         // after a key (`node`: the value's schema)
  kAfterValue,    // after a value in a container: ',' or its closing bracket
  kString,        // inside a string (a value, or a key of an object with free keys)
  kEscape,        // after a backslash
  kUnicode,       // in \uXXXX
  kNumber,        // inside a number
  kLiteral,       // inside one of `node`'s literals (or true/false/null)
  kKeyLiteral,    // inside one of the top object's declared keys
  kDone,          // the value is complete: only whitespace
};

namespace {
bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
enum Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };
bool number_can_end(uint8_t n) { return n == kZero || n == kInt || n == kFrac || n == kExpDigits; }
constexpr int32_t kAnyLiterals = -2;  // `node` of true / false / null where any value goes
const std::vector<std::string>& any_literals() {
  static const std::vector<std::string> l = {"false", "null", "true"};
  return l;
}
constexpr size_t kMaxPaths = 64;

bool same(const JsonRecognizer::Path& a, const JsonRecognizer::Path& b) {
  if (a.mode != b.mode || a.node != b.node || a.lo != b.lo || a.hi != b.hi || a.at != b.at || a.chars != b.chars ||
      a.num != b.num || a.utf8_left != b.utf8_left || a.utf8_lo != b.utf8_lo || a.utf8_hi != b.utf8_hi ||
      a.unicode_left != b.unicode_left || a.in_key != b.in_key || a.integer != b.integer || a.stack.size() != b.stack.size())
    return false;
  for (size_t i = 0; i < a.stack.size(); ++i)
    if (a.stack[i].node != b.stack[i].node || a.stack[i].cursor != b.stack[i].cursor || a.stack[i].array != b.stack[i].array)
      return false;
  return true;
}
}  // namespace

JsonRecognizer::JsonRecognizer() : JsonRecognizer(JsonSchema::any_object().get()) {}

JsonRecognizer::JsonRecognizer(const JsonSchema* schema) : schema_(schema) {
  Path p;
  p.mode = Mode::kValue;
  p.node = schema_->root();
  paths_.push_back(std::move(p));
}

bool JsonRecognizer::advance(uint8_t c) {
  thread_local std::vector<Path> spare;  // (its capacity is reused; paths_ keeps the other buffer)
  return advance(c, spare);
}

bool JsonRecognizer::advance(uint8_t c, std::vector<Path>& next) {
  next.clear();
  for (Path& p : paths_) step(std::move(p), c, next);
  if (next.size() > 1) {  // readings that met again are one
    size_t kept = 0;
    for (size_t i = 0; i < next.size() && kept < kMaxPaths; ++i)
      if (std::none_of(next.begin(), next.begin() + static_cast<std::ptrdiff_t>(kept), [&](const Path& u) { return same(u, next[i]); })) {
        if (kept != i) next[kept] = std::move(next[i]);
        ++kept;
      }
    next.resize(kept);
  }
  paths_.swap(next);
  return !paths_.empty();
}

bool JsonRecognizer::feed(uint8_t c) {
  JsonRecognizer r = *this;
  if (!r.advance(c)) return false;
  *this = std::move(r);
  return true;
}

bool JsonRecognizer::feed(std::string_view bytes) {
  JsonRecognizer r = *this;
  for (char c : bytes)
    if (!r.advance(static_cast<uint8_t>(c))) return false;
  *this = std::move(r);
  return true;
}

bool JsonRecognizer::complete() const {
  for (const Path& p : paths_) {
    if (p.mode == Mode::kDone) return true;
    if (!p.stack.empty()) continue;
    if (p.mode == Mode::kNumber && number_can_end(p.num)) return true;
    if (p.mode == Mode::kLiteral) {
      const auto& lits = p.node == kAnyLiterals ? any_literals() : schema_->node(p.node).literals;
      if (lits[static_cast<size_t>(p.lo)].size() == static_cast<size_t>(p.at)) return true;
    }
  }
  return false;
}

bool JsonRecognizer::closed() const {
  return std::all_of(paths_.begin(), paths_.end(), [](const Path& p) { return p.mode == Mode::kDone; });
}

bool JsonRecognizer::between_string_characters() const {
  for (const Path& p : paths_)
    if (p.mode != Mode::kString || p.utf8_left != 0) return false;
  return !paths_.empty();
}

int64_t JsonRecognizer::string_room() const {
  int64_t room = 0;
  for (const Path& p : paths_) {
    const int64_t max = p.node >= 0 ? schema_->node(p.node).max : -1;
    if (max < 0) return -1;
    room = std::max(room, max - p.chars);
  }
  return room;
}

void JsonRecognizer::end_value(Path& p) const {
  if (p.stack.empty()) {
    p.mode = Mode::kDone;
    return;
  }
  if (p.stack.back().array) ++p.stack.back().cursor;
  p.mode = Mode::kAfterValue;
}

void JsonRecognizer::start_value(Path p, int32_t node, uint8_t c, std::vector<Path>& out) const {
  while (node >= 0 && schema_->node(node).kind == Kind::kRef) node = schema_->node(node).target;
  const JsonSchema::Node* n = node >= 0 ? &schema_->node(node) : nullptr;
  const Kind kind = n ? n->kind : Kind::kAny;
  if (kind == Kind::kUnion) {
    for (int32_t alt : n->alternatives) start_value(p, alt, c, out);
    return;
  }
  if (kind == Kind::kLiterals || (kind == Kind::kAny && (c == 't' || c == 'f' || c == 'n'))) {
    p.mode = Mode::kLiteral;
    p.node = kind == Kind::kLiterals ? node : kAnyLiterals;
    p.lo = 0;
    p.hi = static_cast<int32_t>((kind == Kind::kLiterals ? n->literals : any_literals()).size());
    p.at = 0;
    step(std::move(p), c, out);
    return;
  }
  const bool any = kind == Kind::kAny;
  if (c == '{' && (any || kind == Kind::kObject)) {
    if (p.stack.full()) return;  // deeper than any answer needs
    p.stack.push_back({any ? -1 : node, 0, false});
    p.mode = Mode::kKeyOrClose;
  } else if (c == '[' && (any || kind == Kind::kArray)) {
    if (p.stack.full()) return;
    p.stack.push_back({any ? -1 : node, 0, true});
    p.mode = Mode::kValueOrClose;
  } else if (c == '"' && (any || kind == Kind::kString)) {
    p.mode = Mode::kString;
    p.node = any ? -1 : node;
    p.in_key = false;
    p.chars = 0;
  } else if ((c == '-' || is_digit(c)) && (any || kind == Kind::kNumber || kind == Kind::kInteger)) {
    p.mode = Mode::kNumber;
    p.integer = kind == Kind::kInteger;
    p.num = c == '-' ? kMinus : c == '0' ? kZero : kInt;
    p.chars = c == '-' ? 0 : 1;
    p.lo = p.at = 0;
  } else {
    return;
  }
  out.push_back(std::move(p));
}

void JsonRecognizer::step(Path p, uint8_t c, std::vector<Path>& out) const {
  // The container on top of the stack: its node (nullptr: any container) and kind.
  const auto top = [&]() -> const JsonSchema::Node* {
    return p.stack.back().node >= 0 ? &schema_->node(p.stack.back().node) : nullptr;
  };
  // An object frame's declared-keys state: may it close, may another key come?
  const auto object_may_close = [&](const JsonSchema::Node* o) {
    return o == nullptr || o->free_keys ||
           o->next_required[static_cast<size_t>(p.stack.back().cursor)] == static_cast<int32_t>(o->properties.size());
  };
  const auto object_may_add = [&](const JsonSchema::Node* o) {
    return o == nullptr || o->free_keys || p.stack.back().cursor < static_cast<int32_t>(o->properties.size());
  };
  switch (p.mode) {
    case Mode::kDone:
      if (is_space(c)) out.push_back(std::move(p));
      return;
    case Mode::kValue:
      if (is_space(c)) return out.push_back(std::move(p));
      {
        const int32_t node = p.node;
        return start_value(std::move(p), node, c, out);
      }
    case Mode::kValueOrClose: {
      if (is_space(c)) return out.push_back(std::move(p));
      const JsonSchema::Node* a = top();
      if (c == ']') {
        if (a && p.stack.back().cursor < a->min) return;
        p.stack.pop_back();
        end_value(p);
        return out.push_back(std::move(p));
      }
      if (a && a->max == 0) return;
      p.mode = Mode::kValue;
      p.node = a ? a->items : -1;
      return step(std::move(p), c, out);
    }
    case Mode::kKeyOrClose:
    case Mode::kKey: {
      if (is_space(c)) return out.push_back(std::move(p));
      const JsonSchema::Node* o = top();
      if (c == '}' && p.mode == Mode::kKeyOrClose) {
        if (!object_may_close(o)) return;
        p.stack.pop_back();
        end_value(p);
        return out.push_back(std::move(p));
      }
      if (c != '"' || !object_may_add(o)) return;
      if (o == nullptr || o->free_keys) {
        p.mode = Mode::kString;
        p.in_key = true;
        p.node = -1;
        p.chars = 0;
      } else {
        p.mode = Mode::kKeyLiteral;
        p.lo = 0;
        p.hi = static_cast<int32_t>(o->keys_sorted.size());
        p.at = 0;
      }
      return out.push_back(std::move(p));
    }
    case Mode::kColon:
      if (is_space(c)) return out.push_back(std::move(p));
      if (c != ':') return;
      p.mode = Mode::kValue;
      return out.push_back(std::move(p));
    case Mode::kAfterValue: {
      if (is_space(c)) return out.push_back(std::move(p));
      const JsonSchema::Node* t = top();
      Frame& f = p.stack.back();
      if (f.array) {
        const int32_t items = f.cursor;  // (counted when the value ended)
        if (c == ',') {
          if (t && t->max >= 0 && items >= t->max) return;
          p.mode = Mode::kValue;
          p.node = t ? t->items : -1;
          return out.push_back(std::move(p));
        }
        if (c != ']' || (t && items < t->min)) return;
      } else {
        if (c == ',') {
          if (!object_may_add(t)) return;
          p.mode = Mode::kKey;
          return out.push_back(std::move(p));
        }
        if (c != '}' || !object_may_close(t)) return;
      }
      p.stack.pop_back();
      end_value(p);
      return out.push_back(std::move(p));
    }
    case Mode::kKeyLiteral: {
      const JsonSchema::Node& o = *top();
      const int32_t cursor = p.stack.back().cursor;
      const int32_t last = o.next_required[static_cast<size_t>(cursor)];  // the last property that may come
      const auto key = [&](int32_t i) -> const std::string& {
        return o.properties[static_cast<size_t>(o.keys_sorted[static_cast<size_t>(i)])].key;
      };
      const auto at = static_cast<size_t>(p.at);
      int32_t lo = p.lo, hi = p.hi;
      while (lo < hi && (key(lo).size() <= at || static_cast<uint8_t>(key(lo)[at]) < c)) ++lo;
      int32_t end = lo;
      while (end < hi && key(end).size() > at && static_cast<uint8_t>(key(end)[at]) == c) ++end;
      int32_t done = -1;
      bool eligible = false;
      for (int32_t i = lo; i < end; ++i) {
        const int32_t prop = o.keys_sorted[static_cast<size_t>(i)];
        if (prop < cursor || prop > last) continue;
        eligible = true;
        if (key(i).size() == at + 1) done = prop;
      }
      if (!eligible) return;
      if (done >= 0) {  // the closing quote: the key is this property
        p.stack.back().cursor = done + 1;
        p.mode = Mode::kColon;
        p.node = o.properties[static_cast<size_t>(done)].node;
      } else {
        p.lo = lo, p.hi = end, p.at = static_cast<int32_t>(at + 1);
      }
      return out.push_back(std::move(p));
    }
    case Mode::kLiteral: {
      const auto& lits = p.node == kAnyLiterals ? any_literals() : schema_->node(p.node).literals;
      const auto at = static_cast<size_t>(p.at);
      int32_t lo = p.lo, hi = p.hi;
      const int32_t first = lo;
      while (lo < hi && (lits[static_cast<size_t>(lo)].size() <= at || static_cast<uint8_t>(lits[static_cast<size_t>(lo)][at]) < c)) ++lo;
      int32_t end = lo;
      while (end < hi && lits[static_cast<size_t>(end)].size() > at && static_cast<uint8_t>(lits[static_cast<size_t>(end)][at]) == c) ++end;
      if (lo == end) {
        // No literal goes on with `c`: if one ended before it, the byte is the container's.
        if (lits[static_cast<size_t>(first)].size() != at) return;
        end_value(p);
        return step(std::move(p), c, out);
      }
      p.lo = lo, p.hi = end, p.at = static_cast<int32_t>(at + 1);
      if (end - lo == 1 && lits[static_cast<size_t>(lo)].size() == at + 1) end_value(p);  // the only one, whole
      return out.push_back(std::move(p));
    }
    case Mode::kString: {
      if (p.utf8_left > 0) {  // inside a multi-byte character
        if (c < p.utf8_lo || c > p.utf8_hi) return;
        --p.utf8_left;
        p.utf8_lo = 0x80, p.utf8_hi = 0xbf;
        return out.push_back(std::move(p));
      }
      const JsonSchema::Node* s = p.node >= 0 ? &schema_->node(p.node) : nullptr;
      if (c == '"') {
        if (s && p.chars < s->min) return;
        if (p.in_key) {
          p.in_key = false;
          p.mode = Mode::kColon;
          const JsonSchema::Node* o = top();
          p.node = o ? o->values : -1;
        } else {
          end_value(p);
        }
        return out.push_back(std::move(p));
      }
      if (c < 0x20) return;  // control characters must be escaped
      if (s && s->max >= 0 && p.chars >= s->max) return;
      ++p.chars;
      if (c == '\\') {
        p.mode = Mode::kEscape;
        return out.push_back(std::move(p));
      }
      if (c < 0x80) return out.push_back(std::move(p));
      // Strings are UTF-8 (RFC 3629): a lead byte and the range of the byte after it.
      p.utf8_lo = 0x80, p.utf8_hi = 0xbf;
      if (c >= 0xc2 && c <= 0xdf) p.utf8_left = 1;
      else if (c == 0xe0) p.utf8_left = 2, p.utf8_lo = 0xa0;
      else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) p.utf8_left = 2;
      else if (c == 0xed) p.utf8_left = 2, p.utf8_hi = 0x9f;  // (no surrogates)
      else if (c == 0xf0) p.utf8_left = 3, p.utf8_lo = 0x90;
      else if (c >= 0xf1 && c <= 0xf3) p.utf8_left = 3;
      else if (c == 0xf4) p.utf8_left = 3, p.utf8_hi = 0x8f;
      else return;  // a continuation byte without a lead, C0, C1, F5-FF
      return out.push_back(std::move(p));
    }
    case Mode::kEscape:
      if (c == 'u') {
        p.mode = Mode::kUnicode;
        p.unicode_left = 4;
        return out.push_back(std::move(p));
      }
      if (c == 0 || std::strchr("\"\\/bfnrt", c) == nullptr) return;
      p.mode = Mode::kString;
      return out.push_back(std::move(p));
    case Mode::kUnicode:
      if (!is_hex(c)) return;
      if (--p.unicode_left == 0) p.mode = Mode::kString;
      return out.push_back(std::move(p));
    case Mode::kNumber: {
      // What any reader takes: integer digits (p.chars) at most 18 for "integer" (an int64),
      // else 16, fraction digits (p.lo) at most 16, exponent digits (p.at) at most 2 (a
      // double).
      const auto next = [&](uint8_t n) {
        if (n == kInt || n == kZero) ++p.chars;
        if (n == kFrac) ++p.lo;
        if (n == kExpDigits) ++p.at;
        if (p.chars > (p.integer ? 18 : 16) || p.lo > 16 || p.at > 2) return;
        p.num = n;
        out.push_back(std::move(p));
      };
      switch (p.num) {
        case kMinus:
          if (c == '0') return next(kZero);
          if (c >= '1' && c <= '9') return next(kInt);
          return;
        case kZero:
        case kInt:
          if (p.num == kInt && is_digit(c)) return next(kInt);
          if (!p.integer && c == '.') return next(kDot);
          if (!p.integer && (c == 'e' || c == 'E')) return next(kExp);
          break;
        case kDot:
          if (is_digit(c)) return next(kFrac);
          return;
        case kFrac:
          if (is_digit(c)) return next(kFrac);
          if (c == 'e' || c == 'E') return next(kExp);
          break;
        case kExp:
          if (c == '+' || c == '-') return next(kExpSign);
          if (is_digit(c)) return next(kExpDigits);
          return;
        case kExpSign:
          if (is_digit(c)) return next(kExpDigits);
          return;
        case kExpDigits:
          if (is_digit(c)) return next(kExpDigits);
          break;
      }
      end_value(p);  // the number ended before this byte: it belongs to the container
      return step(std::move(p), c, out);
    }
  }
}

// ---- the vocabulary and the mask -----------------------------------------------------

namespace {
// The trie of ids[lo, hi) (sorted by their bytes, sharing the first `depth`) under `node`.
void build_trie(const std::vector<std::string>& bytes, const std::vector<TokenId>& ids, size_t lo, size_t hi, size_t depth,
                uint32_t node, JsonVocabulary::Trie& t) {
  const auto at = [&](size_t i) -> const std::string& { return bytes[static_cast<size_t>(ids[i])]; };
  t.nodes[node].first_token = static_cast<uint32_t>(t.tokens.size());
  for (; lo < hi && at(lo).size() == depth; ++lo) t.tokens.push_back(ids[lo]);  // end here
  t.nodes[node].tokens = static_cast<uint16_t>(t.tokens.size() - t.nodes[node].first_token);
  std::vector<std::pair<size_t, size_t>> groups;  // by the next byte
  for (size_t i = lo; i < hi;) {
    size_t end = i + 1;
    while (end < hi && at(end)[depth] == at(i)[depth]) ++end;
    groups.emplace_back(i, end);
    i = end;
  }
  const auto first = static_cast<uint32_t>(t.nodes.size());
  t.nodes[node].first_child = first;
  t.nodes[node].children = static_cast<uint16_t>(groups.size());
  for (const auto& [glo, ghi] : groups) {
    t.nodes.emplace_back();
    t.nodes.back().byte = static_cast<uint8_t>(at(glo)[depth]);
  }
  for (size_t k = 0; k < groups.size(); ++k)
    build_trie(bytes, ids, groups[k].first, groups[k].second, depth + 1, first + static_cast<uint32_t>(k), t);
}

JsonVocabulary::Trie make_trie(const std::vector<std::string>& bytes, std::vector<TokenId> ids) {
  std::sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) { return byte_less(bytes[static_cast<size_t>(a)], bytes[static_cast<size_t>(b)]); });
  JsonVocabulary::Trie t;
  t.nodes.emplace_back();
  build_trie(bytes, ids, 0, ids.size(), 0, 0, t);
  return t;
}
}  // namespace

JsonVocabulary::JsonVocabulary(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  bytes.resize(static_cast<size_t>(n));
  end_of_generation.assign(static_cast<size_t>(n), 0);
  string_content.assign(static_cast<size_t>(n), 0);
  string_chars.assign(static_cast<size_t>(n), 0);
  JsonRecognizer in_string;
  in_string.feed(std::string_view("{\"\": \""));
  std::vector<TokenId> with_bytes, not_string_content;
  for (TokenId id = 0; id < n; ++id) {
    const size_t i = static_cast<size_t>(id);
    bytes[i] = tokenizer.token_to_piece(id, /*special=*/false);
    end_of_generation[i] = tokenizer.is_end_of_generation(id) ? 1 : 0;
    // String content: what a recognizer between a string's characters takes whole and
    // leaves between characters again.
    JsonRecognizer r = in_string;
    string_content[i] = !bytes[i].empty() && bytes[i].find_first_of("\"\\") == std::string::npos && r.feed(bytes[i]) &&
                        r.between_string_characters();
    if (string_content[i])  // (UTF-8 continuation bytes are 10xxxxxx)
      string_chars[i] = static_cast<uint16_t>(std::count_if(bytes[i].begin(), bytes[i].end(), [](char c) { return (c & 0xc0) != 0x80; }));
    if (bytes[i].empty() || end_of_generation[i]) continue;
    max_bytes = std::max(max_bytes, bytes[i].size());
    with_bytes.push_back(id);
    if (!string_content[i]) not_string_content.push_back(id);
  }
  all = make_trie(bytes, std::move(with_bytes));
  not_content = make_trie(bytes, std::move(not_string_content));
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonVocabulary> vocab, std::shared_ptr<const JsonSchema> schema)
    : vocab_(std::move(vocab)),
      schema_(schema ? std::move(schema) : JsonSchema::any_object()),
      json_(schema_.get()),
      scratch_(vocab_->max_bytes + 1, json_) {}

namespace {
// Marks the tokens under trie node `node` (whose bytes, `depth` of them, `r` has taken)
// that `r` can take whole. scratch[depth] holds the recognizer one byte further (sized to
// the longest token: `r` may be scratch[depth - 1]), `spare` the readings' other buffer:
// the walk allocates nothing once they have grown.
void walk(const JsonVocabulary::Trie& t, uint32_t node, size_t depth, const JsonRecognizer& r, std::vector<uint8_t>& ok,
          std::vector<JsonRecognizer>& scratch, std::vector<JsonRecognizer::Path>& spare) {
  const JsonVocabulary::Trie::Node& n = t.nodes[node];
  for (uint32_t k = 0; k < n.tokens; ++k) ok[static_cast<size_t>(t.tokens[n.first_token + k])] = 1;  // end here: taken
  for (uint32_t c = n.first_child; c < n.first_child + n.children; ++c) {
    JsonRecognizer& next = scratch[depth];
    next = r;
    if (next.advance(t.nodes[c].byte, spare)) walk(t, c, depth + 1, next, ok, scratch, spare);
  }
}
}  // namespace

void JsonConstraint::mask(std::span<float> logits) const {
  const JsonVocabulary& v = *vocab_;
  const size_t n = std::min(logits.size(), v.bytes.size());
  std::vector<uint8_t>& ok = ok_;
  ok.assign(v.bytes.size(), 0);
  if (!json_.closed()) {  // (closed: only the end remains, no trailing whitespace)
    if (json_.between_string_characters()) {
      const int64_t room = json_.string_room();
      if (room < 0) {
        for (size_t id = 0; id < v.bytes.size(); ++id) ok[id] = v.string_content[id];
      } else {
        for (size_t id = 0; id < v.bytes.size(); ++id) ok[id] = v.string_content[id] && v.string_chars[id] <= room;
      }
      walk(v.not_content, 0, 0, json_, ok, scratch_, spare_);
    } else {
      walk(v.all, 0, 0, json_, ok, scratch_, spare_);
    }
  }
  const bool can_end = json_.complete();
  bool any = false;
  const float ban = -std::numeric_limits<float>::infinity();
  for (size_t id = 0; id < n; ++id) {
    if (v.end_of_generation[id]) ok[id] = can_end ? 1 : 0;
    any = any || ok[id];
    if (!ok[id]) logits[id] = ban;
  }
  for (size_t id = n; id < logits.size(); ++id) logits[id] = ban;
  if (!any)  // nothing can continue the value: let the model end rather than sample from nothing
    for (size_t id = 0; id < n; ++id)
      if (v.end_of_generation[id]) logits[id] = 0;
}

void JsonConstraint::accept(TokenId token) {
  if (token < 0 || static_cast<size_t>(token) >= vocab_->bytes.size()) return;
  json_.feed(vocab_->bytes[static_cast<size_t>(token)]);
}

}  // namespace kiln::llm
