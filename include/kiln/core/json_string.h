#pragma once
// JSON string literals: what every JSON writer in kiln (the REST codec, the OpenAI API,
// chat templates' tojson) appends for a string.
#include <cstddef>
#include <string>
#include <string_view>

namespace kiln {

// Appends s as a JSON string literal: quotes, backslashes and control characters
// escaped (\n, \t ... or \u00XX), other characters as they are (UTF-8); bytes that are
// not valid UTF-8 become \ufffd, so the output is always valid JSON.
void append_json_string(std::string& out, std::string_view s);
inline std::string json_string(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

// Length of the valid UTF-8 sequence at s[i] (i < s.size(), s[i] >= 0x80); 0 if it is
// not one (truncated, overlong, a surrogate, past U+10FFFF).
size_t utf8_sequence_length(std::string_view s, size_t i);

}  // namespace kiln
