// A Jinja interpreter for chat templates: lexer (with trim_blocks / lstrip_blocks and
// whitespace control), recursive-descent parser to an AST, tree-walking evaluator.
// Semantics follow Jinja2 as Hugging Face's apply_chat_template configures it.
#include "kiln/llm/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>

#include "kiln/core/error.h"

namespace kiln::llm {

using detail::str_cat;

// ---- values -------------------------------------------------------------------------

struct Macro;
struct TemplateValue::Data {
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<TemplateValue> list;
  std::vector<std::pair<std::string, TemplateValue>> dict;
  bool is_namespace = false;
  std::function<TemplateValue(std::vector<TemplateValue>&, std::vector<std::pair<std::string, TemplateValue>>&)> fn;
};

namespace {
using Value = TemplateValue;
using Kind = TemplateValue::Kind;
using Args = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;
constexpr Kind kCallable = Kind::kCallable;

Value make(Kind k) {
  Value v;
  v.kind_ = k;
  v.data_ = std::make_shared<Value::Data>();
  return v;
}

Value callable(std::function<Value(Args&, KwArgs&)> fn) {
  Value v = make(kCallable);
  v.data_->fn = std::move(fn);
  return v;
}
}  // namespace

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

namespace {

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
    case kCallable: return "<function>";
    default: return str(v);
  }
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// Python's json.dumps(v, ensure_ascii=False, indent=indent) (what HF's tojson does).
void to_json(std::string& out, const Value& v, int indent, int depth) {
  const std::string nl = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string close = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const char* sep = indent > 0 ? "," : ", ";
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.data_->b ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.data_->i); return;
    case Kind::kFloat: out += float_repr(v.data_->f); return;
    case Kind::kString: json_string(out, v.data_->s); return;
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
        json_string(out, v.data_->dict[i].first);
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


// ---- lexer --------------------------------------------------------------------------

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };
struct Token {
  Tok type;
  std::string text;
  int line;
};

std::vector<Token> tokenize_expr(std::string_view s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\n') ++line;
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Tok::kName, std::string(s.substr(i, j - i)), line});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_' ||
                              (s[j] == '.' && j + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        is_float |= s[j] == '.';
        ++j;
      }
      out.push_back({is_float ? Tok::kFloat : Tok::kInt, std::string(s.substr(i, j - i)), line});
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          switch (e) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            default: v += '\\', v += e;
          }
        } else {
          if (s[j] == '\n') ++line;
          v += s[j];
        }
      }
      if (j >= s.size()) fail(line, "unterminated string");
      out.push_back({Tok::kString, v, line});
      i = j + 1;
      continue;
    }
    static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "(", ")",
                                      "[", "]", "{", "}", ".", ",", ":", "|", "="};
    bool matched = false;
    for (const char* op : ops) {
      const size_t n = std::strlen(op);
      if (s.substr(i, n) == op) {
        out.push_back({Tok::kOp, op, line});
        i += n;
        matched = true;
        break;
      }
    }
    if (!matched) fail(line, str_cat("unexpected character '", c, "'"));
  }
  out.push_back({Tok::kEnd, "", line});
  return out;
}

// ---- AST ----------------------------------------------------------------------------

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum class T { kLiteral, kName, kList, kDict, kTuple, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kUnary, kBinary, kCond } t;
  int line = 0;
  Value literal;
  std::string name, op;  // name: variable / attribute / filter / test; op: operator
  std::vector<ExprP> items;  // list/tuple items, dict keys and values interleaved, call args
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP a, b, c;  // operands: object, index, ...
  bool negate = false;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;
struct Node {
  enum class T { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kNoop } t;
  int line = 0;
  std::string text;
  ExprP expr;                                      // output / set value / for iterable
  std::vector<std::pair<ExprP, Body>> branches;     // if / elif (cond, body); else: null cond
  std::vector<std::string> targets;                 // for / set names (set ns.attr: "ns", attr in name)
  std::string attr;                                 // set ns.attr
  ExprP filter;                                     // for ... if cond
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro parameters with defaults
};

class Parser {
 public:
  Parser(std::vector<Token> toks) : t_(std::move(toks)) {}
  const Token& peek(size_t k = 0) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool at_end() const { return peek().type == Tok::kEnd; }
  bool is_op(const char* op) const { return peek().type == Tok::kOp && peek().text == op; }
  bool is_name(const char* n) const { return peek().type == Tok::kName && peek().text == n; }
  Token next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(peek().line, str_cat("expected '", op, "', got '", peek().text, "'"));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) fail(peek().line, str_cat("expected a name, got '", peek().text, "'"));
    return next().text;
  }

  ExprP node(Expr::T t) {
    auto e = std::make_unique<Expr>();
    e->t = t;
    e->line = peek().line;
    return e;
  }

  ExprP expression() { return conditional(); }
  ExprP conditional() {
    ExprP e = or_expr();
    while (is_name("if")) {
      next();
      auto c = node(Expr::T::kCond);
      c->b = or_expr();
      c->a = std::move(e);
      if (is_name("else")) {
        next();
        c->c = or_expr();
      }
      e = std::move(c);
    }
    return e;
  }
  ExprP binary(ExprP l, const std::string& op, ExprP r) {
    auto e = node(Expr::T::kBinary);
    e->op = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) next(), e = binary(std::move(e), "or", and_expr());
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) next(), e = binary(std::move(e), "and", not_expr());
    return e;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      next();
      auto e = node(Expr::T::kUnary);
      e->op = "not";
      e->a = not_expr();
      return e;
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = concat();
    for (;;) {
      if (peek().type == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
                                      peek().text == "<=" || peek().text == ">=")) {
        const std::string op = next().text;
        e = binary(std::move(e), op, concat());
      } else if (is_name("in")) {
        next();
        e = binary(std::move(e), "in", concat());
      } else if (is_name("not") && peek(1).type == Tok::kName && peek(1).text == "in") {
        next(), next();
        e = binary(std::move(e), "not in", concat());
      } else {
        return e;
      }
    }
  }
  ExprP concat() {
    ExprP e = math1();
    while (is_op("~")) next(), e = binary(std::move(e), "~", math1());
    return e;
  }
  ExprP math1() {
    ExprP e = math2();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      e = binary(std::move(e), op, math2());
    }
    return e;
  }
  ExprP math2() {
    ExprP e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      e = binary(std::move(e), op, power());
    }
    return e;
  }
  ExprP power() {
    ExprP e = unary();
    while (is_op("**")) next(), e = binary(std::move(e), "**", unary());
    return e;
  }
  ExprP unary() {
    if (is_op("-") || is_op("+")) {
      const std::string op = next().text;
      auto e = node(Expr::T::kUnary);
      e->op = op;
      e->a = unary();
      return e;
    }
    ExprP e = postfix(primary());
    // Filters, then tests.
    for (;;) {
      if (is_op("|")) {
        next();
        auto f = node(Expr::T::kFilter);
        f->name = expect_name();
        while (is_op(".")) next(), f->name += "." + expect_name();
        f->a = std::move(e);
        if (is_op("(")) call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = node(Expr::T::kTest);
        if (is_name("not")) next(), t->negate = true;
        t->name = expect_name();
        t->a = std::move(e);
        if (is_op("(")) {
          call_args(*t);
        } else if (peek().type == Tok::kString || peek().type == Tok::kInt || peek().type == Tok::kFloat ||
                   (peek().type == Tok::kName && !is_name("and") && !is_name("or") && !is_name("else") && !is_name("if") &&
                    !is_name("in") && !is_name("not"))) {
          t->items.push_back(postfix(primary()));  // `is equalto 'x'`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().type == Tok::kName && peek(1).type == Tok::kOp && peek(1).text == "=") {
        std::string k = next().text;
        next();
        e.kwargs.emplace_back(std::move(k), expression());
      } else {
        e.items.push_back(expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    expect_op(")");
  }
  ExprP postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        next();
        auto a = node(Expr::T::kAttr);
        a->name = peek().type == Tok::kInt ? next().text : expect_name();
        a->a = std::move(e);
        e = std::move(a);
      } else if (is_op("[")) {
        next();
        ExprP start, stop, step;
        bool slice = false;
        if (!is_op(":")) start = expression();
        if (is_op(":")) {
          slice = true;
          next();
          if (!is_op("]") && !is_op(":")) stop = expression();
          if (is_op(":")) {
            next();
            if (!is_op("]")) step = expression();
          }
        }
        expect_op("]");
        auto x = node(slice ? Expr::T::kSlice : Expr::T::kIndex);
        x->a = std::move(e);
        x->b = std::move(start);
        x->c = std::move(stop);
        if (step) x->items.push_back(std::move(step));
        e = std::move(x);
      } else if (is_op("(")) {
        auto c = node(Expr::T::kCall);
        c->a = std::move(e);
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprP primary() {
    const Token tk = peek();
    if (tk.type == Tok::kString) {
      std::string s;
      while (peek().type == Tok::kString) s += next().text;  // adjacent literals concatenate
      auto e = node(Expr::T::kLiteral);
      e->literal = Value(s);
      return e;
    }
    if (tk.type == Tok::kInt || tk.type == Tok::kFloat) {
      next();
      auto e = node(Expr::T::kLiteral);
      std::string digits = tk.text;
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      e->literal = tk.type == Tok::kInt ? Value(static_cast<int64_t>(std::stoll(digits))) : Value(std::stod(digits));
      return e;
    }
    if (tk.type == Tok::kName) {
      next();
      auto e = node(Expr::T::kLiteral);
      if (tk.text == "true" || tk.text == "True") e->literal = Value(true);
      else if (tk.text == "false" || tk.text == "False") e->literal = Value(false);
      else if (tk.text == "none" || tk.text == "None") e->literal = Value::none();
      else {
        e->t = Expr::T::kName;
        e->name = tk.text;
      }
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return node(Expr::T::kTuple);
      }
      ExprP first = expression();
      if (is_op(",")) {
        auto t = node(Expr::T::kTuple);
        t->items.push_back(std::move(first));
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          t->items.push_back(expression());
        }
        expect_op(")");
        return t;
      }
      expect_op(")");
      return first;
    }
    if (is_op("[")) {
      next();
      auto l = node(Expr::T::kList);
      while (!is_op("]")) {
        l->items.push_back(expression());
        if (!is_op("]")) expect_op(",");
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      next();
      auto d = node(Expr::T::kDict);
      while (!is_op("}")) {
        d->items.push_back(expression());
        expect_op(":");
        d->items.push_back(expression());
        if (!is_op("}")) expect_op(",");
      }
      expect_op("}");
      return d;
    }
    fail(tk.line, str_cat("unexpected '", tk.text.empty() ? "end of expression" : tk.text, "'"));
  }

 private:
  std::vector<Token> t_;
  size_t pos_ = 0;
};

// ---- template structure ---------------------------------------------------------------

struct Piece {
  enum class K { kText, kExpr, kStmt } k;
  std::string text;
  int line;
};

// Splits the source into text, {{ }} and {% %} pieces, applying whitespace control and
// trim_blocks / lstrip_blocks as Jinja's lexer does; comments disappear.
std::vector<Piece> split_source(std::string_view src) {
  std::vector<Piece> out;
  size_t i = 0;
  int line = 1;
  bool trim_newline = false, strip_all = false;
  bool line_starting = true;  // the text to come starts a line (Jinja's lexer state)
  auto count_lines = [](std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); };
  for (;;) {
    size_t open = i;
    for (;;) {
      open = src.find('{', open);
      if (open == std::string_view::npos || open + 1 >= src.size()) {
        open = std::string_view::npos;
        break;
      }
      const char k = src[open + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++open;
    }
    const std::string_view raw = src.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    std::string text(raw);
    if (strip_all) {
      const size_t keep = text.find_first_not_of(" \t\r\n");
      const std::string_view gone(text.data(), keep == std::string::npos ? text.size() : keep);
      line_starting = !gone.empty() ? gone.back() == '\n' : line_starting;
      text.erase(0, gone.size());
    } else if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      line_starting = true;
    }
    strip_all = trim_newline = false;
    const int text_line = line;
    line += count_lines(raw);
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Piece::K::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    // The closing delimiter, skipping string literals inside the tag ({{ '}}' }}).
    size_t end = std::string_view::npos;
    if (kind == '#') {
      end = src.find(close, open + 2);
    } else {
      char quote = 0;
      for (size_t k = open + 2; k + 1 < src.size(); ++k) {
        const char c = src[k];
        if (quote) {
          if (c == '\\') ++k;
          else if (c == quote) quote = 0;
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (src.compare(k, 2, close) == 0) {
          end = k;
          break;
        }
      }
    }
    if (end == std::string_view::npos) fail(line, str_cat("'", src.substr(open, 2), "' is never closed"));
    std::string_view inner = src.substr(open + 2, end - open - 2);
    bool strip_before = false, keep_before = false, strip_after = false;
    if (!inner.empty() && inner[0] == '-') strip_before = true, inner.remove_prefix(1);
    else if (!inner.empty() && inner[0] == '+') keep_before = true, inner.remove_prefix(1);
    if (!inner.empty() && inner.back() == '-') strip_after = true, inner.remove_suffix(1);
    else if (!inner.empty() && inner.back() == '+') inner.remove_suffix(1);
    if (strip_before) {
      const size_t keep = text.find_last_not_of(" \t\r\n");
      text.erase(keep == std::string::npos ? 0 : keep + 1);
    } else if (kind != '{' && !keep_before) {
      // lstrip_blocks: blanks from the start of the line up to a block tag go.
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || line_starting) && text.find_first_not_of(" \t", from) == std::string::npos) text.erase(from);
    }
    if (!text.empty()) out.push_back({Piece::K::kText, text, text_line});
    if (kind == '{') out.push_back({Piece::K::kExpr, std::string(inner), line});
    else if (kind == '%') out.push_back({Piece::K::kStmt, std::string(inner), line});
    line += count_lines(src.substr(open, end + 2 - open));
    line_starting = false;
    if (strip_after) strip_all = true;
    else if (kind != '{') trim_newline = true;  // trim_blocks
    i = end + 2;
  }
  return out;
}

// Builds the statement tree from the pieces.
class TreeBuilder {
 public:
  explicit TreeBuilder(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  Body parse_all() {
    std::string stop;
    Body b = parse_body({}, &stop);
    if (!stop.empty()) fail(line_, "'" + stop + "' without its opening tag");
    return b;
  }

 private:
  // Parses until one of `ends` (statement keywords); *stop gets the one found ("" at the end).
  Body parse_body(const std::vector<std::string>& ends, std::string* stop, Parser** stop_parser = nullptr) {
    Body body;
    while (i_ < p_.size()) {
      const Piece& pc = p_[i_++];
      line_ = pc.line;
      if (pc.k == Piece::K::kText) {
        auto n = std::make_unique<Node>();
        n->t = Node::T::kText;
        n->text = pc.text;
        body.push_back(std::move(n));
        continue;
      }
      auto parser = std::make_unique<Parser>(tokenize_expr(pc.text, pc.line));
      if (pc.k == Piece::K::kExpr) {
        auto n = std::make_unique<Node>();
        n->t = Node::T::kOutput;
        n->line = pc.line;
        n->expr = parser->expression();
        if (!parser->at_end()) fail(pc.line, "unexpected '" + parser->peek().text + "' in {{ }}");
        body.push_back(std::move(n));
        continue;
      }
      const std::string kw = parser->expect_name();
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        *stop = kw;
        held_ = std::move(parser);
        if (stop_parser) *stop_parser = held_.get();
        return body;
      }
      body.push_back(statement(kw, *parser, pc.line));
    }
    *stop = "";
    if (!ends.empty()) fail(line_, "missing '{% " + ends.back() + " %}'");
    return body;
  }

  std::unique_ptr<Node> statement(const std::string& kw, Parser& ps, int line) {
    for (const char* end : {"endif", "elif", "else", "endfor", "endset", "endmacro", "endgeneration"})
      if (kw == end) fail(line, "'" + kw + "' without its opening tag");
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string stop;
    if (kw == "if") {
      n->t = Node::T::kIf;
      ExprP cond = ps.expression();
      for (;;) {
        Parser* next = nullptr;
        Body b = parse_body({"elif", "else", "endif"}, &stop, &next);
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (stop == "elif") {
          cond = next->expression();
        } else if (stop == "else") {
          Body e = parse_body({"endif"}, &stop);
          n->branches.emplace_back(nullptr, std::move(e));
          break;
        } else {
          break;
        }
      }
      return n;
    }
    if (kw == "for") {
      n->t = Node::T::kFor;
      n->targets.push_back(ps.expect_name());
      while (ps.is_op(",")) ps.next(), n->targets.push_back(ps.expect_name());
      if (!ps.is_name("in")) fail(line, "expected 'in' in {% for %}");
      ps.next();
      n->expr = ps.or_expr();
      if (ps.is_name("if")) ps.next(), n->filter = ps.expression();
      if (ps.is_name("recursive")) unsupported(line, "a recursive for loop");
      n->body = parse_body({"else", "endfor"}, &stop);
      if (stop == "else") n->else_body = parse_body({"endfor"}, &stop);
      return n;
    }
    if (kw == "set") {
      n->targets.push_back(ps.expect_name());
      if (ps.is_op(".")) ps.next(), n->attr = ps.expect_name();
      while (ps.is_op(",")) ps.next(), n->targets.push_back(ps.expect_name());
      if (ps.is_op("=")) {
        ps.next();
        n->t = Node::T::kSet;
        n->expr = ps.expression();
      } else {
        n->t = Node::T::kSetBlock;
        n->body = parse_body({"endset"}, &stop);
      }
      return n;
    }
    if (kw == "macro") {
      n->t = Node::T::kMacro;
      n->targets.push_back(ps.expect_name());
      ps.expect_op("(");
      while (!ps.is_op(")")) {
        std::string name = ps.expect_name();
        ExprP def;
        if (ps.is_op("=")) ps.next(), def = ps.expression();
        n->params.emplace_back(std::move(name), std::move(def));
        if (!ps.is_op(")")) ps.expect_op(",");
      }
      ps.expect_op(")");
      n->body = parse_body({"endmacro"}, &stop);
      return n;
    }
    if (kw == "generation") {  // Hugging Face's assistant-mask marker: renders its body
      n->t = Node::T::kIf;
      auto yes = std::make_unique<Expr>();
      yes->t = Expr::T::kLiteral;
      yes->literal = Value(true);
      n->branches.emplace_back(std::move(yes), parse_body({"endgeneration"}, &stop));
      return n;
    }
    unsupported(line, "{% " + kw + " %}");
  }

  std::vector<Piece> p_;
  size_t i_ = 0;
  int line_ = 1;
  std::unique_ptr<Parser> held_;  // the parser of the last closing tag (elif's condition)
};

// ---- evaluation ---------------------------------------------------------------------

struct Scope {
  std::vector<std::vector<std::pair<std::string, Value>>> frames;
  Value* find(const std::string& name) {
    for (auto f = frames.rbegin(); f != frames.rend(); ++f)
      for (auto& [k, v] : *f)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : frames.back())
      if (k == name) {
        old = std::move(v);
        return;
      }
    frames.back().emplace_back(name, std::move(v));
  }
};

class Evaluator {
 public:
  Evaluator(Scope& scope) : sc_(scope) {}

  void run(const Body& body, std::string& out) {
    for (const auto& n : body) exec(*n, out);
  }

  Value eval(const Expr& e);

 private:
  void exec(const Node& n, std::string& out);
  Value call(const Expr& e);
  Value attr(const Value& obj, const std::string& name, int line);
  Value index(const Value& obj, const Value& key, int line);
  Value method(const Value& obj, const std::string& name, Args& args, int line);
  Value filter(const std::string& name, const Value& v, Args& args, KwArgs& kw, int line);
  bool test(const std::string& name, const Value& v, Args& args, int line);
  Value binop(const std::string& op, const Value& a, const Value& b, int line);
  std::vector<Value> iterate(const Value& v, int line);

  Scope& sc_;
};

std::vector<Value> Evaluator::iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Kind::kList: return v.data_->list;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : v.data_->dict) keys.emplace_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (size_t i = 0; i < v.data_->s.size();) {
        const auto c = static_cast<unsigned char>(v.data_->s[i]);
        const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        chars.emplace_back(v.data_->s.substr(i, n));
        i += n;
      }
      return chars;
    }
    case Kind::kUndefined:
    case Kind::kNone: return {};
    default: fail(line, "cannot iterate over " + repr(v));
  }
}

Value Evaluator::attr(const Value& obj, const std::string& name, int line) {
  if (obj.kind() == Kind::kDict) {
    if (const Value* v = dict_find(obj, name)) return *v;
    return Value();
  }
  if (obj.kind() == Kind::kList && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
    return index(obj, Value(static_cast<int64_t>(std::stoll(name))), line);
  return Value();  // lenient: undefined (methods are resolved by call())
}

Value Evaluator::index(const Value& obj, const Value& key, int line) {
  if (obj.kind() == Kind::kList || obj.kind() == Kind::kString) {
    if (key.kind() != Kind::kInt) fail(line, "list indices must be integers, got " + repr(key));
    const int64_t n = obj.kind() == Kind::kList ? static_cast<int64_t>(obj.data_->list.size()) : static_cast<int64_t>(obj.data_->s.size());
    int64_t i = key.data_->i < 0 ? key.data_->i + n : key.data_->i;
    if (i < 0 || i >= n) return Value();
    return obj.kind() == Kind::kList ? obj.data_->list[static_cast<size_t>(i)] : Value(obj.data_->s.substr(static_cast<size_t>(i), 1));
  }
  if (obj.kind() == Kind::kDict) {
    if (key.kind() != Kind::kString) return Value();
    if (const Value* v = dict_find(obj, key.data_->s)) return *v;
    return Value();
  }
  return Value();
}

Value Evaluator::binop(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return Value(equal(a, b));
  if (op == "!=") return Value(!equal(a, b));
  if (op == "~") return Value(str(a) + str(b));
  if (op == "in" || op == "not in") {
    bool r = false;
    if (b.kind() == Kind::kString) r = a.kind() == Kind::kString && b.data_->s.find(a.data_->s) != std::string::npos;
    else if (b.kind() == Kind::kList) r = std::any_of(b.data_->list.begin(), b.data_->list.end(), [&](const Value& x) { return equal(a, x); });
    else if (b.kind() == Kind::kDict) r = a.kind() == Kind::kString && dict_find(b, a.data_->s) != nullptr;
    else if (b.kind() != Kind::kUndefined && b.kind() != Kind::kNone) fail(line, "'in' needs a string, list or dict on its right");
    return Value(op == "in" ? r : !r);
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int c;
    if (is_number(a) && is_number(b)) c = as_double(a) < as_double(b) ? -1 : as_double(a) > as_double(b) ? 1 : 0;
    else if (a.kind() == Kind::kString && b.kind() == Kind::kString) c = a.data_->s.compare(b.data_->s);
    else fail(line, "cannot compare " + repr(a) + " and " + repr(b));
    return Value(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
  }
  if (op == "+") {
    if (a.kind() == Kind::kString && b.kind() == Kind::kString) return Value(a.data_->s + b.data_->s);
    if (a.kind() == Kind::kList && b.kind() == Kind::kList) {
      std::vector<Value> l = a.data_->list;
      l.insert(l.end(), b.data_->list.begin(), b.data_->list.end());
      return Value::list(std::move(l));
    }
  }
  if (op == "*" && a.kind() == Kind::kString && b.kind() == Kind::kInt) {
    std::string r;
    for (int64_t k = 0; k < b.data_->i; ++k) r += a.data_->s;
    return Value(r);
  }
  if (!is_number(a) || !is_number(b)) fail(line, "unsupported operands for '" + op + "': " + repr(a) + " and " + repr(b));
  const bool ints = a.kind() != Kind::kFloat && b.kind() != Kind::kFloat;
  const double x = as_double(a), y = as_double(b);
  if (op == "+") return ints ? Value(as_int(a) + as_int(b)) : Value(x + y);
  if (op == "-") return ints ? Value(as_int(a) - as_int(b)) : Value(x - y);
  if (op == "*") return ints ? Value(as_int(a) * as_int(b)) : Value(x * y);
  if (op == "/") {
    if (y == 0) fail(line, "division by zero");
    return Value(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) fail(line, "division by zero");
    if (ints) {
      const int64_t p = as_int(a), q = as_int(b);
      int64_t d = p / q, m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) --d, m += q;  // Python floors
      return op == "//" ? Value(d) : Value(m);
    }
    return op == "//" ? Value(std::floor(x / y)) : Value(x - std::floor(x / y) * y);
  }
  if (op == "**") return ints && as_int(b) >= 0 ? Value(static_cast<int64_t>(std::llround(std::pow(x, y)))) : Value(std::pow(x, y));
  fail(line, "unknown operator " + op);
}

Value Evaluator::eval(const Expr& e) {
  switch (e.t) {
    case Expr::T::kLiteral: return e.literal;
    case Expr::T::kName: {
      if (Value* v = sc_.find(e.name)) return *v;
      return Value();
    }
    case Expr::T::kList:
    case Expr::T::kTuple: {
      std::vector<Value> items;
      for (const auto& x : e.items) items.push_back(eval(*x));
      return Value::list(std::move(items));
    }
    case Expr::T::kDict: {
      std::vector<std::pair<std::string, Value>> items;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        const Value k = eval(*e.items[i]);
        if (k.kind() != Kind::kString) fail(e.line, "dict keys must be strings here");
        items.emplace_back(k.data_->s, eval(*e.items[i + 1]));
      }
      return Value::dict(std::move(items));
    }
    case Expr::T::kAttr: return attr(eval(*e.a), e.name, e.line);
    case Expr::T::kIndex: return index(eval(*e.a), eval(*e.b), e.line);
    case Expr::T::kSlice: {
      const Value obj = eval(*e.a);
      const int64_t n = obj.kind() == Kind::kList ? static_cast<int64_t>(obj.data_->list.size())
                        : obj.kind() == Kind::kString ? static_cast<int64_t>(obj.data_->s.size())
                                                      : -1;
      if (n < 0) fail(e.line, "cannot slice " + repr(obj));
      const int64_t step = e.items.empty() ? 1 : as_int(eval(*e.items[0]));
      if (step == 0) fail(e.line, "slice step cannot be zero");
      auto clamp = [&](const ExprP& x, int64_t dflt) {
        if (!x) return dflt;
        int64_t v = as_int(eval(*x));
        if (v < 0) v += n;
        return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
      };
      const int64_t start = clamp(e.b, step > 0 ? 0 : n - 1), stop = clamp(e.c, step > 0 ? n : -1);
      if (obj.kind() == Kind::kList) {
        std::vector<Value> out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(obj.data_->list[static_cast<size_t>(i)]);
        return Value::list(std::move(out));
      }
      std::string out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out += obj.data_->s[static_cast<size_t>(i)];
      return Value(out);
    }
    case Expr::T::kCall: return call(e);
    case Expr::T::kFilter: {
      Value v = eval(*e.a);
      Args args;
      for (const auto& x : e.items) args.push_back(eval(*x));
      KwArgs kw;
      for (const auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
      return filter(e.name, v, args, kw, e.line);
    }
    case Expr::T::kTest: {
      Value v = eval(*e.a);
      Args args;
      for (const auto& x : e.items) args.push_back(eval(*x));
      return Value(test(e.name, v, args, e.line) != e.negate);
    }
    case Expr::T::kUnary: {
      const Value v = eval(*e.a);
      if (e.op == "not") return Value(!truthy(v));
      if (!is_number(v)) fail(e.line, "unary " + e.op + " needs a number");
      if (e.op == "+") return v;
      return v.kind() == Kind::kFloat ? Value(-v.data_->f) : Value(-as_int(v));
    }
    case Expr::T::kBinary: {
      if (e.op == "and") {
        Value l = eval(*e.a);
        return truthy(l) ? eval(*e.b) : l;
      }
      if (e.op == "or") {
        Value l = eval(*e.a);
        return truthy(l) ? l : eval(*e.b);
      }
      return binop(e.op, eval(*e.a), eval(*e.b), e.line);
    }
    case Expr::T::kCond: return truthy(eval(*e.b)) ? eval(*e.a) : (e.c ? eval(*e.c) : Value());
  }
  return Value();
}

Value Evaluator::call(const Expr& e) {
  Args args;
  for (const auto& x : e.items) args.push_back(eval(*x));
  KwArgs kw;
  for (const auto& [k, x] : e.kwargs) kw.emplace_back(k, eval(*x));
  if (e.a->t == Expr::T::kAttr) {
    const Value obj = eval(*e.a->a);
    if (obj.kind() == Kind::kDict && !obj.data_->is_namespace) {
      if (const Value* f = dict_find(obj, e.a->name); f && f->kind() == kCallable) return f->data_->fn(args, kw);
    }
    return method(obj, e.a->name, args, e.line);
  }
  const Value f = eval(*e.a);
  if (f.kind() != kCallable) {
    if (e.a->t == Expr::T::kName) fail(e.line, "'" + e.a->name + "' is undefined or not callable");
    fail(e.line, "calling something that is not a function");
  }
  return f.data_->fn(args, kw);
}

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right) while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}
const std::string kWhitespace = " \t\n\r\f\v";

Value Evaluator::method(const Value& obj, const std::string& name, Args& args, int line) {
  if (obj.kind() == Kind::kString) {
    const std::string& s = obj.data_->s;
    const std::string chars = !args.empty() && args[0].kind() == Kind::kString ? args[0].data_->s : kWhitespace;
    if (name == "strip") return Value(strip_chars(s, chars, true, true));
    if (name == "lstrip") return Value(strip_chars(s, chars, true, false));
    if (name == "rstrip") return Value(strip_chars(s, chars, false, true));
    if (name == "upper" || name == "lower") {
      std::string r = s;
      for (char& c : r) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
      return Value(r);
    }
    if (name == "startswith" || name == "endswith") {
      if (args.empty() || args[0].kind() != Kind::kString) fail(line, name + "() needs a string");
      const std::string& x = args[0].data_->s;
      return Value(name == "startswith" ? s.rfind(x, 0) == 0 : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
    }
    if (name == "split") {
      std::vector<Value> parts;
      if (args.empty() || args[0].kind() != Kind::kString) {
        size_t i = 0;
        while (i < s.size()) {
          while (i < s.size() && kWhitespace.find(s[i]) != std::string::npos) ++i;
          size_t j = i;
          while (j < s.size() && kWhitespace.find(s[j]) == std::string::npos) ++j;
          if (j > i) parts.emplace_back(s.substr(i, j - i));
          i = j;
        }
      } else {
        const std::string& sep = args[0].data_->s;
        if (sep.empty()) fail(line, "split() with an empty separator");
        size_t i = 0;
        for (size_t hit; (hit = s.find(sep, i)) != std::string::npos; i = hit + sep.size()) parts.emplace_back(s.substr(i, hit - i));
        parts.emplace_back(s.substr(i));
      }
      return Value::list(std::move(parts));
    }
    if (name == "replace") {
      Args a = args;
      KwArgs none;
      return filter("replace", obj, a, none, line);
    }
    if (name == "title" || name == "capitalize") {
      Args a;
      KwArgs none;
      return filter(name, obj, a, none, line);
    }
  }
  if (obj.kind() == Kind::kDict) {
    if (name == "items") {
      std::vector<Value> out;
      for (const auto& [k, v] : obj.data_->dict) out.push_back(Value::list({Value(k), v}));
      return Value::list(std::move(out));
    }
    if (name == "keys" || name == "values") {
      std::vector<Value> out;
      for (const auto& [k, v] : obj.data_->dict) out.push_back(name == "keys" ? Value(k) : v);
      return Value::list(std::move(out));
    }
    if (name == "get") {
      if (args.empty() || args[0].kind() != Kind::kString) fail(line, "get() needs a key");
      if (const Value* v = dict_find(obj, args[0].data_->s)) return *v;
      return args.size() > 1 ? args[1] : Value::none();
    }
  }
  if (obj.kind() == Kind::kList && name == "append") unsupported(line, "list.append (templates cannot change values)");
  unsupported(line, "the method '" + name + "' on " + (obj.is_undefined() ? std::string("an undefined value") : repr(obj)));
}

Value kwarg(KwArgs& kw, Args& args, size_t pos, const char* name, Value dflt) {
  for (auto& [k, v] : kw)
    if (k == name) return v;
  return pos < args.size() ? args[pos] : dflt;
}

Value Evaluator::filter(const std::string& name, const Value& v, Args& args, KwArgs& kw, int line) {
  if (name == "trim") return Value(strip_chars(str(v), kWhitespace, true, true));
  if (name == "tojson") {
    const Value ind = kwarg(kw, args, 0, "indent", Value::none());
    std::string out;
    to_json(out, v, ind.kind() == Kind::kInt ? static_cast<int>(ind.data_->i) : 0, 0);
    return Value(out);
  }
  if (name == "length" || name == "count") {
    if (v.kind() == Kind::kString) return Value(static_cast<int64_t>(iterate(v, line).size()));
    if (v.kind() == Kind::kList) return Value(static_cast<int64_t>(v.data_->list.size()));
    if (v.kind() == Kind::kDict) return Value(static_cast<int64_t>(v.data_->dict.size()));
    return Value(int64_t{0});
  }
  if (name == "upper" || name == "lower") {
    Args none;
    return method(Value(str(v)), name, none, line);
  }
  if (name == "capitalize" || name == "title") {
    std::string s = str(v);
    bool start = true;
    for (char& c : s) {
      const bool alpha = std::isalpha(static_cast<unsigned char>(c));
      if (name == "capitalize") c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
      else c = static_cast<char>(start && alpha ? std::toupper(static_cast<unsigned char>(c)) : alpha ? std::tolower(static_cast<unsigned char>(c)) : c);
      start = name == "capitalize" ? false : !alpha;
    }
    return Value(s);
  }
  if (name == "replace") {
    if (args.size() < 2 || args[0].kind() != Kind::kString || args[1].kind() != Kind::kString) fail(line, "replace needs two strings");
    std::string s = str(v);
    const std::string& from = args[0].data_->s;
    const std::string& to = args[1].data_->s;
    if (from.empty()) return Value(s);
    std::string out;
    size_t i = 0;
    for (size_t hit; (hit = s.find(from, i)) != std::string::npos; i = hit + from.size()) out += s.substr(i, hit - i) + to;
    return Value(out + s.substr(i));
  }
  if (name == "default" || name == "d") {
    const bool boolean = truthy(kwarg(kw, args, 1, "boolean", Value(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return args.empty() ? Value("") : args[0];
    return v;
  }
  if (name == "join") {
    const std::string sep = args.empty() ? "" : str(args[0]);
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v, line)) {
      if (!first) out += sep;
      out += str(x);
      first = false;
    }
    return Value(out);
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = iterate(v, line);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(iterate(v, line));
  if (name == "items") {
    Args none;
    return method(v, "items", none, line);
  }
  if (name == "string") return Value(str(v));
  if (name == "safe" || name == "e" || name == "escape") return name == "safe" ? v : Value(str(v));
  if (name == "int") return v.kind() == Kind::kString ? Value(static_cast<int64_t>(std::strtoll(v.data_->s.c_str(), nullptr, 10))) : Value(as_int(v));
  if (name == "float") return v.kind() == Kind::kString ? Value(std::strtod(v.data_->s.c_str(), nullptr)) : Value(as_double(v));
  if (name == "abs") return v.kind() == Kind::kFloat ? Value(std::fabs(v.data_->f)) : Value(static_cast<int64_t>(std::llabs(as_int(v))));
  if (name == "round") return Value(std::round(as_double(v)));
  if (name == "reverse" || name == "sort" || name == "unique") {
    std::vector<Value> items = iterate(v, line);
    if (name == "reverse") std::reverse(items.begin(), items.end());
    if (name == "sort")
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) { return truthy(binop("<", a, b, line)); });
    if (name == "unique") {
      std::vector<Value> u;
      for (const Value& x : items)
        if (std::none_of(u.begin(), u.end(), [&](const Value& y) { return equal(x, y); })) u.push_back(x);
      items = std::move(u);
    }
    if (v.kind() == Kind::kString && name == "reverse") {
      std::string s;
      for (const Value& x : items) s += x.data_->s;
      return Value(s);
    }
    return Value::list(std::move(items));
  }
  if (name == "indent") {
    const int64_t width = as_int(kwarg(kw, args, 0, "width", Value(int64_t{4})));
    const bool first = truthy(kwarg(kw, args, 1, "first", Value(false)));
    const std::string pad(static_cast<size_t>(std::max<int64_t>(0, width)), ' ');
    std::string s = str(v), out = first ? pad : "";
    for (size_t i = 0; i < s.size(); ++i) {
      out += s[i];
      if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') out += pad;
    }
    return Value(out);
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject" || name == "map") {
    std::vector<Value> out;
    const bool on_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "selectattr" || name == "select";
    if (name == "map") {
      const Value a = kwarg(kw, args, 99, "attribute", Value());
      for (const Value& x : iterate(v, line)) {
        if (a.kind() == Kind::kString) {
          out.push_back(attr(x, a.data_->s, line));
        } else {
          if (args.empty() || args[0].kind() != Kind::kString) fail(line, "map needs a filter name or attribute=");
          Args rest(args.begin() + 1, args.end());
          KwArgs none;
          out.push_back(filter(args[0].data_->s, x, rest, none, line));
        }
      }
      return Value::list(std::move(out));
    }
    const size_t base = on_attr ? 1 : 0;
    if (on_attr && (args.empty() || args[0].kind() != Kind::kString)) fail(line, name + " needs an attribute name");
    for (const Value& x : iterate(v, line)) {
      const Value subject = on_attr ? attr(x, args[0].data_->s, line) : x;
      bool ok;
      if (args.size() > base) {
        if (args[base].kind() != Kind::kString) fail(line, name + " needs a test name");
        Args targs(args.begin() + static_cast<std::ptrdiff_t>(base + 1), args.end());
        ok = test(args[base].data_->s, subject, targs, line);
      } else {
        ok = truthy(subject);
      }
      if (ok == keep_if) out.push_back(x);
    }
    return Value::list(std::move(out));
  }
  unsupported(line, "the filter '" + name + "'");
}

bool Evaluator::test(const std::string& name, const Value& v, Args& args, int line) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind() == Kind::kNone;
  if (name == "string") return v.kind() == Kind::kString;
  if (name == "number") return v.kind() == Kind::kInt || v.kind() == Kind::kFloat;
  if (name == "integer") return v.kind() == Kind::kInt;
  if (name == "float") return v.kind() == Kind::kFloat;
  if (name == "boolean") return v.kind() == Kind::kBool;
  if (name == "true") return v.kind() == Kind::kBool && v.data_->b;
  if (name == "false") return v.kind() == Kind::kBool && !v.data_->b;
  if (name == "mapping") return v.kind() == Kind::kDict;
  if (name == "sequence" || name == "iterable") return v.kind() == Kind::kList || v.kind() == Kind::kString || (name == "iterable" && v.kind() == Kind::kDict);
  if (name == "callable") return v.kind() == kCallable;
  if (name == "equalto" || name == "eq" || name == "==") {
    if (args.empty()) fail(line, "'" + name + "' needs a value");
    return equal(v, args[0]);
  }
  if (name == "ne" || name == "!=") return args.empty() ? true : !equal(v, args[0]);
  if (name == "odd" || name == "even") return v.kind() == Kind::kInt && ((v.data_->i % 2 != 0) == (name == "odd"));
  if (name == "divisibleby") return !args.empty() && as_int(args[0]) != 0 && as_int(v) % as_int(args[0]) == 0;
  if (name == "in") return !args.empty() && truthy(binop("in", v, args[0], line));
  unsupported(line, "the test '" + name + "'");
}

void Evaluator::exec(const Node& n, std::string& out) {
  switch (n.t) {
    case Node::T::kText: out += n.text; return;
    case Node::T::kOutput: out += str(eval(*n.expr)); return;
    case Node::T::kNoop: return;
    case Node::T::kIf:
      for (const auto& [cond, body] : n.branches)
        if (!cond || truthy(eval(*cond))) {
          run(body, out);
          return;
        }
      return;
    case Node::T::kSet: {
      const Value v = eval(*n.expr);
      if (!n.attr.empty()) {
        Value* ns = sc_.find(n.targets[0]);
        if (ns == nullptr || ns->kind() != Kind::kDict || !ns->data_->is_namespace)
          fail(n.line, "'" + n.targets[0] + "' is not a namespace: cannot set ." + n.attr);
        for (auto& [k, old] : ns->data_->dict)
          if (k == n.attr) {
            old = v;
            return;
          }
        ns->data_->dict.emplace_back(n.attr, v);
        return;
      }
      if (n.targets.size() == 1) {
        sc_.set(n.targets[0], v);
        return;
      }
      const std::vector<Value> items = iterate(v, n.line);
      if (items.size() != n.targets.size()) fail(n.line, "cannot unpack " + repr(v) + " into " + std::to_string(n.targets.size()) + " names");
      for (size_t i = 0; i < items.size(); ++i) sc_.set(n.targets[i], items[i]);
      return;
    }
    case Node::T::kSetBlock: {
      std::string captured;
      run(n.body, captured);
      sc_.set(n.targets[0], Value(captured));
      return;
    }
    case Node::T::kMacro: {
      const Node* node = &n;
      Scope* scope = &sc_;
      sc_.set(n.targets[0], callable([node, scope](Args& args, KwArgs& kw) {
        Scope inner{scope->frames};
        inner.frames.emplace_back();
        for (size_t i = 0; i < node->params.size(); ++i) {
          Value v;
          for (auto& [k, x] : kw)
            if (k == node->params[i].first) v = x;
          if (v.is_undefined() && i < args.size()) v = args[i];
          if (v.is_undefined() && node->params[i].second) v = Evaluator(inner).eval(*node->params[i].second);
          inner.set(node->params[i].first, v);
        }
        std::string out;
        Evaluator(inner).run(node->body, out);
        return Value(out);
      }));
      return;
    }
    case Node::T::kFor: {
      std::vector<Value> items = iterate(eval(*n.expr), n.line);
      sc_.frames.emplace_back();
      auto bind = [&](const Value& item) {
        if (n.targets.size() == 1) {
          sc_.set(n.targets[0], item);
          return;
        }
        const std::vector<Value> parts = iterate(item, n.line);
        if (parts.size() != n.targets.size()) fail(n.line, "cannot unpack " + repr(item) + " into " + std::to_string(n.targets.size()) + " names");
        for (size_t i = 0; i < parts.size(); ++i) sc_.set(n.targets[i], parts[i]);
      };
      if (n.filter) {
        std::vector<Value> kept;
        for (const Value& item : items) {
          bind(item);
          if (truthy(eval(*n.filter))) kept.push_back(item);
        }
        items = std::move(kept);
      }
      const int64_t len = static_cast<int64_t>(items.size());
      for (int64_t i = 0; i < len; ++i) {
        bind(items[static_cast<size_t>(i)]);
        sc_.set("loop", Value::dict({{"index", Value(i + 1)},
                                     {"index0", Value(i)},
                                     {"revindex", Value(len - i)},
                                     {"revindex0", Value(len - i - 1)},
                                     {"first", Value(i == 0)},
                                     {"last", Value(i + 1 == len)},
                                     {"length", Value(len)},
                                     {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value()},
                                     {"nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value()}}));
        run(n.body, out);
      }
      sc_.frames.pop_back();
      if (len == 0) run(n.else_body, out);
      return;
    }
  }
}

Value globals(int64_t now) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("raise_exception", callable([](Args& args, KwArgs&) -> Value {
                   throw InvalidArgumentError("chat template: " + (args.empty() ? std::string("raise_exception") : str(args[0])));
                 }));
  g.emplace_back("namespace", callable([](Args&, KwArgs& kw) {
                   Value ns = Value::dict(kw);
                   ns.data_->is_namespace = true;
                   return ns;
                 }));
  g.emplace_back("range", callable([](Args& args, KwArgs&) {
                   int64_t start = 0, stop = 0, step = 1;
                   if (args.size() == 1) stop = as_int(args[0]);
                   else if (args.size() >= 2) start = as_int(args[0]), stop = as_int(args[1]);
                   if (args.size() >= 3) step = as_int(args[2]);
                   if (step == 0) throw InvalidArgumentError("chat template: range() step cannot be zero");
                   std::vector<Value> out;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                     out.emplace_back(i);
                     if (out.size() > 1000000) throw InvalidArgumentError("chat template: range() too long");
                   }
                   return Value::list(std::move(out));
                 }));
  g.emplace_back("strftime_now", callable([now](Args& args, KwArgs&) {
                   const std::time_t t = now >= 0 ? static_cast<std::time_t>(now) : std::time(nullptr);
                   std::tm tm{};
                   gmtime_r(&t, &tm);
                   char buf[256];
                   const std::string fmt = args.empty() ? "%Y-%m-%d" : str(args[0]);
                   const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
                   return Value(std::string(buf, n));
                 }));
  return Value::dict(std::move(g));
}

}  // namespace

struct ChatTemplate::Impl {
  Body body;
};

ChatTemplate::ChatTemplate(std::string_view source) : impl_(std::make_unique<Impl>()) {
  impl_->body = TreeBuilder(split_source(source)).parse_all();
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const TemplateValue& context, int64_t now) const {
  if (context.kind() != Kind::kDict) throw InvalidArgumentError("chat template: the context must be a dict");
  Scope scope;
  scope.frames.push_back(globals(now).data_->dict);
  scope.frames.push_back(context.data_->dict);  // copied: templates may `set` names
  scope.frames.emplace_back();
  std::string out;
  Evaluator(scope).run(impl_->body, out);
  return out;
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt, std::string_view bos_token,
                                std::string_view eos_token) const {
  std::vector<Value> msgs;
  for (const ChatMessage& m : messages) msgs.push_back(Value::dict({{"role", Value(m.role)}, {"content", Value(m.content)}}));
  return render(Value::dict({{"messages", Value::list(std::move(msgs))},
                             {"add_generation_prompt", Value(add_generation_prompt)},
                             {"bos_token", Value(std::string(bos_token))},
                             {"eos_token", Value(std::string(eos_token))}}));
}

}  // namespace kiln::llm
