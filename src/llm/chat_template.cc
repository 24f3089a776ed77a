// The chat-template evaluator: walks the parsed tree (src/llm/jinja/parser.h) over
// TemplateValues (src/llm/jinja/value.h). Semantics follow Jinja2 as Hugging Face's
// apply_chat_template configures it.
#include "kiln/llm/chat_template.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>

#include "kiln/core/error.h"
#include "llm/jinja/parser.h"
#include "llm/jinja/value.h"

namespace kiln::llm {

using namespace jinja;

namespace {

constexpr Kind kCallable = Kind::kCallable;

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
  impl_->body = parse_template(source);
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
