#include "llm_request.h"

#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace kiln::serving {

using kiln::detail::str_cat;
using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;
using ET = simdjson::dom::element_type;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw RequestFieldError(param, message); }

double number(const element& e, const std::string& name) {
  double d = 0;
  if (e.type() == ET::INT64) return static_cast<double>(int64_t(e));
  if (e.type() == ET::UINT64) return static_cast<double>(uint64_t(e));
  if (e.type() != ET::DOUBLE || e.get_double().get(d) != simdjson::SUCCESS) bad(name, str_cat("'", name, "' must be a number"));
  return d;
}

double number_in(const element& e, const std::string& name, double lo, double hi) {
  const double v = number(e, name);
  if (!(v >= lo && v <= hi)) bad(name, str_cat("'", name, "' must be between ", lo, " and ", hi, ", got ", v));
  return v;
}

int64_t integer(const element& e, const std::string& name) {
  int64_t v = 0;
  if (e.type() == ET::INT64 && e.get_int64().get(v) == simdjson::SUCCESS) return v;
  if (e.type() == ET::DOUBLE) {  // 16.0 is an integer; 16.5 is not
    double d = 0;
    if (e.get_double().get(d) == simdjson::SUCCESS && std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  bad(name, str_cat("'", name, "' must be an integer"));
}

int64_t integer_in(const element& e, const std::string& name, int64_t lo, int64_t hi) {
  const int64_t v = integer(e, name);
  if (v < lo || v > hi) bad(name, str_cat("'", name, "' must be between ", lo, " and ", hi, ", got ", v));
  return v;
}

bool boolean(const element& e, const std::string& name) {
  bool b = false;
  if (e.type() != ET::BOOL || e.get_bool().get(b) != simdjson::SUCCESS) bad(name, str_cat("'", name, "' must be a boolean"));
  return b;
}

std::string string(const element& e, const std::string& name) {
  std::string_view s;
  if (e.type() != ET::STRING || e.get_string().get(s) != simdjson::SUCCESS) bad(name, str_cat("'", name, "' must be a string"));
  return std::string(s);
}

// A message's content: a string, or a list of parts of which the text ones count.
std::string content(const element& e, const std::string& name) {
  if (e.type() == ET::STRING) return string(e, name);
  if (e.type() == ET::NULL_VALUE) return {};
  array parts;
  if (e.type() != ET::ARRAY || e.get_array().get(parts) != simdjson::SUCCESS)
    bad(name, str_cat("'", name, "' must be a string or a list of content parts"));
  std::string out;
  size_t i = 0;
  for (element part : parts) {
    const std::string pn = str_cat(name, "[", i++, "]");
    object po;
    if (part.get_object().get(po) != simdjson::SUCCESS) bad(pn, str_cat("'", pn, "' must be an object"));
    element type, text;
    if (po["type"].get(type) != simdjson::SUCCESS) bad(pn + ".type", str_cat("'", pn, ".type' is required"));
    const std::string t = string(type, pn + ".type");
    if (t != "text") bad(pn + ".type", str_cat("content parts of type '", t, "' are not supported (text only)"));
    if (po["text"].get(text) != simdjson::SUCCESS) bad(pn + ".text", str_cat("'", pn, ".text' is required"));
    out += string(text, pn + ".text");
  }
  return out;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
std::vector<ToolCall> tool_calls(const element& e, const std::string& name) {
  array calls;
  if (e.get_array().get(calls) != simdjson::SUCCESS) bad(name, str_cat("'", name, "' must be a list of tool calls"));
  std::vector<ToolCall> out;
  size_t i = 0;
  for (element c : calls) {
    const std::string cn = str_cat(name, "[", i++, "]");
    element fn, fname, args;
    if (c.type() != ET::OBJECT || c["function"].get(fn) != simdjson::SUCCESS || fn.type() != ET::OBJECT)
      bad(cn, str_cat("'", cn, "' must be an object with a 'function'"));
    if (fn["name"].get(fname) != simdjson::SUCCESS) bad(cn + ".function.name", str_cat("'", cn, ".function.name' is required"));
    ToolCall call{string(fname, cn + ".function.name"), "{}", ""};
    if (fn["arguments"].get(args) == simdjson::SUCCESS && args.type() != ET::NULL_VALUE)
      call.arguments = args.type() == ET::STRING ? string(args, cn + ".function.arguments") : std::string(simdjson::minify(args));
    out.push_back(std::move(call));
  }
  return out;
}

bool valid_tool_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

// tools: [{"type": "function", "function": {"name", "description", "parameters", "strict"}}].
std::vector<Tool> tools(const element& e) {
  array items;
  if (e.get_array().get(items) != simdjson::SUCCESS) bad("tools", "'tools' must be a list of tools");
  std::vector<Tool> out;
  size_t i = 0;
  for (element t : items) {
    const std::string tn = str_cat("tools[", i++, "]");
    element type, fn, v;
    if (t.type() != ET::OBJECT) bad(tn, str_cat("'", tn, "' must be an object"));
    if (t["type"].get(type) != simdjson::SUCCESS || type.type() != ET::STRING || std::string_view(type) != "function")
      bad(tn + ".type", str_cat("'", tn, ".type' must be \"function\""));
    if (t["function"].get(fn) != simdjson::SUCCESS || fn.type() != ET::OBJECT)
      bad(tn + ".function", str_cat("'", tn, ".function' must be an object"));
    Tool tool;
    if (fn["name"].get(v) != simdjson::SUCCESS) bad(tn + ".function.name", str_cat("'", tn, ".function.name' is required"));
    tool.name = string(v, tn + ".function.name");
    if (!valid_tool_name(tool.name))
      bad(tn + ".function.name", str_cat("'", tn, ".function.name' must be 1 to 64 letters, digits, '_' or '-', got '", tool.name, "'"));
    for (const Tool& before : out)
      if (before.name == tool.name) bad(tn + ".function.name", str_cat("two tools are named '", tool.name, "'"));
    if (fn["description"].get(v) == simdjson::SUCCESS && v.type() != ET::NULL_VALUE)
      tool.description = string(v, tn + ".function.description");
    if (fn["parameters"].get(v) == simdjson::SUCCESS && v.type() != ET::NULL_VALUE) {
      if (v.type() != ET::OBJECT) bad(tn + ".function.parameters", str_cat("'", tn, ".function.parameters' must be a JSON schema object"));
      tool.parameters = std::string(simdjson::minify(v));
      try {
        check_tool_parameters(tool);
      } catch (const InvalidArgumentError& err) {
        bad(tn + ".function.parameters", err.message());
      }
    }
    out.push_back(std::move(tool));
    if (out.size() > static_cast<size_t>(kMaxTools)) bad("tools", str_cat("'tools' takes at most ", kMaxTools, " tools"));
  }
  return out;
}

}  // namespace

LlmRequest parse_llm_request(std::string_view body, bool chat) {
  simdjson::dom::parser parser;
  element doc;
  if (auto err = parser.parse(body.data(), body.size()).get(doc); err != simdjson::SUCCESS)
    throw InvalidArgumentError(str_cat("the body is not valid JSON: ", simdjson::error_message(err)));
  object root;
  if (doc.get_object().get(root) != simdjson::SUCCESS) throw InvalidArgumentError("the body must be a JSON object");

  LlmRequest r;
  r.chat = chat;
  bool have_model = false, have_input = false, tool_choice_given = false;
  for (auto field : root) {
    const std::string_view key = field.key;
    const element& v = field.value;
    const std::string k(key);
    const bool null = v.type() == ET::NULL_VALUE;
    if (key == "model") {
      r.model = string(v, k);
      have_model = true;
    } else if (chat && key == "messages") {
      r.messages.clear();  // a key given twice: the last one counts, as in most JSON readers
      array msgs;
      if (v.get_array().get(msgs) != simdjson::SUCCESS) bad(k, "'messages' must be a list of messages");
      size_t i = 0;
      for (element m : msgs) {
        const std::string mn = str_cat("messages[", i++, "]");
        object mo;
        if (m.get_object().get(mo) != simdjson::SUCCESS) bad(mn, str_cat("'", mn, "' must be an object"));
        element role, text;
        if (mo["role"].get(role) != simdjson::SUCCESS) bad(mn + ".role", str_cat("'", mn, ".role' is required"));
        llm::ChatMessage msg;
        msg.role = string(role, mn + ".role");
        if (mo["content"].get(text) == simdjson::SUCCESS) msg.content = content(text, mn + ".content");
        element calls;  // an assistant's tool calls: shown to the model as it is asked to write them
        if (mo["tool_calls"].get(calls) == simdjson::SUCCESS && calls.type() != ET::NULL_VALUE) {
          const std::vector<ToolCall> c = tool_calls(calls, mn + ".tool_calls");
          if (!c.empty()) msg.content = tool_calls_text(c);
        }
        r.messages.push_back(std::move(msg));
      }
      if (r.messages.empty()) bad(k, "'messages' must not be empty");
      have_input = true;
    } else if (!chat && key == "prompt") {
      r.prompt.clear();
      r.prompt_tokens.clear();
      r.prompt_is_tokens = false;
      if (v.type() == ET::STRING) {
        r.prompt = string(v, k);
      } else {
        array items;
        if (v.get_array().get(items) != simdjson::SUCCESS) bad(k, "'prompt' must be a string, a list of token ids or a list of one string");
        size_t i = 0;
        for (element e : items) {
          const std::string en = str_cat("prompt[", i, "]");
          if (e.type() == ET::STRING) {
            if (i > 0 || items.size() != 1) bad(k, "one prompt per request: send a list of one string, or the string");
            r.prompt = string(e, en);
          } else if (e.type() == ET::ARRAY) {
            if (items.size() != 1) bad(k, "one prompt per request: send one list of token ids");
            array ids;
            if (e.get_array().get(ids) != simdjson::SUCCESS) bad(en, "expected a list of token ids");
            size_t j = 0;
            for (element id : ids) r.prompt_tokens.push_back(static_cast<llm::TokenId>(integer_in(id, str_cat(en, "[", j++, "]"), 0, INT32_MAX)));
            r.prompt_is_tokens = true;
          } else {
            r.prompt_tokens.push_back(static_cast<llm::TokenId>(integer_in(e, en, 0, INT32_MAX)));
            r.prompt_is_tokens = true;
          }
          ++i;
        }
        if (i == 0) bad(k, "'prompt' must not be empty");
      }
      have_input = true;
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      if (!null) r.max_tokens = integer_in(v, k, 1, INT32_MAX);
    } else if (key == "temperature") {
      if (!null) {
        r.sampling.temperature = static_cast<float>(number_in(v, k, 0, 2));
        r.temperature_given = true;
      }
    } else if (key == "top_p") {
      if (!null) {
        r.top_p_given = true;
        r.sampling.top_p = static_cast<float>(number_in(v, k, 0, 1));
        if (r.sampling.top_p == 0) r.sampling.top_p = 1e-6f;  // OpenAI accepts 0: the most likely token
      }
    } else if (key == "top_k") {
      if (!null) {
        r.sampling.top_k = static_cast<int32_t>(integer_in(v, k, 0, INT32_MAX));
        r.top_k_given = true;
      }
    } else if (key == "min_p") {
      if (!null) {
        r.sampling.min_p = static_cast<float>(number_in(v, k, 0, 1));
        r.min_p_given = true;
      }
    } else if (key == "presence_penalty") {
      if (!null) r.sampling.presence_penalty = static_cast<float>(number_in(v, k, -2, 2));
    } else if (key == "frequency_penalty") {
      if (!null) r.sampling.frequency_penalty = static_cast<float>(number_in(v, k, -2, 2));
    } else if (key == "repetition_penalty") {
      if (!null) r.sampling.repetition_penalty = static_cast<float>(number_in(v, k, 0.01, 10));
    } else if (key == "n") {
      if (!null) r.n = static_cast<int>(integer_in(v, k, 1, kMaxChoices));
    } else if (key == "seed") {
      if (!null) {
        r.sampling.seed = static_cast<uint64_t>(integer(v, k));
        r.seeded = true;
      }
    } else if (key == "stop") {
      r.stop.clear();
      if (v.type() == ET::STRING) {
        r.stop.push_back(string(v, k));
      } else if (!null) {
        array items;
        if (v.get_array().get(items) != simdjson::SUCCESS) bad(k, "'stop' must be a string or a list of strings");
        size_t i = 0;
        for (element e : items) r.stop.push_back(string(e, str_cat("stop[", i++, "]")));
        if (r.stop.size() > static_cast<size_t>(kMaxStopStrings)) bad(k, str_cat("'stop' takes at most ", kMaxStopStrings, " strings"));
      }
      for (const std::string& s : r.stop)
        if (s.empty()) bad(k, "stop strings must not be empty");
    } else if (key == "stream") {
      if (!null) r.stream = boolean(v, k);
    } else if (key == "stream_options") {
      if (!null) {
        object so;
        if (v.get_object().get(so) != simdjson::SUCCESS) bad(k, "'stream_options' must be an object");
        element iu;
        if (so["include_usage"].get(iu) == simdjson::SUCCESS && iu.type() != ET::NULL_VALUE)
          r.include_usage = boolean(iu, "stream_options.include_usage");
      }
    } else if (key == "logprobs") {
      if (null) continue;
      if (chat) {
        r.logprobs = boolean(v, k);
      } else {
        r.logprobs = true;  // completions: the number of alternatives
        r.sampling.top_logprobs = static_cast<int32_t>(integer_in(v, k, 0, 5));
      }
    } else if (chat && key == "top_logprobs") {
      if (!null) r.sampling.top_logprobs = static_cast<int32_t>(integer_in(v, k, 0, 20));
    } else if (key == "logit_bias") {
      r.sampling.logit_bias.clear();
      if (null) continue;
      object lb;
      if (v.get_object().get(lb) != simdjson::SUCCESS) bad(k, "'logit_bias' must be an object of token id -> bias");
      for (auto e : lb) {
        const std::string id_text(e.key);
        int64_t id = -1;
        try {
          size_t used = 0;
          id = std::stoll(id_text, &used);
          if (used != id_text.size()) id = -1;
        } catch (...) {
          id = -1;
        }
        if (id < 0 || id > INT32_MAX) bad(k, str_cat("'logit_bias' keys must be token ids, got '", id_text, "'"));
        r.sampling.logit_bias.emplace_back(static_cast<llm::TokenId>(id),
                                           static_cast<float>(number_in(e.value, str_cat("logit_bias.", id_text), -100, 100)));
      }
    } else if (key == "user") {
      if (!null) r.user = string(v, k);
    } else if (key == "ignore_eos") {
      if (!null) r.ignore_eos = boolean(v, k);
    } else if (key == "echo") {
      if (!null && boolean(v, k)) bad(k, "'echo' is not supported");
    } else if (key == "response_format") {
      if (null) continue;
      object rf;
      element type;
      if (v.get_object().get(rf) != simdjson::SUCCESS || rf["type"].get(type) != simdjson::SUCCESS)
        bad(k, "'response_format' must be an object with a 'type'");
      const std::string t = string(type, "response_format.type");
      if (t == "json_object") {
        r.json_object = true;
      } else if (t == "json_schema") {
        object js;
        element schema;
        if (rf["json_schema"].get_object().get(js) != simdjson::SUCCESS)
          bad("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema'");
        if (js["schema"].get(schema) != simdjson::SUCCESS)
          bad("response_format.json_schema.schema", "'response_format.json_schema.schema' is missing");
        try {
          r.json_schema_text = std::string(simdjson::minify(schema));
          r.json_schema = llm::JsonSchema::compile(r.json_schema_text);
        } catch (const InvalidArgumentError& e) {
          bad("response_format.json_schema.schema", e.message());
        }
      } else if (t != "text") {
        bad(k, str_cat("response_format '", t, "' is not supported (text, json_object and json_schema are)"));
      }
    } else if (chat && key == "tools") {
      r.tools.tools.clear();
      if (!null) r.tools.tools = tools(v);
    } else if (chat && key == "tool_choice") {
      tool_choice_given = !null;
      if (null) {
        r.tools.choice = ToolChoice::kNone;
      } else if (v.type() == ET::STRING) {
        const std::string c = string(v, k);
        if (c == "none") r.tools.choice = ToolChoice::kNone;
        else if (c == "auto") r.tools.choice = ToolChoice::kAuto;
        else if (c == "required") r.tools.choice = ToolChoice::kRequired;
        else bad(k, str_cat("'tool_choice' must be \"none\", \"auto\", \"required\" or a named tool, got '", c, "'"));
      } else {
        element fn, name;
        if (v.type() != ET::OBJECT || v["function"].get(fn) != simdjson::SUCCESS || fn.type() != ET::OBJECT ||
            fn["name"].get(name) != simdjson::SUCCESS)
          bad(k, "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        r.tools.choice = ToolChoice::kNamed;
        r.tools.named = string(name, "tool_choice.function.name");
      }
    } else if (chat && key == "parallel_tool_calls") {
      if (!null) r.tools.parallel = boolean(v, k);
    } else if (key == "functions" || key == "function_call") {
      if (!null) bad(k, str_cat("'", k, "' (the deprecated form of tools) is not supported: use 'tools' and 'tool_choice'"));
    }
    // Anything else is ignored, as OpenAI does.
  }
  if (!have_model) bad("model", "'model' is required");
  if (!have_input) bad(chat ? "messages" : "prompt", chat ? "'messages' is required" : "'prompt' is required");
  if (!r.logprobs) r.sampling.top_logprobs = 0;
  if (!tool_choice_given && !r.tools.tools.empty()) r.tools.choice = ToolChoice::kAuto;
  if (tool_choice_given && r.tools.choice != ToolChoice::kNone && r.tools.tools.empty())
    bad("tool_choice", "'tool_choice' needs 'tools'");
  if (r.tools.choice == ToolChoice::kNamed &&
      std::none_of(r.tools.tools.begin(), r.tools.tools.end(), [&](const Tool& t) { return t.name == r.tools.named; }))
    bad("tool_choice", str_cat("'tool_choice' names '", r.tools.named, "', which is not in 'tools'"));
  if (r.tools.active()) {
    try {  // a response's value follows response_format (json_object: any object)
      r.tool_schema = tool_answer_schema(r.tools, r.json_object ? std::string(R"({"type":"object"})") : r.json_schema_text);
    } catch (const InvalidArgumentError& e) {
      bad("tools", e.message());  // each tool's parameters compiled alone: only their sum can be too large
    }
  }
  return r;
}

}  // namespace kiln::serving
