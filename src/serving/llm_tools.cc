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
    for (const Json& c : *it) {
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("arguments")) return ToolAnswer{};
      a.calls.push_back(ToolCall{c["name"].get<std::string>(), compact_json(c["arguments"])});
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

std::string ResponseStreamer::feed(std::string_view text) {
  std::string out;
  auto lone_high = [&] {  // a high surrogate not followed by a low one
    if (high_) append_utf8(out, 0xfffd);
    high_ = 0;
  };
  for (const char c : text) {
    if (state_ == State::kHead) {
      // The schema allows `{`, whitespace, a key, whitespace, `:`, whitespace, then the
      // value: decide at the value's first byte.
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
      head_ += c;
      constexpr std::string_view kHead = R"({"response":")";
      if (head_ == kHead) state_ = State::kString;
      else if (head_.size() >= kHead.size() || kHead.substr(0, head_.size()) != head_) state_ = State::kOff;
    } else if (state_ == State::kString) {
      if (escape_.empty()) {
        if (c == '\\') {
          escape_ = "\\";
          continue;
        }
        lone_high();
        if (c == '"') state_ = State::kDone;
        else out += c;
        continue;
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
          continue;
        }
        lone_high();
        if (u >= 0xd800 && u < 0xdc00) high_ = u;
        else append_utf8(out, u);
      }
    }
  }
  return out;
}

}  // namespace kiln::serving
