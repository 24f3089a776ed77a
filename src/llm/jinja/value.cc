// Values of the chat-template interpreter (src/llm/jinja/value.h).
#include "llm/jinja/value.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "kiln/core/error.h"
#include "kiln/core/json_string.h"

namespace kiln::llm {

using detail::str_cat;

namespace jinja {

Value make(Kind k) {
  Value v;
  v.kind_ = k;
  v.data_ = std::make_shared<Value::Data>();
  return v;
}

Value callable(std::function<Value(Args&, KwArgs&)> fn) {
  Value v = make(Kind::kCallable);
  v.data_->fn = std::move(fn);
  return v;
}
}  // namespace jinja

using jinja::Kind;
using jinja::make;
using jinja::Value;

Value TemplateValue::none() { return make(Kind::kNone); }
TemplateValue::TemplateValue(bool b) : data_(std::make_shared<Data>()), kind_(Kind::kBool) { data_->b = b; }
TemplateValue::TemplateValue(int64_t i) : data_(std::make_shared<Data>()), kind_(Kind::kInt) { data_->i = i; }
TemplateValue::TemplateValue(double d) : data_(std::make_shared<Data>()), kind_(Kind::kFloat) { data_->f = d; }
TemplateValue::TemplateValue(std::string s) : data_(std::make_shared<Data>()), kind_(Kind::kString) { data_->s = std::move(s); }
Value TemplateValue::list(std::vector<Value> items) {
  Value v = make(Kind::kList);
  v.data_->list = std::move(items);
  return v;
}
Value TemplateValue::dict(std::vector<std::pair<std::string, Value>> items) {
  Value v = make(Kind::kDict);
  v.data_->dict = std::move(items);
  return v;
}

namespace {

Value from_json_value(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json_value(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), from_json_value(it.value()));
      return Value::dict(std::move(items));
    }
    default: return Value();
  }
}

}  // namespace

Value TemplateValue::from_json(std::string_view json) {
  try {
    return from_json_value(nlohmann::ordered_json::parse(json));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(std::string("template context: malformed JSON: ") + e.what());
  }
}

namespace jinja {

[[noreturn]] void fail(int line, const std::string& msg) {
  throw InvalidArgumentError(str_cat("chat template line ", line, ": ", msg));
}
[[noreturn]] void unsupported(int line, const std::string& what) {
  throw UnimplementedError(str_cat("chat template line ", line, ": ", what, " is not supported by kiln's Jinja subset"));
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.data_->b;
    case Kind::kInt: return v.data_->i != 0;
    case Kind::kFloat: return v.data_->f != 0;
    case Kind::kString: return !v.data_->s.empty();
    case Kind::kList: return !v.data_->list.empty();
    case Kind::kDict: return !v.data_->dict.empty();
    default: return true;
  }
}

bool is_number(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kFloat || v.kind() == Kind::kBool; }
double as_double(const Value& v) {
  return v.kind() == Kind::kFloat ? v.data_->f : v.kind() == Kind::kBool ? (v.data_->b ? 1 : 0) : static_cast<double>(v.data_->i);
}
int64_t as_int(const Value& v) {
  return v.kind() == Kind::kFloat ? static_cast<int64_t>(v.data_->f) : v.kind() == Kind::kBool ? v.data_->b : v.data_->i;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, p);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string repr(const Value& v);
std::string str(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.data_->b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.data_->i);
    case Kind::kFloat: return float_repr(v.data_->f);
    case Kind::kString: return v.data_->s;
    default: return repr(v);
  }
}

std::string py_quote(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out + q;
}

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Kind::kString: return py_quote(v.data_->s);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < v.data_->list.size(); ++i) out += (i ? ", " : "") + repr(v.data_->list[i]);
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < v.data_->dict.size(); ++i)
        out += (i ? ", " : "") + py_quote(v.data_->dict[i].first) + ": " + repr(v.data_->dict[i].second);
      return out + "}";
    }
    case Kind::kCallable: return "<function>";
    default: return str(v);
  }
}

// Python's json.dumps(v, ensure_ascii=False, indent=indent) (what HF's tojson does).
void to_json(std::string& out, const Value& v, int indent, int depth) {
  std::string nl, close;  // a newline and the indentation of the items / of the closing bracket
  if (indent > 0) {
    nl.assign(1, '\n').append(static_cast<size_t>(indent * (depth + 1)), ' ');
    close.assign(1, '\n').append(static_cast<size_t>(indent * depth), ' ');
  }
  const char* sep = indent > 0 ? "," : ", ";
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.data_->b ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.data_->i); return;
    case Kind::kFloat: out += float_repr(v.data_->f); return;
    case Kind::kString: append_json_string(out, v.data_->s); return;
    case Kind::kList:
      if (v.data_->list.empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.data_->list.size(); ++i) {
        if (i) out += sep;
        out += nl;
        to_json(out, v.data_->list[i], indent, depth + 1);
      }
      out += close + "]";
      return;
    case Kind::kDict:
      if (v.data_->dict.empty()) {
        out += "{}";
        return;
      }
      out += "{";
      for (size_t i = 0; i < v.data_->dict.size(); ++i) {
        if (i) out += sep;
        out += nl;
        append_json_string(out, v.data_->dict[i].first);
        out += ": ";
        to_json(out, v.data_->dict[i].second, indent, depth + 1);
      }
      out += close + "}";
      return;
    default: out += "null"; return;
  }
}

const Value* dict_find(const Value& d, std::string_view key) {
  for (const auto& [k, v] : d.data_->dict)
    if (k == key) return &v;
  return nullptr;
}

bool equal(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) return as_double(a) == as_double(b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.data_->s == b.data_->s;
    case Kind::kList:
      if (a.data_->list.size() != b.data_->list.size()) return false;
      for (size_t i = 0; i < a.data_->list.size(); ++i)
        if (!equal(a.data_->list[i], b.data_->list[i])) return false;
      return true;
    case Kind::kDict:
      if (a.data_->dict.size() != b.data_->dict.size()) return false;
      for (const auto& entry : a.data_->dict) {
        const Value* other = dict_find(b, entry.first);
        if (other == nullptr || !equal(entry.second, *other)) return false;
      }
      return true;
    default: return a.data_ == b.data_;
  }
}



}  // namespace jinja
}  // namespace kiln::llm
