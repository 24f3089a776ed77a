// The chat-template lexer and recursive-descent parser (src/llm/jinja/parser.h).
#include "llm/jinja/parser.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "kiln/core/error.h"

namespace kiln::llm::jinja {

using detail::str_cat;

namespace {

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


}  // namespace

Body parse_template(std::string_view source) { return TreeBuilder(split_source(source)).parse_all(); }

}  // namespace kiln::llm::jinja
