#pragma once
// OpenAI tool calling (`tools`, `tool_choice`, `parallel_tool_calls`) for any model, in one
// format kiln defines and enforces, not a model family's own:
//   - the prompt: instructions go at the end of the system message when the chat starts
//     with one (else in a system message put first); they list the tools as JSON lines {"name", "description", "parameters"} and ask for
//     one JSON object, {"tool_calls": [{"name": N, "arguments": {...}}, ...]} to call
//     tools or, with tool_choice "auto", {"response": "..."} to answer;
//   - the answer: constrained decoding (kiln/llm/json_constraint.h) under a schema built
//     from the tools (each call's name is one of the tools' and its arguments follow that
//     tool's `parameters`), so a call always parses and its arguments match; "required"
//     asks for calls, a named tool_choice for one call of that tool, parallel_tool_calls
//     false for one call;
//   - streams: a text response's characters and each call's name, then its arguments, as
//     they are written (AnswerStreamer);
//   - history: an assistant message's tool_calls are shown to the model in the same format,
//     tool results as messages of role "tool" (or, where the model's chat template refuses
//     that role, as user messages naming the result).
// Templates' own tool formats (Hermes' <tool_call>, Llama 3.1's ipython ...) are not used:
// one enforced format works with every model, including those whose templates know no tools.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/llm/chat_template.h"
#include "kiln/llm/json_constraint.h"

namespace kiln::serving {

struct Tool {
  std::string name;         // [a-zA-Z0-9_-]{1,64}, as OpenAI's
  std::string description;
  std::string parameters;   // the JSON schema of the arguments, compact ("": no arguments)
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  std::vector<Tool> tools;
  ToolChoice choice = ToolChoice::kNone;  // the default is "auto" when tools are given
  std::string named;                      // kNamed: the tool to call
  bool parallel = true;                   // parallel_tool_calls: more than one call per answer
  // Tools shape the prompt and the answer (tool_choice "none" leaves both alone).
  bool active() const { return choice != ToolChoice::kNone && !tools.empty(); }
};

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text, as written less the whitespace between tokens
  std::string id;         // "call_" and 24 letters and digits (the API's, set once answered)
};

// What the model answered in the format above.
struct ToolAnswer {
  bool parsed = false;           // false: not one whole answer (cut by max_tokens)
  std::vector<ToolCall> calls;   // {"tool_calls": [...]}
  std::string content;           // {"response": ...}: the string, or the value's JSON text
};

// The schema the answer is generated under. `response_schema`: the JSON text of the
// response_format's schema that a {"response": ...} answer's value follows ("": a string).
// Tools' parameters were checked one by one (check_tool_parameters) before.
std::shared_ptr<const llm::JsonSchema> tool_answer_schema(const ToolRequest& request, const std::string& response_schema);

// InvalidArgumentError (the schema compiler's message) when a tool's parameters cannot be
// enforced.
void check_tool_parameters(const Tool& tool);

// The messages with the instructions added to the first system message (or a system
// message put first).
std::vector<llm::ChatMessage> with_tool_instructions(std::vector<llm::ChatMessage> messages, const ToolRequest& request,
                                                     bool response_is_json);

// An assistant message's tool calls as the model is shown them.
std::string tool_calls_text(const std::vector<ToolCall>& calls);

// Renders the chat; when the template refuses messages of role "tool" (it raises), they
// are given again as user messages ("Result of the tool call: ...").
std::string render_chat(const llm::ChatTemplate& tmpl, std::vector<llm::ChatMessage> messages, std::string_view bos,
                        std::string_view eos);

// Reads the generated text; `response_is_json`: a {"response": ...} value is JSON text
// (response_format given), else it is the string.
ToolAnswer parse_tool_answer(std::string_view text, bool response_is_json);

// Reads an answer as it is written and gives what can be streamed. Fed the generated
// text piece by piece (text the answer's schema allows; other bytes stop it, never crash
// it), it gives a {"response": "..."} string's characters decoded (escapes undone, \uXXXX
// pairs joined, a lone surrogate as U+FFFD) and, for {"tool_calls": [...]}, each call once
// its name is read, then its arguments' JSON text as it is written, without the
// whitespace between tokens. A call's pieces joined are parse_tool_answer's arguments.
class AnswerStreamer {
 public:
  struct CallPiece {
    size_t index = 0;       // the call's place in the answer
    bool begins = false;    // the call's first piece: `name` is set
    std::string name;
    std::string arguments;  // more of the arguments' text
  };
  struct Delta {
    std::string content;           // more of the response's characters
    std::vector<CallPiece> calls;  // in the order written
  };
  Delta feed(std::string_view text);
  // The answer is a response string whose characters were given (all of them once closed).
  bool streams_response() const { return response_; }
  // The calls read so far, named or not (the last one may be partial).
  const std::vector<ToolCall>& calls() const { return calls_; }
  // Some call's name was given.
  bool streams_calls() const { return named_; }

 private:
  enum class Lex { kValue, kKeyOrClose, kKey, kColon, kAfter, kString, kLiteral, kDone, kOff };
  enum class Role { kKey, kResponse, kName, kOther };
  struct Frame {
    bool object = false;
    std::string key;   // objects: the key whose value comes next or was last
    size_t index = 0;  // arrays: the element's place
    bool calls = false;  // the answer's (first) "tool_calls" list
  };
  void step(char c, Delta& d);
  void begin_value(char c, Delta& d);
  void end_value(Delta& d);
  void close(char c, Delta& d);
  void capture(char c, Delta& d);
  bool decode(char c, std::string& out);  // a string's byte; true at its closing quote

  Lex lex_ = Lex::kValue;
  Role role_ = Role::kOther;
  std::vector<Frame> frames_;
  std::string text_;     // the key or name being read
  std::string escape_;   // an escape not yet whole
  uint32_t high_ = 0;    // a high surrogate waiting for its low half
  bool response_ = false;
  size_t capturing_ = 0;  // inside a call's arguments: the depth its value closes at (0: not)
  size_t call_ = 0;       // the call whose name or arguments are read
  std::vector<ToolCall> calls_;
  bool named_ = false;
  bool listed_ = false;  // the "tool_calls" list was opened
};

}  // namespace kiln::serving
