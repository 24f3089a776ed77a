// The JSON-object recognizer byte by byte (valid documents and every prefix of them,
// invalid ones refused at the first wrong byte, all-or-nothing feeds), and the token
// mask on a tiny byte-level model: whatever the logits, masked sampling writes a JSON
// object that nlohmann::json parses.
#include "kiln/llm/json_constraint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "kiln/llm/model.h"
#include "llm/tiny_model.h"

namespace kiln::llm {
namespace {

// The bytes of `doc` the recognizer takes (all of them: doc.size()).
size_t accepted(const std::string& doc, JsonRecognizer* out = nullptr) {
  JsonRecognizer r;
  size_t n = 0;
  while (n < doc.size() && r.feed(static_cast<uint8_t>(doc[n]))) ++n;
  if (out) *out = r;
  return n;
}

TEST(JsonRecognizer, AcceptsObjectsAndEveryPrefix) {
  for (const std::string& doc : {
           std::string("{}"),
           std::string(" \n{ } \t"),
           std::string(R"({"a": 1, "b": [true, false, null, -0.5e+3, 0, 12, 3.25E-2, []], "c": {"d": {}}})"),
           std::string(R"({"s": "quote \" backslash \\ slash \/ \b\f\n\r\t \u00e9\uD83D\uDE00 caf\u00E9", "k": ""})"),
           std::string("{\"utf8\": \"caf\xc3\xa9 \xf0\x9f\x8c\x8d\"}"),
           std::string(R"({"nested": [[[{"x": [1, [2, [3]]]}]]]})"),
       }) {
    SCOPED_TRACE(doc);
    JsonRecognizer r;
    for (size_t i = 0; i < doc.size(); ++i) {
      ASSERT_TRUE(r.feed(static_cast<uint8_t>(doc[i]))) << "byte " << i;
      // Complete exactly once the last non-space byte is in.
      const bool closed = doc.find_first_not_of(" \t\n\r", i + 1) == std::string::npos;
      EXPECT_EQ(r.complete(), closed) << "byte " << i;
    }
    EXPECT_TRUE(nlohmann::json::parse(doc).is_object());  // (the cases are valid JSON)
  }
}

TEST(JsonRecognizer, RefusesAtTheFirstWrongByte) {
  // Each case: a document and how many of its bytes are a valid start of an object.
  for (const auto& [doc, good] : std::vector<std::pair<std::string, size_t>>{
           {"[1]", 0},               // the top level is an object
           {"1", 0},
           {"\"s\"", 0},
           {"{\"a\" 1}", 5},          // no colon
           {"{,}", 1},
           {"{\"a\": 01}", 7},        // a leading zero
           {"{\"a\": 1,}", 8},        // a trailing comma
           {"{\"a\": [1,]}", 9},
           {"{\"a\": tru}", 9},
           {"{\"a\": \"\x01\"}", 7},  // a control character in a string
           {"{\"a\": \"\\q\"}", 8},   // an unknown escape
           {"{\"a\": \"\\u12G4\"}", 11},
           {"{\"a\": -}", 7},
           {"{\"a\": 1.}", 8},
           {"{\"a\": 1e}", 8},
           {"{\"a\": 1}}", 8},        // nothing after the object but whitespace
           {"{\"a\": 1]", 7},          // the wrong closing bracket
           {"{1: 2}", 1},              // keys are strings
           {"{\"a\": nul", 9},         // (a prefix: all of it is fine, just not complete)
           {"{\"a\": \"\xff\"}", 7},     // not UTF-8
           {"{\"a\": \"\xc3\"}", 8},     // a character cut short
           {"{\"a\": \"\xed\xa0\x80\"}", 8},  // a UTF-16 surrogate in UTF-8
           {"{\"a\": \"\xc0\xaf\"}", 7},  // an overlong form
       }) {
    SCOPED_TRACE(doc);
    JsonRecognizer r;
    EXPECT_EQ(accepted(doc, &r), good);
    EXPECT_EQ(r.complete(), doc == "{\"a\": 1}}");  // (that one's object did close)
    // Not a JSON object (some are JSON, not objects).
    EXPECT_FALSE(nlohmann::json::accept(doc) && nlohmann::json::parse(doc).is_object());
  }
}

TEST(JsonRecognizer, AFeedIsAllOrNothing) {
  JsonRecognizer r;
  ASSERT_TRUE(r.feed(std::string_view("{\"a\": [1")));
  EXPECT_FALSE(r.feed(std::string_view("2, }")));  // the "}" is wrong: nothing of it is taken
  EXPECT_TRUE(r.feed(std::string_view("2], \"b\": 3}")));
  EXPECT_TRUE(r.complete());
  EXPECT_FALSE(r.feed(static_cast<uint8_t>('x')));
  EXPECT_TRUE(r.complete());
}

// Masked sampling on a tiny model's byte-level vocabulary with random logits: every
// run ends in a complete object that parses, and no token was ever taken that the
// mask had refused.
// The shortcut inside strings takes exactly what walking the bytes would.
TEST(JsonConstraint, StringContentShortcutEqualsWalkingTheBytes) {
  const std::shared_ptr<const Model> m = testing::load_tiny_model(testing::tiny_models()[1]);  // f16-qwen2-bpe: every byte a token
  auto vocab = std::make_shared<const JsonVocabulary>(m->tokenizer());
  for (const char* prefix : {"{\"", "{\"key\": \"caf", "{\"a\": [\"x"}) {
    SCOPED_TRACE(prefix);
    JsonConstraint c(vocab);
    JsonRecognizer r;
    ASSERT_TRUE(r.feed(std::string_view(prefix)));
    for (char ch : std::string_view(prefix)) {
      const std::optional<TokenId> id = m->tokenizer().find(testing::tiny_detail::byte_char(static_cast<uint8_t>(ch)));
      ASSERT_TRUE(id.has_value());
      c.accept(*id);
    }
    std::vector<float> logits(static_cast<size_t>(m->tokenizer().vocab_size()), 0.0f);
    c.mask(logits);
    for (size_t id = 0; id < logits.size(); ++id) {
      JsonRecognizer walk = r;
      const bool want = !vocab->end_of_generation[id] && !vocab->bytes[id].empty() && walk.feed(vocab->bytes[id]);
      EXPECT_EQ(std::isfinite(logits[id]), want) << "token " << id << " '" << vocab->bytes[id] << "'";
    }
  }
}

TEST(JsonConstraint, MaskedSamplingWritesAnObject) {
  for (const testing::TinyModel& tm : testing::tiny_models()) {
    if (tm.name != "f16-qwen2-bpe" && tm.name != "q8_0-llama-spm") continue;  // both tokenizer kinds
    SCOPED_TRACE(tm.name);
    const std::shared_ptr<const Model> m = testing::load_tiny_model(tm);
    const Tokenizer& tok = m->tokenizer();
    auto vocab = std::make_shared<const JsonVocabulary>(tok);
    std::mt19937 rng(7);
    std::normal_distribution<float> noise(0.0f, 2.0f);
    int complete = 0;
    for (int run = 0; run < 20; ++run) {
      JsonConstraint c(vocab);
      std::string text;
      for (int step = 0; step < 400 && !c.complete(); ++step) {
        std::vector<float> logits(static_cast<size_t>(tok.vocab_size()));
        for (float& l : logits) l = noise(rng);
        // Past 100 steps, favour closing brackets so runs end.
        if (step > 100)
          for (TokenId id = 0; id < tok.vocab_size(); ++id)
            if (vocab->bytes[static_cast<size_t>(id)].find_first_of("}]\"") != std::string::npos) logits[id] += 8;
        c.mask(logits);
        const TokenId pick = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        ASSERT_TRUE(std::isfinite(logits[pick])) << "the mask left nothing at step " << step << " after: " << text;
        ASSERT_FALSE(vocab->end_of_generation[static_cast<size_t>(pick)]) << "end of generation before the object closed";
        text += vocab->bytes[static_cast<size_t>(pick)];
        c.accept(pick);
      }
      if (!c.complete()) continue;
      ++complete;
      nlohmann::json j;
      ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
      EXPECT_TRUE(j.is_object()) << text;
      // Complete: only the end-of-generation tokens are left.
      std::vector<float> logits(static_cast<size_t>(tok.vocab_size()), 1.0f);
      c.mask(logits);
      for (TokenId id = 0; id < tok.vocab_size(); ++id)
        EXPECT_EQ(std::isfinite(logits[id]), vocab->end_of_generation[static_cast<size_t>(id)] != 0) << id;
    }
    EXPECT_GE(complete, 15);
  }
}

}  // namespace
}  // namespace kiln::llm
