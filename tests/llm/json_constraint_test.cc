// The JSON-object recognizer byte by byte (valid documents and every prefix of them,
// invalid ones refused at the first wrong byte, all-or-nothing feeds), and the token
// mask on a tiny byte-level model: whatever the logits, masked sampling writes a JSON
// object that nlohmann::json parses.
#include "kiln/llm/json_constraint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "kiln/llm/generate.h"
#include "kiln/llm/gguf.h"
#include "kiln/llm/tokenizer.h"
#include "kiln/llm/model.h"
#include "llm/llm_test_util.h"
#include "llm/tiny_model.h"
#include "test_util.h"

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

// With SmolLM2's vocabulary (tokens of many characters), inside strings with and
// without a maxLength: the mask takes exactly the tokens the recognizer takes whole.
TEST(JsonConstraint, TheMaskEqualsFeedingEveryTokenInsideLimitedStrings) {
  auto file = GgufFile::open(testing::smollm2_path());
  auto vocab = std::make_shared<const JsonVocabulary>(*Tokenizer::from_gguf(*file));
  auto schema = JsonSchema::compile(
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "tag": {"type": "string", "maxLength": 1},
          "text": {"type": "string"}}, "required": ["name", "tag", "text"], "additionalProperties": false})");
  const char* prefixes[] = {R"({"name": ")", R"({"name": "ab)", R"({"name": "abcd)", R"({"name": "abcdef)",
                            R"({"name": "aéé)", R"({"name": "ab", "tag": ")", R"({"name": "ab", "tag": "x", "text": "hello)"};
  for (const char* prefix : prefixes) {
    SCOPED_TRACE(prefix);
    JsonRecognizer r(schema.get());
    ASSERT_TRUE(r.feed(std::string_view(prefix)));
    ASSERT_TRUE(r.between_string_characters());
    JsonConstraint c(vocab, schema);
    // The constraint reaches the prefix through the tokens of its bytes one by one.
    for (char ch : std::string_view(prefix)) {
      const auto it = std::find(vocab->bytes.begin(), vocab->bytes.end(), std::string(1, ch));
      ASSERT_NE(it, vocab->bytes.end()) << ch;
      c.accept(static_cast<TokenId>(it - vocab->bytes.begin()));
    }
    std::vector<float> logits(vocab->bytes.size(), 0.0f);
    c.mask(logits);
    size_t allowed = 0;
    for (size_t id = 0; id < logits.size(); ++id) {
      JsonRecognizer walk = r;
      const bool want = !vocab->end_of_generation[id] && !vocab->bytes[id].empty() && walk.feed(vocab->bytes[id]);
      ASSERT_EQ(std::isfinite(logits[id]), want) << "token " << id << " '" << vocab->bytes[id] << "'";
      allowed += want;
    }
    EXPECT_GT(allowed, 0u);
  }
}

// Masked sampling on a tiny model's byte-level vocabulary with random logits: every
// run ends in a complete object that parses, and no token was ever taken that the
// mask had refused.
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

// ---- JSON Schema ----------------------------------------------------------------------

// How many bytes of `doc` a recognizer of `schema` takes, and whether it is then complete.
std::pair<size_t, bool> run_schema(const JsonSchema& schema, const std::string& doc) {
  JsonRecognizer r(&schema);
  size_t n = 0;
  while (n < doc.size() && r.feed(static_cast<uint8_t>(doc[n]))) ++n;
  return {n, r.complete()};
}

const char* kPersonSchema = R"({
  "$defs": {"tag": {"type": "string", "minLength": 1, "maxLength": 3}},
  "type": "object",
  "properties": {
    "name": {"type": "string", "description": "annotations are ignored", "format": "anything"},
    "age": {"type": "integer"},
    "score": {"type": ["number", "null"]},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 2},
    "kind": {"enum": ["cat", "dog", 3, null]},
    "ok": {"type": "boolean"},
    "quo\"te": {"const": {"a": [1, 2]}}
  },
  "required": ["name", "tags"]
})";

TEST(JsonSchema, AcceptsValidDocumentsAndEveryPrefix) {
  const auto person = JsonSchema::compile(kPersonSchema);
  for (const std::string& doc : {
           std::string(R"({"name": "Ann", "tags": ["a"]})"),
           std::string(R"({ "name" : "" , "age": -12, "score": 1.5e3, "tags": ["abc", "\u00e9"], "kind": "dog", "ok": true })"),
           std::string(R"({"name": "x", "score": null, "tags": ["t"], "kind": 3, "quo\"te": {"a":[1,2]}})"),
           std::string(R"({"name": "x", "tags": ["t"], "kind": null, "ok": false})"),
       }) {
    SCOPED_TRACE(doc);
    JsonRecognizer r(person.get());
    for (size_t i = 0; i < doc.size(); ++i) {
      ASSERT_TRUE(r.feed(static_cast<uint8_t>(doc[i]))) << "byte " << i << " '" << doc[i] << "'";
      EXPECT_EQ(r.complete(), i + 1 == doc.size()) << "byte " << i;
    }
    EXPECT_TRUE(r.closed());
  }
  // Top-level scalars: a number is complete while it could still go on.
  const auto integer = JsonSchema::compile(R"({"type": "integer"})");
  JsonRecognizer r(integer.get());
  ASSERT_TRUE(r.feed(std::string_view("12")));
  EXPECT_TRUE(r.complete());
  EXPECT_FALSE(r.closed());
  EXPECT_FALSE(r.feed(std::string_view(".5")));
  ASSERT_TRUE(r.feed(std::string_view("3 ")));
  EXPECT_TRUE(r.closed());
  // Recursion through $ref, and anyOf over objects that share a prefix.
  const auto tree = JsonSchema::compile(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
      "$ref": "#/$defs/node"})");
  const std::string forest = R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})";
  EXPECT_EQ(run_schema(*tree, forest), std::make_pair(forest.size(), true));
  const auto shapes = JsonSchema::compile(R"({"anyOf": [
      {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}}, "required": ["kind", "r"]},
      {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}}, "required": ["kind", "side"]}]})");
  EXPECT_EQ(run_schema(*shapes, R"({"kind": "square", "side": 2})"), std::make_pair(size_t{29}, true));
  EXPECT_EQ(run_schema(*shapes, R"({"kind": "circle", "side": 2})"), std::make_pair(size_t{20}, false));
  // Any value where the schema says nothing.
  const auto any = JsonSchema::compile("{}");
  for (const char* doc : {"[1, {\"a\": null}]", "\"s\"", "true", "-0.5"}) EXPECT_TRUE(run_schema(*any, doc).second) << doc;
}

TEST(JsonSchema, RefusesAtTheFirstByteOutsideTheSchema) {
  const auto person = JsonSchema::compile(kPersonSchema);
  for (const auto& [doc, good] : std::vector<std::pair<std::string, size_t>>{
           {R"({"tags": ["a"], "name": "x"})", 2},        // keys in the schema's order: "name" first (required)
           {R"({"name": "x"})", 12},                      // "tags" is required: no '}' yet
           {R"({"name": "x", "nick": 1})", 15},           // an undeclared key
           {R"({"name": "x", "age": 1.5})", 22},          // an integer
           {R"({"name": "x", "age": 1, "age": 2})", 25},  // a key twice
           {R"({"name": "x", "tags": []})", 23},          // minItems 1
           {R"({"name": "x", "tags": ["a", "b", "c"]})", 31},  // maxItems 2
           {R"({"name": "x", "tags": [""]})", 24},        // minLength 1
           {R"({"name": "x", "tags": ["abcd"]})", 27},    // maxLength 3
           {R"({"name": "x", "tags": ["a"], "kind": "cow"})", 39},
           {R"({"name": "x", "tags": ["a"], "kind": 4})", 37},
           {R"({"name": "x", "tags": ["a"], "ok": 1})", 35},
           {R"({"name": 5})", 9},
       }) {
    SCOPED_TRACE(doc);
    EXPECT_EQ(run_schema(*person, doc).first, good);
  }
  const auto closed = JsonSchema::compile(R"({"type": "object", "additionalProperties": false})");
  EXPECT_EQ(run_schema(*closed, R"({"a": 1})"), std::make_pair(size_t{1}, false));
  EXPECT_EQ(run_schema(*closed, "{}"), std::make_pair(size_t{2}, true));
  const auto map = JsonSchema::compile(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_EQ(run_schema(*map, R"({"a": 1, "b": 2})"), std::make_pair(size_t{16}, true));
  EXPECT_EQ(run_schema(*map, R"({"a": "1"})"), std::make_pair(size_t{6}, false));
}

TEST(JsonSchema, WhatItCannotEnforceIsRefusedByName) {
  for (const auto& [schema, message] : std::vector<std::pair<std::string, std::string>>{
           {"{", "not JSON"},
           {"[1]", "a schema must be an object or a boolean"},
           {"false", "allows no value"},
           {R"({"type": "string", "pattern": "^a"})", "'pattern' is not supported"},
           {R"({"properties": {"n": {"type": "integer", "minimum": 0}}})", "at '#/properties/n': 'minimum' is not supported"},
           {R"({"type": "strin"})", "unknown type 'strin'"},
           {R"({"$ref": "#/$defs/missing"})", "$ref '#/$defs/missing' does not resolve"},
           {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "refers only to itself"},
           {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "required property 'b' is not in 'properties'"},
           {R"({"type": "array", "minItems": 3, "maxItems": 2})", "'maxItems' is below 'minItems'"},
           {R"({"type": "array", "items": [{}]})", "tuples"},
           {R"({"allOf": [{}, {}]})", "'allOf' of more than one schema"},
           {R"({"enum": []})", "'enum' must be a non-empty array"},
           {R"({"type": "string", "maxLength": -1})", "'maxLength' must be a non-negative integer"},
       }) {
    SCOPED_TRACE(schema);
    EXPECT_KILN_ERROR(JsonSchema::compile(schema), kInvalidArgument, message);
  }
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}" + std::string(100, '}');
  EXPECT_KILN_ERROR(JsonSchema::compile(deep), kInvalidArgument, "nested more than 64 levels");
}

// Masked sampling with random logits under a schema: every finished run parses and
// follows it (checked by hand below), on both tokenizer kinds.
TEST(JsonConstraint, MaskedSamplingFollowsTheSchema) {
  const auto schema = JsonSchema::compile(kPersonSchema);
  for (const testing::TinyModel& tm : testing::tiny_models()) {
    if (tm.name != "f16-qwen2-bpe" && tm.name != "q8_0-llama-spm") continue;
    SCOPED_TRACE(tm.name);
    const std::shared_ptr<const Model> m = testing::load_tiny_model(tm);
    const Tokenizer& tok = m->tokenizer();
    auto vocab = std::make_shared<const JsonVocabulary>(tok);
    std::mt19937 rng(11);
    std::normal_distribution<float> noise(0.0f, 2.0f);
    int closed = 0;
    for (int run = 0; run < 20; ++run) {
      JsonConstraint c(vocab, schema);
      std::string text;
      for (int step = 0; step < 400 && !c.closed(); ++step) {
        std::vector<float> logits(static_cast<size_t>(tok.vocab_size()));
        for (float& l : logits) l = noise(rng);
        if (step > 60)
          for (TokenId id = 0; id < tok.vocab_size(); ++id)
            if (vocab->bytes[static_cast<size_t>(id)].find_first_of("}]\"") != std::string::npos) logits[id] += 8;
        c.mask(logits);
        const TokenId pick = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        ASSERT_TRUE(std::isfinite(logits[pick])) << "the mask left nothing at step " << step << " after: " << text;
        ASSERT_FALSE(vocab->end_of_generation[static_cast<size_t>(pick)]) << text;
        text += vocab->bytes[static_cast<size_t>(pick)];
        c.accept(pick);
      }
      if (!c.closed()) continue;
      ++closed;
      nlohmann::ordered_json j;
      ASSERT_NO_THROW(j = nlohmann::ordered_json::parse(text)) << "'" << text << "'";
      ASSERT_TRUE(j.is_object()) << text;
      ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
      ASSERT_TRUE(j.contains("tags") && j["tags"].is_array()) << text;
      EXPECT_TRUE(j["tags"].size() >= 1 && j["tags"].size() <= 2) << text;
      for (const auto& t : j["tags"]) {
        ASSERT_TRUE(t.is_string()) << text;
        // maxLength counts characters: an escape or a UTF-8 sequence is one.
        const std::string v = t.get<std::string>();
        const auto chars = std::count_if(v.begin(), v.end(), [](char ch) { return (static_cast<uint8_t>(ch) & 0xc0) != 0x80; });
        EXPECT_TRUE(chars >= 1 && chars <= 3) << text;
      }
      const auto absent_or = [&](const char* key, const std::function<bool(const nlohmann::ordered_json&)>& ok) {
        return !j.contains(key) || ok(j[key]);
      };
      EXPECT_TRUE(absent_or("age", [](const auto& v) { return v.is_number_integer(); })) << text;
      EXPECT_TRUE(absent_or("score", [](const auto& v) { return v.is_number() || v.is_null(); })) << text;
      EXPECT_TRUE(absent_or("ok", [](const auto& v) { return v.is_boolean(); })) << text;
      EXPECT_TRUE(absent_or("kind", [](const auto& v) { return v == "cat" || v == "dog" || v == 3 || v.is_null(); })) << text;
      EXPECT_TRUE(absent_or("quo\"te", [](const auto& v) { return v == nlohmann::ordered_json::parse(R"({"a": [1, 2]})"); })) << text;
      std::vector<std::string> order;
      for (const auto& [k, v] : j.items()) order.push_back(k);
      const std::vector<std::string> declared = {"name", "age", "score", "tags", "kind", "ok", "quo\"te"};
      EXPECT_TRUE(std::is_sorted(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
        return std::find(declared.begin(), declared.end(), a) < std::find(declared.begin(), declared.end(), b);
      })) << text;
    }
    EXPECT_GE(closed, 15);
  }
}

// generate() with a schema: sampled runs on a tiny model end "stop" with a value that
// parses and follows it, or "length" with a prefix of one.
TEST(JsonConstraint, GenerateStopsWhenTheValueCloses) {
  const std::shared_ptr<const Model> m = testing::load_tiny_model(testing::tiny_models()[1]);
  GenerateOptions o;
  o.max_tokens = 400;
  o.sampling.temperature = 1.0f;
  o.json = JsonSchema::compile(R"({"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array",
      "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["n", "tags"]})");
  int stopped = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    o.sampling.seed = seed;
    const GenerateResult r = generate(*m, "json:", o);
    SCOPED_TRACE(r.text);
    JsonRecognizer check(o.json.get());
    ASSERT_TRUE(check.feed(r.text));
    if (r.finish_reason != "stop") {
      EXPECT_EQ(r.finish_reason, "length");
      continue;
    }
    ++stopped;
    EXPECT_TRUE(check.closed());
    const nlohmann::json j = nlohmann::json::parse(r.text);
    EXPECT_TRUE(j["n"].is_number_integer());
    EXPECT_LE(j["tags"].size(), 3u);
  }
  EXPECT_GE(stopped, 4);
}

}  // namespace
}  // namespace kiln::llm
