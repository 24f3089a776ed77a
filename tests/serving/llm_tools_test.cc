// Tool calling in the OpenAI API (serving/llm_tools.h): the request's tools, tool_choice
// and history parsed, with typed errors naming the field; the answer's schema (names and
// arguments enforced, "auto" / "required" / a named tool / parallel_tool_calls); the
// instructions; the answer read back; templates that refuse the "tool" role.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/llm/chat_template.h"
#include "kiln/llm/json_constraint.h"
#include "serving/llm_request.h"
#include "serving/llm_tools.h"

namespace kiln::serving {
namespace {

const char* kToolsJson = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                                       "required": ["tz"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}}])";

LlmRequest tools_chat(const std::string& extra) {
  return parse_llm_request(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": )" + std::string(kToolsJson) + extra +
                               "}",
                           true);
}

bool schema_accepts(const llm::JsonSchema& schema, const std::string& doc) {
  llm::JsonRecognizer r(&schema);
  return r.feed(doc) && r.complete();
}

TEST(LlmTools, RequestsParseWithAutoAsTheDefault) {
  LlmRequest r = tools_chat("");
  ASSERT_EQ(r.tools.tools.size(), 3u);
  EXPECT_EQ(r.tools.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools.tools[0].description, "The weather in a city");
  EXPECT_EQ(nlohmann::json::parse(r.tools.tools[1].parameters)["required"][0], "tz");
  EXPECT_TRUE(r.tools.tools[2].parameters.empty());
  EXPECT_EQ(r.tools.choice, ToolChoice::kAuto);
  EXPECT_TRUE(r.tools.parallel);
  EXPECT_TRUE(r.tools.active());
  ASSERT_NE(r.tool_schema, nullptr);  // compiled at parse time
  llm::JsonRecognizer answer(r.tool_schema.get());
  EXPECT_TRUE(answer.feed(R"({"tool_calls": [{"name": "ping", "arguments": {}}]})") && answer.closed());

  r = tools_chat(R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "parallel_tool_calls": false)");
  EXPECT_EQ(r.tools.choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tools.named, "get_time");
  EXPECT_FALSE(r.tools.parallel);
  EXPECT_EQ(tools_chat(R"(, "tool_choice": "required")").tools.choice, ToolChoice::kRequired);
  r = tools_chat(R"(, "tool_choice": "none")");
  EXPECT_EQ(r.tools.choice, ToolChoice::kNone);
  EXPECT_FALSE(r.tools.active());
  EXPECT_EQ(r.tool_schema, nullptr);
  // Completions have no tools: the field is ignored there, as any unknown one.
  EXPECT_TRUE(parse_llm_request(R"({"model": "m", "prompt": "x", "tools": 7})", false).tools.tools.empty());
}

TEST(LlmTools, BadToolsAreErrorsNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("tools": {})", "tools"},
      {R"("tools": [7])", "tools[0]"},
      {R"("tools": [{"type": "retrieval"}])", "tools[0].type"},
      {R"("tools": [{"type": "function"}])", "tools[0].function"},
      {R"("tools": [{"type": "function", "function": {}}])", "tools[0].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": "a b"}}])", "tools[0].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": ""}}])", "tools[0].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": "x"}}, {"type": "function", "function": {"name": "x"}}])",
       "tools[1].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": "x", "parameters": "object"}}])", "tools[0].function.parameters"},
      {R"("tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "string", "pattern": "a"}}}])",
       "tools[0].function.parameters"},
      {R"("tools": [{"type": "function", "function": {"name": "x", "parameters": {"$ref": "#/$defs/no"}}}])",
       "tools[0].function.parameters"},
      {R"("tools": [{"type": "function", "function": {"name": "x", "description": 3}}])", "tools[0].function.description"},
      {R"("tool_choice": "required")", "tool_choice"},
      {R"("tools": [{"type": "function", "function": {"name": "x"}}], "tool_choice": "sometimes")", "tool_choice"},
      {R"("tools": [{"type": "function", "function": {"name": "x"}}], "tool_choice": {"type": "function"})", "tool_choice"},
      {R"("tools": [{"type": "function", "function": {"name": "x"}}], "tool_choice": {"type": "function", "function": {"name": "y"}})",
       "tool_choice"},
      {R"("tools": [{"type": "function", "function": {"name": "x"}}], "parallel_tool_calls": "yes")", "parallel_tool_calls"},
      {R"("functions": [{"name": "x"}])", "functions"},
      {R"("messages": [{"role": "assistant", "tool_calls": {}}])", "messages[0].tool_calls"},
      {R"("messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}])", "messages[0].tool_calls[0]"},
      {R"("messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])",
       "messages[0].tool_calls[0].function.name"},
  };
  for (const auto& [fields, param] : cases) {
    std::string body = R"({"model": "m", )" + fields;
    if (fields.find("\"messages\"") == std::string::npos) body += R"(, "messages": [{"role": "user", "content": "x"}])";
    body += "}";
    try {
      parse_llm_request(body, true);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const RequestFieldError& e) {
      EXPECT_EQ(e.param(), param) << body << ": " << e.message();
    } catch (const Error& e) {
      ADD_FAILURE() << body << ": " << e.what();
    }
  }
  std::string many = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [)";
  for (int i = 0; i <= kMaxTools; ++i) many += (i ? "," : "") + std::string(R"({"type": "function", "function": {"name": "f)") + std::to_string(i) + "\"}}";
  try {
    parse_llm_request(many + "]}", true);
    ADD_FAILURE() << "129 tools accepted";
  } catch (const RequestFieldError& e) {
    EXPECT_EQ(e.param(), "tools");
  }
}

TEST(LlmTools, TheAnswerSchemaEnforcesNamesArgumentsAndTheChoice) {
  LlmRequest r = tools_chat("");
  auto s = tool_answer_schema(r.tools, "");
  const std::string weather = R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}})";
  const std::string time = R"({"name": "get_time", "arguments": {"tz": "UTC"}})";
  EXPECT_TRUE(schema_accepts(*s, R"({"tool_calls": [)" + weather + "]}"));
  EXPECT_TRUE(schema_accepts(*s, R"({"tool_calls": [)" + weather + ", " + time + ", " + R"({"name": "ping", "arguments": {}}]})"));
  EXPECT_TRUE(schema_accepts(*s, R"({"response": "It is sunny."})"));
  for (const char* bad : {R"({"tool_calls": []})",                                                           // at least one call
                          R"({"tool_calls": [{"name": "get_wether", "arguments": {}}]})",                       // no such tool
                          R"({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]})",       // unit required
                          R"({"tool_calls": [{"name": "get_weather", "arguments": {"city": 3, "unit": "celsius"}}]})",
                          R"({"tool_calls": [{"name": "get_time", "arguments": {"city": "Paris"}}]})",          // get_weather's
                          R"({"tool_calls": [{"name": "ping", "arguments": {"x": 1}}]})",                       // no arguments
                          R"({"response": 3})", R"({"answer": "x"})", R"(["x"])"})
    EXPECT_FALSE(schema_accepts(*s, bad)) << bad;

  r = tools_chat(R"(, "tool_choice": "required")");
  s = tool_answer_schema(r.tools, "");
  EXPECT_TRUE(schema_accepts(*s, R"({"tool_calls": [)" + time + "]}"));
  EXPECT_FALSE(schema_accepts(*s, R"({"response": "It is sunny."})"));

  r = tools_chat(R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}})");
  s = tool_answer_schema(r.tools, "");
  EXPECT_TRUE(schema_accepts(*s, R"({"tool_calls": [)" + time + "]}"));
  EXPECT_FALSE(schema_accepts(*s, R"({"tool_calls": [)" + weather + "]}"));
  EXPECT_FALSE(schema_accepts(*s, R"({"tool_calls": [)" + time + ", " + time + "]}"));  // one call

  r = tools_chat(R"(, "parallel_tool_calls": false)");
  s = tool_answer_schema(r.tools, "");
  EXPECT_TRUE(schema_accepts(*s, R"({"tool_calls": [)" + weather + "]}"));
  EXPECT_FALSE(schema_accepts(*s, R"({"tool_calls": [)" + weather + ", " + time + "]}"));

  // With response_format: a response's value follows its schema.
  r = tools_chat("");
  s = tool_answer_schema(r.tools, R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})");
  EXPECT_TRUE(schema_accepts(*s, R"({"response": {"ok": true}})"));
  EXPECT_FALSE(schema_accepts(*s, R"({"response": "ok"})"));
}

TEST(LlmTools, ReferencesInsideParametersKeepTheirMeaning) {
  // A recursive tree by "#" and a definition by "#/$defs/...", in two tools: each resolves
  // inside its own tool once the parameters move into the answer's schema.
  LlmRequest r = parse_llm_request(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [
      {"type": "function", "function": {"name": "tree", "parameters": {"type": "object", "properties": {
          "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["label"],
          "additionalProperties": false}}},
      {"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {
          "to": {"$ref": "#/$defs/point"}}, "required": ["to"], "additionalProperties": false,
          "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                              "required": ["x", "y"], "additionalProperties": false}}}}}]})",
                                   true);
  auto s = tool_answer_schema(r.tools, "");
  EXPECT_TRUE(schema_accepts(*s, R"({"tool_calls": [{"name": "tree", "arguments": {"label": "a", "children": [{"label": "b", "children": []}]}}]})"));
  EXPECT_FALSE(schema_accepts(*s, R"({"tool_calls": [{"name": "tree", "arguments": {"label": "a", "children": [{"x": 1}]}}]})"));
  EXPECT_TRUE(schema_accepts(*s, R"({"tool_calls": [{"name": "move", "arguments": {"to": {"x": 1, "y": 2}}}]})"));
  EXPECT_FALSE(schema_accepts(*s, R"({"tool_calls": [{"name": "move", "arguments": {"to": {"x": 1}}}]})"));
}

TEST(LlmTools, InstructionsGoToTheSystemMessage) {
  LlmRequest r = tools_chat("");
  auto m = with_tool_instructions(r.messages, r.tools, false);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "system");
  for (const char* part : {"\"tool_calls\"", "{\"response\": \"<your answer>\"}", R"({"name":"get_weather","description":"The weather in a city")",
                           R"({"name":"ping","parameters":{"type":"object","additionalProperties":false}})"})
    EXPECT_NE(m[0].content.find(part), std::string::npos) << part << " in " << m[0].content;
  EXPECT_EQ(m[1].content, "hi");
  // An existing system message keeps its text first; "required" offers no response.
  r = parse_llm_request(std::string(R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "hi"}], "tool_choice": "required", "tools": )") + kToolsJson + "}",
                        true);
  m = with_tool_instructions(r.messages, r.tools, false);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].content.rfind("Be brief.\n\nCall one or more of these tools.", 0), 0u) << m[0].content;
  EXPECT_EQ(m[0].content.find("\"response\""), std::string::npos);
  r.tools.choice = ToolChoice::kNone;
  EXPECT_EQ(with_tool_instructions(r.messages, r.tools, false)[0].content, "Be brief.");
}

TEST(LlmTools, HistoryShowsCallsInTheAnswerFormat) {
  LlmRequest r = parse_llm_request(R"({"model": "m", "messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]})",
                                   true);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content,
            R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}},{"name":"ping","arguments":"not json"}]})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].content, "21 C");

  // A template that takes any role renders "tool"; one that refuses it gets a user message.
  llm::ChatTemplate any("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}");
  EXPECT_NE(render_chat(any, r.messages, "", "").find("tool: 21 C\n"), std::string::npos);
  llm::ChatTemplate strict(
      "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
      "{{ raise_exception('Only user, assistant and system roles are supported') }}{% endif %}"
      "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}");
  EXPECT_NE(render_chat(strict, r.messages, "", "").find("user: Result of the tool call: 21 C\n"), std::string::npos);
  // Other template errors stay errors.
  std::vector<llm::ChatMessage> odd{{"critic", "x"}};
  EXPECT_THROW(render_chat(strict, odd, "", ""), InvalidArgumentError);
}

TEST(LlmTools, AnswersAreReadBack) {
  ToolAnswer a = parse_tool_answer(R"({"tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"}},
                                      {"name": "ping", "arguments": {}}]} )",
                                   false);
  ASSERT_TRUE(a.parsed);
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].name, "get_time");
  EXPECT_EQ(a.calls[0].arguments, R"({"tz":"UTC"})");
  EXPECT_EQ(a.calls[1].arguments, "{}");
  a = parse_tool_answer(R"({"response": "Hello \"you\"\n"})", false);
  ASSERT_TRUE(a.parsed);
  EXPECT_TRUE(a.calls.empty());
  EXPECT_EQ(a.content, "Hello \"you\"\n");
  a = parse_tool_answer(R"({"response": {"ok": true}})", true);
  EXPECT_EQ(a.content, R"({"ok":true})");
  EXPECT_EQ(parse_tool_answer(R"({"response": "x"})", true).content, R"("x")");
  // Cut short, or not an answer: not read (the text is given as it is).
  for (const char* text : {R"({"tool_calls": [{"name": "get_time", "argu)", "", "[]", R"({"tool_calls": []})", R"({"other": 1})"})
    EXPECT_FALSE(parse_tool_answer(text, false).parsed) << text;
}

// The streamer fed `text` in pieces of `step` bytes: the content, and each call's name
// and arguments joined from its pieces (a call named twice, or added to before it is
// named, fails the test).
struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;
  AnswerStreamer streamer;
};
Streamed stream_in_pieces(const std::string& text, size_t step) {
  Streamed out;
  for (size_t i = 0; i < text.size(); i += step) {
    AnswerStreamer::Delta d = out.streamer.feed(std::string_view(text).substr(i, step));
    out.content += d.content;
    for (const AnswerStreamer::CallPiece& p : d.calls) {
      if (p.begins) {
        EXPECT_EQ(p.index, out.calls.size()) << "calls begin in order, once";
        out.calls.push_back(ToolCall{p.name, p.arguments, ""});
      } else {
        EXPECT_LT(p.index, out.calls.size()) << "arguments before the call's name";
        if (p.index < out.calls.size()) out.calls[p.index].arguments += p.arguments;
      }
    }
  }
  return out;
}

TEST(LlmTools, AResponseStreamsAsItIsWritten) {
  // The response's characters come out decoded as the text arrives, whatever the pieces:
  // whole, byte by byte, or cut inside an escape and inside a surrogate pair.
  const std::string text = "{ \"response\" :\n \"Tab\\there \\\"q\\\" \\u00e9\\ud83d\\ude00 \\\\ end\"}";
  const std::string want = "Tab\there \"q\" \u00e9\U0001F600 \\ end";
  for (size_t step : {text.size(), size_t{1}, size_t{3}, size_t{7}}) {
    Streamed s = stream_in_pieces(text, step);
    EXPECT_EQ(s.content, want) << "pieces of " << step;
    EXPECT_TRUE(s.streamer.streams_response());
    EXPECT_FALSE(s.streamer.streams_calls());
  }
  // A response that is not a string gives nothing (sent whole once read).
  Streamed json = stream_in_pieces(R"({"response": {"ok": "yes"}})", 1);
  EXPECT_EQ(json.content, "");
  EXPECT_FALSE(json.streamer.streams_response());
  // A lone surrogate becomes U+FFFD (the text stays UTF-8).
  EXPECT_EQ(stream_in_pieces(R"({"response": "a\ud83db\ude00"})", 64).content, "a\uFFFDb\uFFFD");
}

TEST(LlmTools, ToolCallsStreamAsTheyAreWritten) {
  // Each call is given once its name is read, then its arguments as written less the
  // whitespace between tokens (strings keep theirs, escapes stay as written); joined, the
  // pieces are what parse_tool_answer reads, whatever the pieces' size.
  const std::string text = "{ \"tool_calls\" : [ {\"name\": \"get_weather\", \"arguments\": { \"city\" : \"New  York\",\n"
                           "  \"unit\": \"celsius\", \"days\": [1, 2.5e1 , -3], \"note\": \"a \\\"b\\\" {c}\\u00e9\" } },\n"
                           "  {\"name\": \"ping\", \"arguments\": {}}, {\"name\": \"n\\u0061me\", \"arguments\": 42 } ] }";
  const ToolAnswer whole = parse_tool_answer(text, false);
  ASSERT_TRUE(whole.parsed);
  ASSERT_EQ(whole.calls.size(), 3u);
  EXPECT_EQ(whole.calls[0].name, "get_weather");
  EXPECT_EQ(whole.calls[0].arguments,
            R"({"city":"New  York","unit":"celsius","days":[1,2.5e1,-3],"note":"a \"b\" {c}\u00e9"})");
  EXPECT_EQ(whole.calls[1].arguments, "{}");
  EXPECT_EQ(whole.calls[2].name, "name");  // the name decoded
  EXPECT_EQ(whole.calls[2].arguments, "42");
  for (size_t step : {text.size(), size_t{1}, size_t{2}, size_t{5}, size_t{13}}) {
    Streamed s = stream_in_pieces(text, step);
    EXPECT_EQ(s.content, "") << step;
    EXPECT_TRUE(s.streamer.streams_calls());
    ASSERT_EQ(s.calls.size(), 3u) << step;
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(s.calls[k].name, whole.calls[k].name) << step;
      EXPECT_EQ(s.calls[k].arguments, whole.calls[k].arguments) << "call " << k << ", pieces of " << step;
    }
  }
  // Cut short: the calls begun so far, the last one's arguments partial.
  Streamed cut = stream_in_pieces(text.substr(0, text.find("celsius")), 4);
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, R"({"city":"New  York","unit":")");
  // Bytes no answer has stop the streamer, quietly.
  Streamed odd = stream_in_pieces(R"({"tool_calls": [{"name": "x", "arguments": {"a": 1}} } ] ])", 3);
  ASSERT_EQ(odd.calls.size(), 1u);
  EXPECT_EQ(odd.calls[0].arguments, R"({"a":1})");
}

}  // namespace
}  // namespace kiln::serving
