// Fuzzes the tokenizers on arbitrary bytes: encoding must not crash, byte-level BPE must
// round-trip (GPT-2's vocabulary has a token for every byte), and a TextStream must emit
// exactly the decoded text. The vocabularies are llama.cpp's test files
// (scripts/llama-cpp-source.sh unpacks them; the fuzz smoke runs after the venv step).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/llm/gguf.h"
#include "kiln/llm/tokenizer.h"

namespace {
struct Vocabs {
  std::vector<std::shared_ptr<const kiln::llm::GgufFile>> files;
  std::vector<std::shared_ptr<const kiln::llm::Tokenizer>> tokenizers;
  Vocabs() {
    for (const char* name : {"gpt-2", "llama-spm", "llama-bpe", "qwen2"}) {
      files.push_back(kiln::llm::GgufFile::open(std::string(KILN_LLAMA_CPP_DIR) + "/models/ggml-vocab-" + name + ".gguf"));
      tokenizers.push_back(kiln::llm::Tokenizer::from_gguf(*files.back()));
    }
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Vocabs vocabs;
  if (size == 0) return 0;
  const size_t which = data[0] % vocabs.tokenizers.size();
  const bool parse_special = data[0] & 0x80;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const kiln::llm::Tokenizer& tok = *vocabs.tokenizers[which];
  const std::vector<kiln::llm::TokenId> ids = tok.encode(text, true, parse_special);
  for (kiln::llm::TokenId id : ids)
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  const std::string decoded = tok.decode(ids, /*special=*/true);
  if (which == 0 && !parse_special && decoded != text) __builtin_trap();  // gpt-2: lossless
  kiln::llm::TextStream stream(tok, /*special=*/true);
  std::string streamed;
  for (kiln::llm::TokenId id : ids) streamed += stream.push(id);
  const std::string rest = stream.finish();
  if (rest.empty() && streamed != decoded) __builtin_trap();
  return 0;
}
