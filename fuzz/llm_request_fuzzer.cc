// libFuzzer target: OpenAI request bodies -> LlmRequest (src/serving/llm_request.cc), as
// chat (first byte even) or completions. Any input must either parse or throw
// InvalidArgumentError (RequestFieldError naming a field); a parsed request must hold
// what the parser promises (n in range, stop strings non-empty, a model, an input), and
// active tools come with the answer's schema; the body, fed to the tools' response
// streamer in pieces, decodes to at most 3 bytes per byte.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "serving/llm_request.h"

using namespace kiln;
using namespace kiln::serving;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] % 2 == 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  // The tools' response streamer takes any text in any pieces (it is fed the model's).
  ResponseStreamer streamer;
  size_t decoded = 0;
  for (size_t i = 0; i < body.size(); i += 1 + data[0] % 7) decoded += streamer.feed(body.substr(i, 1 + data[0] % 7)).size();
  if (decoded > 3 * body.size()) std::abort();  // at most 3 bytes (U+FFFD) per byte read
  try {
    const LlmRequest r = parse_llm_request(body, chat);
    if (r.n < 1 || r.n > kMaxChoices) std::abort();
    for (const auto& s : r.stop)
      if (s.empty()) std::abort();
    if (chat && r.messages.empty()) std::abort();
    if (r.prompt_is_tokens && !r.prompt.empty()) std::abort();
    if (r.max_tokens && *r.max_tokens < 1) std::abort();
    if (r.sampling.top_p <= 0 || r.sampling.top_p > 1 || r.sampling.temperature < 0) std::abort();
    if (r.tools.active() != (r.tool_schema != nullptr)) std::abort();
    if (r.tools.active() && with_tool_instructions(r.messages, r.tools, false).size() < r.messages.size()) std::abort();
  } catch (const InvalidArgumentError&) {
  }
  return 0;
}
