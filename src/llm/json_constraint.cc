#include "kiln/llm/json_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace kiln::llm {

namespace {
bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

bool JsonRecognizer::feed(uint8_t c) {
  JsonRecognizer next = *this;
  if (!next.step(c)) return false;
  *this = std::move(next);
  return true;
}

bool JsonRecognizer::feed(std::string_view bytes) {
  JsonRecognizer next = *this;
  for (char c : bytes)
    if (!next.step(static_cast<uint8_t>(c))) return false;
  *this = std::move(next);
  return true;
}

void JsonRecognizer::end_value() { mode_ = stack_.empty() ? Mode::kDone : Mode::kAfterValue; }

bool JsonRecognizer::step(uint8_t c) {
  // The start of a value (after ':', ',' in an array, '[').
  auto start_value = [&]() -> bool {
    switch (c) {
      case '{': stack_.push_back('{'), mode_ = Mode::kKeyOrClose; return true;
      case '[': stack_.push_back('['), mode_ = Mode::kValueOrClose; return true;
      case '"': in_key_ = false, mode_ = Mode::kString; return true;
      case '-': mode_ = Mode::kNumber, number_ = Num::kMinus; return true;
      case '0': mode_ = Mode::kNumber, number_ = Num::kZero; return true;
      case 't': literal_ = "true", literal_at_ = 1, mode_ = Mode::kLiteral; return true;
      case 'f': literal_ = "false", literal_at_ = 1, mode_ = Mode::kLiteral; return true;
      case 'n': literal_ = "null", literal_at_ = 1, mode_ = Mode::kLiteral; return true;
      default:
        if (c >= '1' && c <= '9') {
          mode_ = Mode::kNumber, number_ = Num::kInt;
          return true;
        }
        return false;
    }
  };
  switch (mode_) {
    case Mode::kStart:
      if (is_space(c)) return true;
      if (c != '{') return false;  // the top-level value is an object
      stack_.push_back('{');
      mode_ = Mode::kKeyOrClose;
      return true;
    case Mode::kDone:
      return is_space(c);
    case Mode::kValue:
      return is_space(c) || start_value();
    case Mode::kValueOrClose:
      if (is_space(c)) return true;
      if (c == ']') {
        stack_.pop_back();
        end_value();
        return true;
      }
      return start_value();
    case Mode::kKeyOrClose:
    case Mode::kKey:
      if (is_space(c)) return true;
      if (c == '"') {
        in_key_ = true;
        mode_ = Mode::kString;
        return true;
      }
      if (c == '}' && mode_ == Mode::kKeyOrClose) {
        stack_.pop_back();
        end_value();
        return true;
      }
      return false;
    case Mode::kColon:
      if (is_space(c)) return true;
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kAfterValue: {
      if (is_space(c)) return true;
      const char open = stack_.back();
      if (c == ',') {
        mode_ = open == '{' ? Mode::kKey : Mode::kValue;
        return true;
      }
      if ((open == '{' && c == '}') || (open == '[' && c == ']')) {
        stack_.pop_back();
        end_value();
        return true;
      }
      return false;
    }
    case Mode::kString:
      if (utf8_left_ > 0) {  // inside a multi-byte character
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80, utf8_hi_ = 0xbf;
        return true;
      }
      if (c == '"') {
        if (in_key_) {
          in_key_ = false;
          mode_ = Mode::kColon;
        } else {
          end_value();
        }
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::kEscape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // Strings are UTF-8 (RFC 3629): a lead byte and the range of the byte after it.
      utf8_lo_ = 0x80, utf8_hi_ = 0xbf;
      if (c >= 0xc2 && c <= 0xdf) utf8_left_ = 1;
      else if (c == 0xe0) utf8_left_ = 2, utf8_lo_ = 0xa0;
      else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) utf8_left_ = 2;
      else if (c == 0xed) utf8_left_ = 2, utf8_hi_ = 0x9f;  // (no surrogates)
      else if (c == 0xf0) utf8_left_ = 3, utf8_lo_ = 0x90;
      else if (c >= 0xf1 && c <= 0xf3) utf8_left_ = 3;
      else if (c == 0xf4) utf8_left_ = 3, utf8_hi_ = 0x8f;
      else return false;  // a continuation byte without a lead, C0, C1, F5-FF
      return true;
    case Mode::kEscape:
      if (c == 'u') {
        mode_ = Mode::kUnicode;
        unicode_left_ = 4;
        return true;
      }
      if (std::strchr("\"\\/bfnrt", c) == nullptr || c == 0) return false;
      mode_ = Mode::kString;
      return true;
    case Mode::kUnicode:
      if (!is_hex(c)) return false;
      if (--unicode_left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kLiteral:
      if (c != static_cast<uint8_t>(literal_[literal_at_])) return false;
      if (literal_[++literal_at_] == '\0') end_value();
      return true;
    case Mode::kNumber: {
      bool terminal = false;
      switch (number_) {
        case Num::kMinus:
          if (c == '0') return number_ = Num::kZero, true;
          if (c >= '1' && c <= '9') return number_ = Num::kInt, true;
          return false;
        case Num::kZero:
        case Num::kInt:
          if (number_ == Num::kInt && is_digit(c)) return true;
          if (c == '.') return number_ = Num::kDot, true;
          if (c == 'e' || c == 'E') return number_ = Num::kExp, true;
          terminal = true;
          break;
        case Num::kDot:
          if (is_digit(c)) return number_ = Num::kFrac, true;
          return false;
        case Num::kFrac:
          if (is_digit(c)) return true;
          if (c == 'e' || c == 'E') return number_ = Num::kExp, true;
          terminal = true;
          break;
        case Num::kExp:
          if (c == '+' || c == '-') return number_ = Num::kExpSign, true;
          if (is_digit(c)) return number_ = Num::kExpDigits, true;
          return false;
        case Num::kExpSign:
          if (is_digit(c)) return number_ = Num::kExpDigits, true;
          return false;
        case Num::kExpDigits:
          if (is_digit(c)) return true;
          terminal = true;
          break;
      }
      if (!terminal) return false;
      end_value();  // the number ended before this byte: it belongs to the container
      return step(c);
    }
  }
  return false;
}

JsonVocabulary::JsonVocabulary(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  bytes.resize(static_cast<size_t>(n));
  end_of_generation.assign(static_cast<size_t>(n), 0);
  string_content.assign(static_cast<size_t>(n), 0);
  for (TokenId id = 0; id < n; ++id) {
    const size_t i = static_cast<size_t>(id);
    bytes[i] = tokenizer.token_to_piece(id, /*special=*/false);
    end_of_generation[i] = tokenizer.is_end_of_generation(id) ? 1 : 0;
    // String content: what a recognizer between a string's characters takes whole and
    // leaves between characters again.
    JsonRecognizer r;
    r.feed(std::string_view("{\"\": \""));
    string_content[i] = !bytes[i].empty() && bytes[i].find_first_of("\"\\") == std::string::npos && r.feed(bytes[i]) &&
                        r.between_string_characters();
  }
}

void JsonConstraint::mask(std::span<float> logits) const {
  const JsonVocabulary& v = *vocab_;
  const float ban = -std::numeric_limits<float>::infinity();
  const bool done = json_.complete(), in_string = json_.between_string_characters();
  bool any = false;
  const size_t n = std::min(logits.size(), v.bytes.size());
  for (size_t id = 0; id < n; ++id) {
    bool ok;
    if (v.end_of_generation[id]) {
      ok = done;
    } else if (done || v.bytes[id].empty()) {
      ok = false;  // (a token with no bytes would make no progress)
    } else if (in_string && v.string_content[id]) {
      ok = true;
    } else {
      JsonRecognizer r = json_;
      ok = r.feed(v.bytes[id]);
    }
    if (ok) any = true;
    else logits[id] = ban;
  }
  for (size_t id = n; id < logits.size(); ++id) logits[id] = ban;
  if (!any)  // nothing can continue the object: let the model end rather than sample from nothing
    for (size_t id = 0; id < n; ++id)
      if (v.end_of_generation[id]) logits[id] = 0;
}

void JsonConstraint::accept(TokenId token) {
  if (token < 0 || static_cast<size_t>(token) >= vocab_->bytes.size()) return;
  json_.feed(vocab_->bytes[static_cast<size_t>(token)]);
}

}  // namespace kiln::llm
