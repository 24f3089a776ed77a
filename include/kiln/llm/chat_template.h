#pragma once
// Chat templates: the Jinja templates that GGUF files carry (`tokenizer.chat_template`)
// to turn a list of messages into a prompt. kiln interprets the Jinja subset that
// published templates use, rendered as Hugging Face's apply_chat_template does
// (trim_blocks and lstrip_blocks on): text, {{ expressions }}, {% if / elif / else %},
// {% for %} (tuple targets, `if` filters, loop.index/index0/first/last/length/revindex,
// else), {% set %} (also namespace attributes and blocks), {% macro %} and calls, {# #}
// comments, whitespace control (-); literals, lists, dicts, attribute and index access,
// slices, arithmetic, comparisons, `in`, `and/or/not`, `~`, conditional expressions;
// tests (defined, undefined, none, string, number, mapping, iterable, sequence, boolean,
// equalto, eq, odd, even, true, false); filters (trim, tojson, length/count, upper, lower,
// title, capitalize, replace, default/d, join, first, last, items, list, string, int,
// float, abs, round, selectattr, rejectattr, select, reject, map, unique, sort, reverse,
// safe, indent); string and dict methods (strip, lstrip, rstrip, split, startswith,
// endswith, upper, lower, replace, title, capitalize; items, keys, values, get);
// globals raise_exception, namespace, range, strftime_now. Values print as Python does
// (None, True, ['a']); tojson is json.dumps(ensure_ascii=False[, indent]).
//
// A construct outside the subset is an UnimplementedError naming it and its line;
// a syntax error is an InvalidArgumentError with the line; raise_exception(msg) in a
// template is an InvalidArgumentError carrying msg (the request was not acceptable).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::llm {

// A JSON-like value for template contexts (messages, tools, flags).
class TemplateValue {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable /* macros, builtins */ };
  TemplateValue() = default;  // undefined
  static TemplateValue none();
  TemplateValue(bool b);
  TemplateValue(int64_t i);
  TemplateValue(int i) : TemplateValue(static_cast<int64_t>(i)) {}
  TemplateValue(double d);
  TemplateValue(std::string s);
  TemplateValue(const char* s) : TemplateValue(std::string(s)) {}
  static TemplateValue list(std::vector<TemplateValue> items = {});
  static TemplateValue dict(std::vector<std::pair<std::string, TemplateValue>> items = {});  // keeps order
  // Parses JSON text (objects keep their key order). InvalidArgumentError when malformed.
  static TemplateValue from_json(std::string_view json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }

  struct Data;
  std::shared_ptr<Data> data_;
  Kind kind_ = Kind::kUndefined;
};

struct ChatMessage {
  std::string role;
  std::string content;
};

// The template used when a file carries none: ChatML (<|im_start|>role\n...<|im_end|>).
inline constexpr std::string_view kChatMlTemplate =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgumentError / UnimplementedError with the line.
  explicit ChatTemplate(std::string_view source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;

  // Renders with `context` (a dict: messages, add_generation_prompt, bos_token, ...).
  // strftime_now() formats `now` (seconds since the epoch, UTC; -1: the current time).
  std::string render(const TemplateValue& context, int64_t now = -1) const;
  // The usual call: messages, add_generation_prompt, bos_token, eos_token.
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt, std::string_view bos_token,
                    std::string_view eos_token) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::llm
