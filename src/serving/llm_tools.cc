#include "llm_tools.h"

#include <nlohmann/json.hpp>

#include "kiln/core/error.h"

namespace kiln::serving {

using kiln::detail::str_cat;
using Json = nlohmann::ordered_json;

namespace {

// Where tool i's parameters live in the answer's schema.
std::string tool_def(size_t i) { return str_cat("t", i); }

// The arguments' schema moves under "#/$defs/t<i>": its references to its own root move
// with it. Values of enum, const, default and examples are data, not schemas.
void rebase_refs(Json& s, const std::string& base) {
  if (s.is_array()) {
    for (Json& v : s) rebase_refs(v, base);
    return;
  }
  if (!s.is_object()) return;
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    Json& v = it.value();
    if (k == "enum" || k == "const" || k == "default" || k == "examples") continue;
    if (k == "$ref" && v.is_string()) {
      const std::string ref = v.get<std::string>();
      if (!ref.empty() && ref[0] == '#') v = "#" + base + ref.substr(1);
    } else if ((k == "properties" || k == "$defs" || k == "definitions" || k == "patternProperties") && v.is_object()) {
      for (Json& child : v) rebase_refs(child, base);  // keyed by names, not keywords: each value is a schema
    } else {
      rebase_refs(v, base);
    }
  }
}

Json parameters_schema(const Tool& t) {
  if (t.parameters.empty()) return Json{{"type", "object"}, {"additionalProperties", false}};
  return Json::parse(t.parameters);
}

Json object_of(const std::string& key, Json value) {
  return Json{{"type", "object"}, {"properties", Json{{key, std::move(value)}}}, {"required", Json::array({key})},
              {"additionalProperties", false}};
}

std::string compact_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

void check_tool_parameters(const Tool& tool) { llm::JsonSchema::compile(compact_json(parameters_schema(tool))); }

std::shared_ptr<const llm::JsonSchema> tool_answer_schema(const ToolRequest& request, const std::string& response_schema) {
  Json defs = Json::object(), calls = Json::array();
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const Tool& t = request.tools[i];
    if (request.choice == ToolChoice::kNamed && t.name != request.named) continue;
    Json params = parameters_schema(t);
    rebase_refs(params, "/$defs/" + tool_def(i));
    defs[tool_def(i)] = std::move(params);
    calls.push_back(Json{{"type", "object"},
                         {"properties", Json{{"name", Json{{"const", t.name}}}, {"arguments", Json{{"$ref", "#/$defs/" + tool_def(i)}}}}},
                         {"required", Json::array({"name", "arguments"})},
                         {"additionalProperties", false}});
  }
  if (calls.empty()) throw InvalidArgumentError(str_cat("no tool is named '", request.named, "'"));
  Json items = calls.size() == 1 ? calls[0] : Json{{"anyOf", calls}};
  Json list{{"type", "array"}, {"items", std::move(items)}, {"minItems", 1}};
  if (!request.parallel || request.choice == ToolChoice::kNamed) list["maxItems"] = 1;
  Json root = object_of("tool_calls", std::move(list));
  if (request.choice == ToolChoice::kAuto) {
    Json response = response_schema.empty() ? Json{{"type", "string"}} : Json::parse(response_schema);
    rebase_refs(response, "/$defs/response");
    defs["response"] = std::move(response);
    root = Json{{"anyOf", Json::array({std::move(root), object_of("response", Json{{"$ref", "#/$defs/response"}})})}};
  }
  root["$defs"] = std::move(defs);
  return llm::JsonSchema::compile(compact_json(root));
}

std::vector<llm::ChatMessage> with_tool_instructions(std::vector<llm::ChatMessage> messages, const ToolRequest& request,
                                                     bool response_is_json) {
  std::string text;
  const std::string call_form = R"({"tool_calls": [{"name": "<the tool's name>", "arguments": {<its arguments>}}]})";
  switch (request.choice) {
    case ToolChoice::kAuto:
      text = str_cat("You can call tools. Reply with one JSON object and nothing else: ", call_form,
                     " to call one or more of them, or {\"response\": ",
                     response_is_json ? "<your answer as JSON>" : "\"<your answer>\"", "} to answer the user yourself.");
      break;
    case ToolChoice::kRequired:
      text = str_cat("Call one or more of these tools. Reply with one JSON object and nothing else: ", call_form, ".");
      break;
    case ToolChoice::kNamed:
      text = str_cat("Call the tool '", request.named, "'. Reply with one JSON object and nothing else: ", call_form, ".");
      break;
    case ToolChoice::kNone:
      return messages;
  }
  text += "\nThe tools:";
  for (const Tool& t : request.tools) {
    Json line{{"name", t.name}};
    if (!t.description.empty()) line["description"] = t.description;
    line["parameters"] = parameters_schema(t);
    text += "\n" + compact_json(line);
  }
  if (!messages.empty() && messages[0].role == "system") {
    messages[0].content += messages[0].content.empty() ? text : "\n\n" + text;
  } else {
    messages.insert(messages.begin(), llm::ChatMessage{"system", text});
  }
  return messages;
}

std::string tool_calls_text(const std::vector<ToolCall>& calls) {
  Json list = Json::array();
  for (const ToolCall& c : calls) {
    Json args;
    try {
      args = Json::parse(c.arguments);
    } catch (const Json::exception&) {
      args = c.arguments;  // not JSON: shown as the string it is
    }
    list.push_back(Json{{"name", c.name}, {"arguments", std::move(args)}});
  }
  return compact_json(Json{{"tool_calls", std::move(list)}});
}

std::string render_chat(const llm::ChatTemplate& tmpl, std::vector<llm::ChatMessage> messages, std::string_view bos,
                        std::string_view eos) {
  try {
    return tmpl.apply(messages, true, bos, eos);
  } catch (const InvalidArgumentError&) {
    bool any = false;
    for (llm::ChatMessage& m : messages)
      if (m.role == "tool") {
        m.role = "user";
        m.content = "Result of the tool call: " + m.content;
        any = true;
      }
    if (!any) throw;
    return tmpl.apply(messages, true, bos, eos);
  }
}

ToolAnswer parse_tool_answer(std::string_view text, bool response_is_json) {
  ToolAnswer a;
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception&) {
    return a;
  }
  if (!j.is_object()) return a;
  if (auto it = j.find("tool_calls"); it != j.end() && it->is_array()) {
    // Names and arguments as the streamer reads them: a streamed call's pieces join to them.
    AnswerStreamer reader;
    reader.feed(text);
    a.calls = reader.calls();
    if (a.calls.size() != it->size()) return ToolAnswer{};
    for (size_t k = 0; k < a.calls.size(); ++k) {  // (they differ only for keys given twice, which no schema writes)
      const Json& c = (*it)[k];
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("arguments") ||
          c["name"].get<std::string>() != a.calls[k].name || !Json::accept(a.calls[k].arguments) ||
          Json::parse(a.calls[k].arguments) != c["arguments"])
        return ToolAnswer{};
    }
    a.parsed = !a.calls.empty();
    return a;
  }
  if (auto it = j.find("response"); it != j.end()) {
    a.content = it->is_string() && !response_is_json ? it->get<std::string>() : compact_json(*it);
    a.parsed = true;
  }
  return a;
}

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace

bool AnswerStreamer::decode(char c, std::string& out) {
  auto lone_high = [&] {  // a high surrogate not followed by a low one
    if (high_) append_utf8(out, 0xfffd);
    high_ = 0;
  };
  if (escape_.empty()) {
    if (c == '\\') {
      escape_ = "\\";
      return false;
    }
    lone_high();
    if (c == '"') return true;
    out += c;
    return false;
  }
  escape_ += c;
  if (escape_[1] != 'u') {
    lone_high();
    static constexpr std::string_view kFrom = "\"\\/bfnrt", kTo = "\"\\/\b\f\n\r\t";
    const size_t k = kFrom.find(escape_[1]);
    if (k != std::string_view::npos) out += kTo[k];
    escape_.clear();
  } else if (escape_.size() == 6) {  // \uXXXX
    uint32_t u = 0;
    bool hex = true;  // (the schema allows only hex digits here)
    for (size_t k = 2; k < 6; ++k) {
      const int h = escape_[k] | 0x20;
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : -1;
      hex = hex && d >= 0;
      u = u * 16 + static_cast<uint32_t>(d < 0 ? 0 : d);
    }
    if (!hex) u = 0xfffd;
    escape_.clear();
    if (u >= 0xdc00 && u < 0xe000) {  // a low surrogate: joins the high one before it
      append_utf8(out, high_ ? 0x10000 + ((high_ - 0xd800) << 10) + (u - 0xdc00) : 0xfffd);
      high_ = 0;
      return false;
    }
    lone_high();
    if (u >= 0xd800 && u < 0xdc00) high_ = u;
    else append_utf8(out, u);
  }
  return false;
}

void AnswerStreamer::capture(char c, Delta& d) {
  if (!capturing_) return;
  ToolCall& call = calls_[call_];
  call.arguments += c;
  if (call.name.empty()) return;  // given with the name
  if (d.calls.empty() || d.calls.back().index != call_) d.calls.push_back(CallPiece{call_, false, "", ""});
  d.calls.back().arguments += c;
}

// A value starts with `c`: where it is decides what it is read for.
void AnswerStreamer::begin_value(char c, Delta& d) {
  // {"tool_calls": [{"name": ..., "arguments": ...}]}: a call's fields are at depth 3.
  const bool in_call = frames_.size() == 3 && frames_[1].calls && frames_[2].object;
  if (in_call && frames_[2].key == "arguments" && !capturing_) {
    capturing_ = frames_.size();
    call_ = frames_[1].index;
  }
  capture(c, d);
  if (c == '{' || c == '[') {
    if (frames_.size() >= 256) {  // deeper than any answer kiln asks for: stop reading
      lex_ = Lex::kOff;
      return;
    }
    const bool list = c == '[' && frames_.size() == 1 && frames_[0].object && frames_[0].key == "tool_calls" && !listed_;
    if (c == '{' && frames_.size() == 2 && frames_[1].calls && calls_.size() <= frames_[1].index)
      calls_.resize(frames_[1].index + 1);  // a call starts
    listed_ = listed_ || list;
    frames_.push_back(Frame{c == '{', "", 0, list});
    lex_ = c == '{' ? Lex::kKeyOrClose : Lex::kValue;
  } else if (c == '"') {
    role_ = Role::kOther;
    if (frames_.size() == 1 && frames_[0].object && frames_[0].key == "response") {
      role_ = Role::kResponse;
      response_ = true;
    } else if (in_call && frames_[2].key == "name") {
      role_ = Role::kName;
      call_ = frames_[1].index;
      text_.clear();
    }
    lex_ = Lex::kString;
  } else if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
    lex_ = Lex::kLiteral;
  } else {
    lex_ = Lex::kOff;
  }
}

// A value ended (a string's quote, a literal's last byte, a container's close).
void AnswerStreamer::end_value(Delta& d) {
  if (role_ == Role::kName && lex_ == Lex::kString && calls_[call_].name.empty()) {
    ToolCall& call = calls_[call_];
    call.name = text_.empty() ? std::string("?") : text_;  // (the schema names a tool: never empty)
    named_ = true;
    d.calls.push_back(CallPiece{call_, true, call.name, call.arguments});
  }
  role_ = Role::kOther;
  if (capturing_ == frames_.size()) capturing_ = 0;
  lex_ = frames_.empty() ? Lex::kDone : Lex::kAfter;
}

// The innermost container closes with `c`.
void AnswerStreamer::close(char c, Delta& d) {
  capture(c, d);
  frames_.pop_back();
  end_value(d);
}

void AnswerStreamer::step(char c, Delta& d) {
  const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
  switch (lex_) {
    case Lex::kValue:
      if (!space) begin_value(c, d);
      return;
    case Lex::kKeyOrClose:
    case Lex::kKey:
      if (space) return;
      if (c == '"') {
        capture(c, d);
        role_ = Role::kKey;
        text_.clear();
        lex_ = Lex::kString;
      } else if (c == '}' && lex_ == Lex::kKeyOrClose) {
        close(c, d);
      } else {
        lex_ = Lex::kOff;
      }
      return;
    case Lex::kColon:
      if (space) return;
      if (c != ':') {
        lex_ = Lex::kOff;
        return;
      }
      capture(c, d);
      frames_.back().key = text_;
      lex_ = Lex::kValue;
      return;
    case Lex::kString: {
      capture(c, d);
      std::string scratch;
      std::string& out = role_ == Role::kResponse ? d.content : role_ == Role::kOther ? scratch : text_;
      if (!decode(c, out)) return;
      if (role_ == Role::kKey) {
        role_ = Role::kOther;
        lex_ = Lex::kColon;
      } else {
        end_value(d);
      }
      return;
    }
    case Lex::kLiteral:
      if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '.' || c == '+' || c == '-' || c == 'E') {
        capture(c, d);
        return;
      }
      end_value(d);
      step(c, d);  // the byte after the literal
      return;
    case Lex::kAfter:
      if (space) return;
      if (c == ',') {
        capture(c, d);
        if (frames_.back().object) {
          lex_ = Lex::kKey;
        } else {
          ++frames_.back().index;
          lex_ = Lex::kValue;
        }
      } else if (c == (frames_.back().object ? '}' : ']')) {
        close(c, d);
      } else {
        lex_ = Lex::kOff;
      }
      return;
    case Lex::kDone:
      if (!space) lex_ = Lex::kOff;
      return;
    case Lex::kOff:
      return;
  }
}

AnswerStreamer::Delta AnswerStreamer::feed(std::string_view text) {
  Delta d;
  for (const char c : text) {
    if (lex_ == Lex::kOff) break;
    step(c, d);
  }
  return d;
}

}  // namespace kiln::serving
