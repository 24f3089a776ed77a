#pragma once
// Constrained decoding to one JSON object: OpenAI's `response_format: {"type":
// "json_object"}`. A byte-level pushdown recognizer of JSON (RFC 8259: objects, arrays,
// strings with escapes, numbers, true/false/null, whitespace) whose top-level value must
// be an object, and the token mask it implies: before each sample, every token whose
// bytes cannot continue a JSON object from what was generated gets -inf, and the
// end-of-generation tokens are allowed only once the object is complete (then nothing
// else is). The text generated is then a JSON object, or a prefix of one when max_tokens
// cuts it short (finish_reason "length", as OpenAI's).
//
// Cost: the mask walks the vocabulary's token bytes from the current state (a few bytes
// per token), except inside strings, where tokens of plain string content pass at once. Thread-safety: a JsonConstraint is one
// sequence's; its JsonVocabulary (the tokens' bytes, made once per tokenizer) is shared
// read-only.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/llm/tokenizer.h"

namespace kiln::llm {

class JsonRecognizer {
 public:
  // Consumes one byte; false, leaving the state as it was, when no JSON object begins
  // with the bytes so far followed by `c`.
  bool feed(uint8_t c);
  // All of `bytes` or nothing.
  bool feed(std::string_view bytes);
  // The bytes so far are one whole object (whitespace after it allowed).
  bool complete() const { return mode_ == Mode::kDone; }
  // Inside a string, between characters: any whole UTF-8 text without '"', '\\' and
  // control characters continues it.
  bool between_string_characters() const { return mode_ == Mode::kString && utf8_left_ == 0; }

 private:
  enum class Mode : uint8_t {
    kStart,           // before the object: whitespace or '{'
    kValue,           // a value is expected
    kKeyOrClose,      // after '{': a key or '}'
    kKey,             // after ',' in an object: a key
    kColon,           // after a key
    kAfterValue,      // after a value in a container: ',' or its closing bracket
    kValueOrClose,    // after '[': a value or ']'
    kString,          // inside a string (key or value)
    kEscape,          // after a backslash
    kUnicode,         // in \uXXXX (unicode_left hex digits to go)
    kNumber,          // inside a number (number_ says where)
    kLiteral,         // inside true / false / null (literal_ and literal_at_)
    kDone,            // the object is closed: only whitespace
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };
  bool step(uint8_t c);
  void end_value();  // a value ended: back to the container (or done)
  Mode mode_ = Mode::kStart;
  Num number_ = Num::kInt;
  bool in_key_ = false;
  uint8_t unicode_left_ = 0;
  uint8_t utf8_left_ = 0, utf8_lo_ = 0x80, utf8_hi_ = 0xbf;  // a multi-byte character in a string
  const char* literal_ = nullptr;
  uint8_t literal_at_ = 0;
  std::string stack_;  // '{' or '[' per open container (a string: copies of a shallow one do not allocate)
};

// Every token's bytes as generated text, and which tokens end generation: made once per
// tokenizer, shared by the constraints of its sequences.
struct JsonVocabulary {
  explicit JsonVocabulary(const Tokenizer& tokenizer);
  std::vector<std::string> bytes;  // per token ("" for control tokens: never allowed)
  std::vector<uint8_t> end_of_generation;
  // Per token: its bytes are string content (whole UTF-8 characters, no '"', '\\' or
  // control character): inside a string the mask takes them without walking them.
  std::vector<uint8_t> string_content;
};

class JsonConstraint {
 public:
  explicit JsonConstraint(std::shared_ptr<const JsonVocabulary> vocab) : vocab_(std::move(vocab)) {}
  // Sets the logits of the tokens that cannot come next to -inf (one logit per token).
  void mask(std::span<float> logits) const;
  // Advances by the token chosen (one the mask allowed; an end-of-generation token or a
  // token that does not fit changes nothing).
  void accept(TokenId token);
  bool complete() const { return json_.complete(); }

 private:
  std::shared_ptr<const JsonVocabulary> vocab_;
  JsonRecognizer json_;
};

}  // namespace kiln::llm
