#pragma once
// A client of kiln serve's (or any OpenAI-compatible server's) streaming completions:
// `kiln generate --server URL` and `kiln chat --server URL` use it.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace kiln::serving {

struct LlmClientResult {
  std::string text;
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;  // when the server reports usage
  double first_text_seconds = 0, seconds = 0;                           // since the request was sent
};

// POSTs `body` (a JSON object that asks for "stream": true and
// "stream_options": {"include_usage": true}) to `url` (http://HOST:PORT) + `path`
// (/v1/completions or /v1/chat/completions) and passes each piece of text to on_text
// as it arrives. An error answer throws the typed error of its status (404 NotFound,
// 400 InvalidArgument, 429 ResourceExhausted, 504 DeadlineExceeded, ...) with the
// server's message; UnavailableError when the server cannot be reached.
LlmClientResult llm_stream(const std::string& url, const std::string& path, const std::string& body,
                           const std::function<void(std::string_view)>& on_text);

}  // namespace kiln::serving
