// libFuzzer target: JSON Schema compilation and the schema-driven recognizer
// (src/llm/json_constraint.cc). Input: schema text, a NUL byte, then document bytes. Any
// schema must compile or throw InvalidArgumentError; a compiled one must take the
// document's bytes one by one without crashing, refuse all-or-nothing, and say closed
// only when complete.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kiln/core/error.h"
#include "kiln/llm/json_constraint.h"

using namespace kiln;
using namespace kiln::llm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t schema_size = nul ? static_cast<size_t>(nul - data) : size;
  std::shared_ptr<const JsonSchema> schema;
  try {
    schema = JsonSchema::compile(std::string_view(reinterpret_cast<const char*>(data), schema_size));
  } catch (const InvalidArgumentError&) {
    return 0;
  }
  if (nul == nullptr) return 0;
  JsonRecognizer r(schema.get());
  for (const uint8_t* p = nul + 1; p < data + size; ++p) {
    JsonRecognizer before = r;
    if (!r.feed(*p)) {
      // Refused: the state is unchanged (it takes what `before` takes).
      if (r.complete() != before.complete() || r.closed() != before.closed()) std::abort();
      continue;
    }
    if (r.closed() && !r.complete()) std::abort();
  }
  return 0;
}
