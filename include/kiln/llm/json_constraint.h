#pragma once
// Constrained decoding to JSON: OpenAI's `response_format: {"type": "json_object"}` (any
// JSON object) and `{"type": "json_schema", "json_schema": {"schema": ...}}` (a value
// valid under a JSON Schema). A byte-level recognizer of JSON (RFC 8259: objects, arrays,
// strings with escapes, UTF-8, numbers, true/false/null, whitespace) driven by a compiled
// schema, and the token mask it implies: before each sample, every token whose bytes
// cannot continue a valid document from what was generated gets -inf, and the
// end-of-generation tokens are allowed only once the value is complete (then nothing else
// is). The text generated is then a valid document, or a prefix of one when max_tokens
// cuts it short (finish_reason "length", as OpenAI's).
//
// The schema subset (JsonSchema::compile; anything else is an InvalidArgumentError naming
// the keyword and where it is, never silently ignored when it would constrain values):
//   type (a name or a list of names), properties, required, additionalProperties,
//   items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf (as anyOf:
//   alternatives are not checked for exclusivity), allOf of one schema, $ref to "#",
//   "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed), true / {} (any value).
//   Annotations are ignored: title, description, default, examples, format (an annotation
//   in JSON Schema 2020-12), $schema, $id, $comment, deprecated, readOnly, writeOnly.
// What is generated for an object with `properties`: its keys in the schema's order,
// each at most once, every required one present; keys not declared are not generated
// (additionalProperties allows them, it does not ask for them). An object schema without
// `properties` takes any keys (values: additionalProperties' schema, else anything),
// unless additionalProperties is false (then only {}). Under anyOf the recognizer follows
// every alternative the bytes fit (at most 64 readings at once: beyond that some valid
// continuations are masked, the output stays valid). Enum and const values are written
// in compact JSON (no whitespace inside). Whitespace is free elsewhere, as JSON allows.
// Numbers stay what every reader takes: at most 16 integer digits (18 for "integer": an
// int64), 16 fraction digits and 2 exponent digits. Containers nest at most 64 deep.
//
// Cost: the mask walks the vocabulary as a trie (a prefix shared by many tokens is fed
// once, and a prefix refused refuses them all); inside a string without
// a length limit, tokens of plain string content pass at once and only the others are
// walked (with a maxLength: those of no more characters than are left); the walk reuses its
// buffers and allocates nothing. Thread-safety: a JsonConstraint is one sequence's (its
// mask() writes its own buffers: one thread at a time); its
// JsonVocabulary (the tokens' bytes, made once per tokenizer) and JsonSchema are shared
// read-only.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/llm/tokenizer.h"

namespace kiln::llm {

// A compiled JSON Schema: a graph of nodes (references make it cyclic).
class JsonSchema {
 public:
  // InvalidArgumentError for text that is not JSON, a schema that is not an object or a
  // boolean, a keyword this subset cannot enforce, a $ref that does not resolve, or more
  // than 10,000 nodes; the message names the place as a JSON pointer.
  static std::shared_ptr<const JsonSchema> compile(std::string_view schema_json);
  // Any JSON object (json_object).
  static std::shared_ptr<const JsonSchema> any_object();

  struct Property {
    std::string key;  // the key as generated: JSON-escaped, then the closing quote
    int32_t node = -1;
    bool required = false;
  };
  struct Node {
    enum class Kind : uint8_t { kAny, kObject, kArray, kString, kNumber, kInteger, kLiterals, kUnion, kRef };
    Kind kind = Kind::kAny;
    std::vector<Property> properties;     // kObject, in the schema's order
    std::vector<int32_t> next_required;   // kObject: the first required property at or after i (size n + 1)
    std::vector<int32_t> keys_sorted;     // kObject: property indices by key bytes
    bool free_keys = false;               // kObject without properties: any key
    int32_t values = -1;                  // kObject with free keys: their values' node (-1: any)
    int32_t items = -1;                   // kArray: the items' node (-1: any)
    int64_t min = 0, max = -1;            // kArray items, kString characters (-1: no limit)
    std::vector<std::string> literals;    // kLiterals: compact JSON texts, sorted
    std::vector<int32_t> alternatives;    // kUnion
    int32_t target = -1;                  // kRef (resolved after compiling)
  };
  const Node& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
  int32_t root() const { return root_; }
  size_t size() const { return nodes_.size(); }

 private:
  friend class JsonSchemaCompiler;
  std::vector<Node> nodes_;
  int32_t root_ = -1;
};

class JsonRecognizer {
 public:
  // Any JSON object (the schema of json_object).
  JsonRecognizer();
  // A value valid under `schema` (kept alive by the caller).
  explicit JsonRecognizer(const JsonSchema* schema);
  // Consumes one byte; false, leaving the state as it was, when no valid document begins
  // with the bytes so far followed by `c`.
  bool feed(uint8_t c);
  // All of `bytes` or nothing.
  bool feed(std::string_view bytes);
  // Consumes one byte without keeping the state to return to: on false the recognizer
  // accepts nothing any more (the mask's walk, which copies before it tries).
  bool advance(uint8_t c);
  // The bytes so far are one whole valid value (whitespace after it allowed): the text
  // may end here.
  bool complete() const;
  // Complete, and nothing but whitespace can follow (a top-level number or enum literal
  // may still go on while complete).
  bool closed() const;
  // Inside a string, between characters: any whole UTF-8 text without '"', '\\' and
  // control characters continues it, up to string_room() characters (-1: no limit).
  bool between_string_characters() const;
  int64_t string_room() const;

  enum class Mode : uint8_t;
  struct Frame {
    int32_t node;    // the container's schema node (-1: any)
    int32_t cursor;  // object: the next property that may come; array: items so far
    bool array;
  };
  // The containers open around a reading, innermost last, in place (the mask copies
  // readings at every node of its walk: no allocation), at most kMaxDepth of them: a
  // value nested deeper is not generated.
  class FrameStack {
   public:
    static constexpr size_t kMaxDepth = 64;
    FrameStack() = default;
    FrameStack(const FrameStack& o) : n_(o.n_) { std::copy_n(o.f_, n_, f_); }
    FrameStack& operator=(const FrameStack& o) {
      n_ = o.n_;
      std::copy_n(o.f_, n_, f_);
      return *this;
    }
    bool empty() const { return n_ == 0; }
    size_t size() const { return n_; }
    bool full() const { return n_ == kMaxDepth; }
    Frame& back() { return f_[n_ - 1]; }
    const Frame& back() const { return f_[n_ - 1]; }
    const Frame& operator[](size_t i) const { return f_[i]; }
    void push_back(const Frame& f) { f_[n_++] = f; }  // (not full)
    void pop_back() { --n_; }

   private:
    Frame f_[kMaxDepth];  // [0, n_) set
    uint32_t n_ = 0;
  };
  // One reading of the bytes so far; unions make several.
  struct Path {
    FrameStack stack;
    Mode mode{};
    int32_t node = -1;  // the schema of the value, string, literal or key being read (-1: any)
    int32_t lo = 0, hi = 0;  // literals and keys: the candidates [lo, hi); number: fraction digits (lo)
    int32_t at = 0;          // literals and keys: the byte position; number: exponent digits
    int64_t chars = 0;       // string: characters so far; number: integer digits
    uint8_t num = 0;                 // number: where in the grammar
    uint8_t utf8_left = 0, utf8_lo = 0x80, utf8_hi = 0xbf, unicode_left = 0;
    bool in_key = false, integer = false;
  };
  // advance() with the caller's buffer for the next readings (it gets this one's old
  // buffer back): a walk that reuses one buffer allocates nothing.
  bool advance(uint8_t c, std::vector<Path>& spare);

 private:
  void step(Path p, uint8_t c, std::vector<Path>& out) const;
  void start_value(Path p, int32_t node, uint8_t c, std::vector<Path>& out) const;
  void end_value(Path& p) const;
  const JsonSchema* schema_;
  std::vector<Path> paths_;
};

// Every token's bytes as generated text, and which tokens end generation: made once per
// tokenizer, shared by the constraints of its sequences.
struct JsonVocabulary {
  explicit JsonVocabulary(const Tokenizer& tokenizer);
  std::vector<std::string> bytes;  // per token ("" for control tokens: never allowed)
  std::vector<uint8_t> end_of_generation;
  // Per token: its bytes are string content (whole UTF-8 characters, no '"', '\\' or
  // control character): inside a string the mask takes them without walking them (where
  // the string has a maxLength, those of at most the characters left).
  std::vector<uint8_t> string_content;
  std::vector<uint16_t> string_chars;  // string content: its characters (UTF-8 code points)
  // The tokens by their bytes as a trie, which the mask walks: a prefix shared by many
  // tokens is fed once, and a prefix refused refuses them all without touching them.
  struct Trie {
    struct Node {
      uint32_t first_child = 0, first_token = 0;  // into nodes, tokens
      uint16_t children = 0, tokens = 0;          // a node's children are contiguous
      uint8_t byte = 0;                           // the byte that leads here from the parent
    };
    std::vector<Node> nodes;      // nodes[0]: the root (no bytes)
    std::vector<TokenId> tokens;  // by node: the tokens whose bytes end there
  };
  Trie all, not_content;  // every token with bytes; those that are not string content
  size_t max_bytes = 0;   // the longest token's
};

class JsonConstraint {
 public:
  // A JSON object, or a value under `schema` when given.
  explicit JsonConstraint(std::shared_ptr<const JsonVocabulary> vocab, std::shared_ptr<const JsonSchema> schema = nullptr);
  // Sets the logits of the tokens that cannot come next to -inf (one logit per token).
  void mask(std::span<float> logits) const;
  // Advances by the token chosen (one the mask allowed; an end-of-generation token or a
  // token that does not fit changes nothing).
  void accept(TokenId token);
  bool complete() const { return json_.complete(); }
  bool closed() const { return json_.closed(); }

 private:
  std::shared_ptr<const JsonVocabulary> vocab_;
  std::shared_ptr<const JsonSchema> schema_;
  JsonRecognizer json_;
  // The mask's walk: a recognizer per byte of depth and the readings' spare buffer.
  mutable std::vector<JsonRecognizer> scratch_;
  mutable std::vector<JsonRecognizer::Path> spare_;
  mutable std::vector<uint8_t> ok_;  // per token: allowed
};

}  // namespace kiln::llm
