#pragma once
// Tokenizers built from a GGUF file's `tokenizer.*` metadata, matching llama.cpp's:
//  - byte-level BPE (`tokenizer.ggml.model` = "gpt2"): pre-tokenizer regexes chosen by
//    `tokenizer.ggml.pre` (smollm, llama3, qwen2, gpt2, starcoder, default ...), GPT-2's
//    byte-to-unicode mapping, merges by rank;
//  - SentencePiece BPE ("llama"): whitespace as U+2581, an added leading space, merges
//    by score, unknown characters as <0xXX> byte tokens.
// Special tokens (control and user-defined) are matched in the text before either.
//
// Thread-safety: immutable after construction; encode/decode may run concurrently.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::llm {

class GgufFile;
using TokenId = int32_t;

// GGUF's `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  enum class Kind { kBytePairGpt2, kSentencePiece };

  // Reads the vocabulary of `file`. UnimplementedError naming the tokenizer model or
  // pre-tokenizer kiln does not know; DataLossError for inconsistent metadata (arrays
  // of different lengths, special ids outside the vocabulary, malformed merges).
  static std::shared_ptr<const Tokenizer> from_gguf(const GgufFile& file);
  ~Tokenizer();

  Kind kind() const;
  const std::string& pre() const;  // the pre-tokenizer's name ("smollm"), "" for SentencePiece
  int32_t vocab_size() const;

  // Text to token ids. add_special: BOS (and EOS) as the file asks (tokenizer.ggml.
  // add_bos_token / add_eos_token, else llama.cpp's default for the kind). parse_special:
  // control tokens written in the text ("<|im_start|>") become those tokens; otherwise
  // they are tokenized as text. Any bytes are accepted (invalid UTF-8 included).
  std::vector<TokenId> encode(std::string_view text, bool add_special = true, bool parse_special = false) const;

  // The bytes of one token (possibly part of a UTF-8 character). Control tokens give ""
  // unless `special`. OutOfRangeError for an id outside the vocabulary.
  std::string token_to_piece(TokenId id, bool special = false) const;
  // Concatenated pieces; SentencePiece's added leading space is removed, as decoders do.
  std::string decode(std::span<const TokenId> ids, bool special = false) const;

  std::string_view token_text(TokenId id) const;  // as stored in the file
  TokenType token_type(TokenId id) const;
  std::optional<TokenId> find(std::string_view text) const;

  std::optional<TokenId> bos() const;
  std::optional<TokenId> eos() const;
  bool add_bos() const;
  bool add_eos() const;
  // End of generation: EOS, EOT, EOM and the control tokens that chat models end turns with.
  bool is_end_of_generation(TokenId id) const;
  const std::vector<TokenId>& end_of_generation() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streams decoded text: the bytes of a UTF-8 character split across tokens are held back
// until the character is complete, so every string push() returns is valid UTF-8.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer, bool special = false);
  std::string push(TokenId id);
  // What is held back at the end (an incomplete character becomes U+FFFD).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace kiln::llm
