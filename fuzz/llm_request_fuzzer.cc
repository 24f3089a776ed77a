// libFuzzer target: OpenAI request bodies -> LlmRequest (src/serving/llm_request.cc), as
// chat (first byte even) or completions. Any input must either parse or throw
// InvalidArgumentError (RequestFieldError naming a field); a parsed request must hold
// what the parser promises (n in range, stop strings non-empty, a model, an input), and
// active tools come with the answer's schema; the body, fed to the tools' answer streamer
// in pieces, gives at most 3 bytes per byte and, read as a whole tools answer, the same
// calls' arguments.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "serving/llm_request.h"

using namespace kiln;
using namespace kiln::serving;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] % 2 == 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  // The tools' answer streamer takes any text in any pieces (it is fed the model's); what
  // it gives joins, call by call, to what parse_tool_answer reads from the whole text.
  AnswerStreamer streamer;
  size_t given = 0;
  std::map<size_t, std::string> args;  // by the call's index
  for (size_t i = 0; i < body.size(); i += 1 + data[0] % 7) {
    const AnswerStreamer::Delta d = streamer.feed(body.substr(i, 1 + data[0] % 7));
    given += d.content.size();
    for (const AnswerStreamer::CallPiece& p : d.calls) {
      given += p.name.size() + p.arguments.size();
      if (p.begins == args.count(p.index) > 0) std::abort();  // named once, before its arguments
      args[p.index] += p.arguments;
    }
  }
  if (given > 3 * body.size()) std::abort();  // at most 3 bytes (U+FFFD) per byte read
  const ToolAnswer whole = parse_tool_answer(body, false);
  if (whole.parsed && !whole.calls.empty()) {
    if (whole.calls.size() != args.size()) std::abort();
    for (size_t k = 0; k < args.size(); ++k)
      if (!args.count(k) || whole.calls[k].arguments != args[k]) std::abort();
  }
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
