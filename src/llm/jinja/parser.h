#pragma once
// The chat-template parser: source -> a tree of statements (Node) and expressions
// (Expr). The lexer applies whitespace control, trim_blocks and lstrip_blocks as Jinja's
// does; errors name the line. Internal to src/llm.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llm/jinja/value.h"

namespace kiln::llm::jinja {

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

// InvalidArgumentError (syntax) / UnimplementedError (a construct outside the subset).
Body parse_template(std::string_view source);

}  // namespace kiln::llm::jinja
