#pragma once
// Values of kiln's Jinja interpreter (chat templates): the storage behind TemplateValue,
// Python-like truthiness, printing (str/repr), JSON output as json.dumps, equality; the
// errors every part of the interpreter raises. Internal to src/llm.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/llm/chat_template.h"

namespace kiln::llm {

struct TemplateValue::Data {
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<TemplateValue> list;
  std::vector<std::pair<std::string, TemplateValue>> dict;
  bool is_namespace = false;  // namespace(): a dict whose attributes `set` may change
  std::function<TemplateValue(std::vector<TemplateValue>&, std::vector<std::pair<std::string, TemplateValue>>&)> fn;
};

namespace jinja {

using Value = TemplateValue;
using Kind = TemplateValue::Kind;
using Args = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;

Value make(Kind k);
Value callable(std::function<Value(Args&, KwArgs&)> fn);

// InvalidArgumentError / UnimplementedError naming the template line.
[[noreturn]] void fail(int line, const std::string& msg);
[[noreturn]] void unsupported(int line, const std::string& what);

bool truthy(const Value& v);
bool is_number(const Value& v);  // int, float or bool
double as_double(const Value& v);
int64_t as_int(const Value& v);
std::string str(const Value& v);   // as Jinja prints it: None, True, Python reprs of containers
std::string repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent) (0: no indent).
void to_json(std::string& out, const Value& v, int indent, int depth = 0);
const Value* dict_find(const Value& d, std::string_view key);
bool equal(const Value& a, const Value& b);

}  // namespace jinja
}  // namespace kiln::llm
