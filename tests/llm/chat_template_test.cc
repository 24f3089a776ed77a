// Chat templates against Debian's python3-jinja2 rendering the same templates (SmolLM2's,
// Llama 2, ChatML and llama.cpp's corpus: Qwen2.5/3, Llama 3.x, Phi-3.5, Gemma 2,
// Mistral, DeepSeek-R1, SmolLM3, Granite, Hermes) on the same message lists
// (scripts/fixtures/gen_chat_templates.py): identical output or the same error.
#include "kiln/llm/chat_template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/llm/gguf.h"
#include "llm/llm_test_util.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

std::string template_source(const std::string& where, const std::string& name) {
  return read_file(where == "fixture" ? kiln::testing::fixture("llm/templates/" + name + ".jinja")
                                      : std::string(kiln::testing::llama_cpp_dir()) + "/models/templates/" + name + ".jinja");
}

constexpr int64_t kNow = 1722000000;  // 2024-07-26 13:20 UTC, the generator's clock

TEST(ChatTemplate, MatchesJinja2OnTheCorpus) {
  const auto cases = nlohmann::ordered_json::parse(read_file(kiln::testing::fixture("llm/chat_templates.json")));
  ASSERT_GE(cases.size(), 90u);
  int checked = 0, errors = 0;
  std::map<std::string, std::unique_ptr<ChatTemplate>> parsed;
  for (const auto& c : cases) {
    const std::string name = c["template"];
    SCOPED_TRACE(name + " / " + std::string(c["context_name"]));
    auto& t = parsed[name];
    if (!t) t = std::make_unique<ChatTemplate>(template_source(c["where"], name));
    const TemplateValue ctx = TemplateValue::from_json(c["context"].dump());
    if (c.contains("error")) {
      try {
        t->render(ctx, kNow);
        ADD_FAILURE() << "jinja2 raised '" << std::string(c["error"]) << "', kiln rendered";
      } catch (const InvalidArgumentError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string(c["error"])), std::string::npos) << e.what();
      }
      ++errors;
    } else {
      EXPECT_EQ(t->render(ctx, kNow), std::string(c["output"]));
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
  EXPECT_GE(errors, 1);  // gemma 2 refuses a system message
}

TEST(ChatTemplate, SmolLM2FromItsFile) {
  auto f = GgufFile::open(testing::smollm2_path());
  const ChatTemplate t(f->get_string("tokenizer.chat_template"));
  EXPECT_EQ(t.apply({{"user", "Hi"}}, true, "", ""),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.apply({{"system", "Be brief."}, {"user", "Hi"}}, false, "", ""),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, LanguageCorners) {
  auto render = [](const std::string& src, const std::string& ctx = "{}") {
    return ChatTemplate(src).render(TemplateValue::from_json(ctx));
  };
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 1 / 2 }} {{ 2 ** 10 }}"), "3 -4 1 2 0.5 1024");
  EXPECT_EQ(render("{{ [1, 'a', none, true] }} {{ {'k': 1.5} }}"), "[1, 'a', None, True] {'k': 1.5}");
  EXPECT_EQ(render("{{ x | tojson }}", R"({"x": {"a": [1, "é\n"], "b": null}})"), "{\"a\": [1, \"é\\n\"], \"b\": null}");
  EXPECT_EQ(render("{% for a, b in d.items() if b > 1 %}{{ a }}={{ b }}{% if not loop.last %},{% endif %}{% else %}none{% endfor %}",
                   R"({"d": {"x": 1, "y": 2, "z": 3}})"),
            "y=2,z=3");
  EXPECT_EQ(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");  // loops scope `set`
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }}"),
            "Hi a! Hi b?");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') | join('|') }} {{ '  x '.strip() }} {{ 'abc'[::-1] }} {{ 'abcdef'[1:4] }}"),
            "a|b||c x cba bcd");
  EXPECT_EQ(render("{{ 'x' if none else 'y' }} {{ undefined_name is defined }} {{ 3 is odd }} {{ 'ab' in 'cabd' }}"),
            "y False True True");
  EXPECT_EQ(render("  {% if true %}\n  yes\n  {% endif %}\n"), "  yes\n");  // lstrip_blocks + trim_blocks
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}  c"), "ab  c");
  EXPECT_EQ(render("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}",
                   R"({"m": [{"role": "user", "content": "u1"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "u2"}]})"),
            "['u1', 'u2']");
}

TEST(ChatTemplate, ErrorsNameTheConstructAndLine) {
  auto expect = [](const std::string& src, ErrorCode code, const std::string& part) {
    try {
      ChatTemplate(src).render(TemplateValue::dict());
      ADD_FAILURE() << "no error for " << src;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect("{% include 'x.jinja' %}", ErrorCode::kUnimplemented, "line 1: {% include %} is not supported");
  expect("a\n{{ x | wordwrap }}", ErrorCode::kUnimplemented, "line 2: the filter 'wordwrap'");
  expect("{% if x %}", ErrorCode::kInvalidArgument, "missing '{% endif %}'");
  expect("{{ 'abc }}", ErrorCode::kInvalidArgument, "'{{' is never closed");
  expect("{{ 'abc' ~ \"x }}", ErrorCode::kInvalidArgument, "is never closed");
  expect("{{ (1 + }}", ErrorCode::kInvalidArgument, "unexpected");
  expect("{{ raise_exception('roles must alternate') }}", ErrorCode::kInvalidArgument, "roles must alternate");
  expect("{% endfor %}", ErrorCode::kInvalidArgument, "'endfor' without its opening tag");
  expect("{{ 1 / 0 }}", ErrorCode::kInvalidArgument, "division by zero");
  EXPECT_THROW(TemplateValue::from_json("{\"messages\": [}"), InvalidArgumentError);
}

}  // namespace
}  // namespace kiln::llm
