// Tokenizers from GGUF metadata: vocabulary, special-token partition, byte-level BPE
// and SentencePiece BPE, decoding (semantics: llama.cpp's llama-vocab.cpp).
#include "kiln/llm/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <queue>
#include <unordered_map>

#include "kiln/core/error.h"
#include "kiln/llm/gguf.h"
#include "llm/pretokenizer.h"

namespace kiln::llm {

using detail::str_cat;

namespace {

size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;  // a stray continuation or invalid lead byte: one byte on its own
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's reversible byte <-> printable code point mapping.
struct ByteMap {
  std::string byte_to_utf8[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteMap() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? b : next++;
      append_utf8(byte_to_utf8[b], cp);
      cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Decodes one UTF-8 code point at s[i] (advancing i); invalid bytes come back as 0xFFFFFFFF.
uint32_t next_cp(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_len(c);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return c < 0x80 ? c : 0xFFFFFFFF;
  }
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

uint64_t pair_key(TokenId a, TokenId b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

struct Tokenizer::Impl {
  Kind kind = Kind::kBytePairGpt2;
  std::string pre;
  std::vector<std::string_view> text;  // views into the GGUF mapping: copied below
  std::vector<std::string> storage;
  std::vector<float> score;
  std::vector<TokenType> type;
  std::unordered_map<std::string_view, TokenId> ids;
  struct Merge {
    int32_t rank;
    TokenId result;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left, right) -> rank, merged token
  std::unique_ptr<PreTokenizer> pretokenizer;
  std::vector<TokenId> specials;  // control / user-defined / unknown tokens, longest text first
  // Specials that swallow the whitespace after them in encode() (Hugging Face's rstrip;
  // llama.cpp's RSTRIP attribute, which it sets for Phi-3 files only); empty: none.
  std::vector<bool> rstrip;
  std::optional<TokenId> bos, eos, unk;
  bool add_bos = false, add_eos = false, add_space_prefix = false, ignore_merges = false;
  std::vector<TokenId> eog;
  TokenId byte_tokens[256];  // SentencePiece's <0xXX> tokens (-1 when absent)

  std::optional<TokenId> lookup(std::string_view s) const {
    auto it = ids.find(s);
    return it == ids.end() ? std::nullopt : std::optional<TokenId>(it->second);
  }
  void check_id(TokenId id) const {
    if (id < 0 || id >= static_cast<TokenId>(text.size()))
      throw OutOfRangeError(str_cat("token id ", id, " is outside the vocabulary of ", text.size(), " tokens"));
  }

  // Byte-level BPE of one pre-tokenized word (already mapped to GPT-2's code points).
  void bpe_word(std::string_view word, std::vector<TokenId>& out) const {
    if (ignore_merges)
      if (auto id = lookup(word)) {
        out.push_back(*id);
        return;
      }
    struct Sym {
      uint32_t begin, len;
      TokenId id;  // -1 when the characters are not a token
      int prev, next;
    };
    std::vector<Sym> syms;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::min(word.size() - i, utf8_len(static_cast<unsigned char>(word[i])));
      const auto id = lookup(word.substr(i, n));
      syms.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(n), id ? *id : -1, static_cast<int>(syms.size()) - 1,
                      static_cast<int>(syms.size()) + 1});
      i += n;
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    struct Bigram {
      int32_t rank;
      int left, right;
      TokenId l_id, r_id, result;
      bool operator>(const Bigram& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Bigram, std::vector<Bigram>, std::greater<Bigram>> queue;
    auto add = [&](int l, int r) {
      if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
      auto it = merges.find(pair_key(syms[l].id, syms[r].id));
      if (it != merges.end()) queue.push({it->second.rank, l, r, syms[l].id, syms[r].id, it->second.result});
    };
    for (size_t i = 1; i < syms.size(); ++i) add(static_cast<int>(i) - 1, static_cast<int>(i));
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Sym& l = syms[b.left];
      Sym& r = syms[b.right];
      if (l.len == 0 || r.len == 0 || l.next != b.right || l.id != b.l_id || r.id != b.r_id) continue;  // stale
      l.len += r.len;
      l.id = b.result;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = b.left;
      add(l.prev, b.left);
      add(b.left, l.next);
    }
    for (int i = 0; i != -1; i = syms[i].next) {
      const Sym& s = syms[i];
      if (s.id >= 0) {
        out.push_back(s.id);
        continue;
      }
      // Not a token: one token per character, as llama.cpp falls back.
      std::string_view chars = word.substr(s.begin, s.len);
      for (size_t k = 0; k < chars.size();) {
        const size_t n = std::min(chars.size() - k, utf8_len(static_cast<unsigned char>(chars[k])));
        if (auto id = lookup(chars.substr(k, n))) out.push_back(*id);
        k += n;
      }
    }
  }

  void bpe_text(std::string_view text, std::vector<TokenId>& out) const {
    const ByteMap& bm = byte_map();
    std::string mapped;
    for (std::string_view word : pretokenizer->split(text)) {
      mapped.clear();
      for (char c : word) mapped += bm.byte_to_utf8[static_cast<unsigned char>(c)];
      bpe_word(mapped, out);
    }
  }

  // SentencePiece BPE: merge the pair whose merged token scores highest, repeatedly.
  void spm_text(std::string_view text, std::vector<TokenId>& out) const {
    struct Sym {
      uint32_t begin, len;
      int prev, next;
    };
    std::vector<Sym> syms;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min(text.size() - i, utf8_len(static_cast<unsigned char>(text[i])));
      syms.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(n), static_cast<int>(syms.size()) - 1,
                      static_cast<int>(syms.size()) + 1});
      i += n;
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    struct Bigram {
      float score;
      int left, right;
      uint32_t size;
      bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
    };
    std::priority_queue<Bigram> queue;
    std::unordered_map<std::string_view, std::pair<int, int>> rev_merge;
    auto add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const std::string_view s = text.substr(syms[l].begin, syms[l].len + syms[r].len);
      const auto id = lookup(s);
      if (!id) return;
      queue.push({score[*id], l, r, static_cast<uint32_t>(s.size())});
      rev_merge[s] = {l, r};
    };
    for (size_t i = 1; i < syms.size(); ++i) add(static_cast<int>(i) - 1, static_cast<int>(i));
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Sym& l = syms[b.left];
      Sym& r = syms[b.right];
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = b.left;
      add(l.prev, b.left);
      add(b.left, l.next);
    }
    // A symbol that is no token is split back along its merges, then into byte tokens.
    auto resegment = [&](auto&& self, const Sym& s) -> void {
      const std::string_view str = text.substr(s.begin, s.len);
      if (auto id = lookup(str)) {
        out.push_back(*id);
        return;
      }
      auto it = rev_merge.find(str);
      if (it == rev_merge.end()) {
        for (char c : str) {
          const TokenId id = byte_tokens[static_cast<unsigned char>(c)];
          if (id >= 0) out.push_back(id);
          else if (unk) out.push_back(*unk);
        }
        return;
      }
      self(self, syms[it->second.first]);
      self(self, syms[it->second.second]);
    };
    for (int i = 0; i != -1; i = syms[i].next) resegment(resegment, syms[i]);
  }

  void encode_text(std::string_view text, bool after_special, std::vector<TokenId>& out) const {
    if (kind == Kind::kBytePairGpt2) {
      bpe_text(text, out);
      return;
    }
    std::string escaped;
    if (add_space_prefix && after_special) escaped = "\xe2\x96\x81";
    for (char c : text) {
      if (c == ' ') escaped += "\xe2\x96\x81";
      else escaped.push_back(c);
    }
    spm_text(escaped, out);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  const std::string model(f.get_string("tokenizer.ggml.model"));
  if (model == "gpt2") {
    t.kind = Kind::kBytePairGpt2;
    t.pre = std::string(f.get_string("tokenizer.ggml.pre", "default"));
    t.pretokenizer = PreTokenizer::for_name(t.pre);
    t.add_bos = t.pre == "llama3" || t.pre == "llama-v3" || t.pre == "llama-bpe" || t.pre == "falcon3";
    t.ignore_merges = t.add_bos;  // llama3's pre-tokenizer family takes whole-word tokens first
  } else if (model == "llama") {
    t.kind = Kind::kSentencePiece;
    t.add_bos = true;
    t.add_space_prefix = true;
  } else {
    throw UnimplementedError(f.name() + ": tokenizer model '" + model + "' is not supported (kiln reads gpt2 and llama)");
  }
  t.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", t.add_bos);
  t.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  t.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", t.add_space_prefix);

  const GgufValue& tokens = f.get_array("tokenizer.ggml.tokens");
  if (tokens.element_type != GgufType::kString || tokens.count == 0 || tokens.count > (1u << 30))
    throw DataLossError(f.name() + ": tokenizer.ggml.tokens must be a non-empty array of strings");
  const size_t n = tokens.strings.size();
  t.text = tokens.strings;  // views into the mapping: the file outlives nothing here, so copy
  t.storage.assign(t.text.begin(), t.text.end());
  for (size_t i = 0; i < n; ++i) t.text[i] = t.storage[i];
  t.score.assign(n, 0.0f);
  t.type.assign(n, TokenType::kNormal);
  if (const GgufValue* s = f.find("tokenizer.ggml.scores")) {
    if (s->type != GgufType::kArray || s->count != n || s->raw == nullptr)
      throw DataLossError(str_cat(f.name(), ": tokenizer.ggml.scores must be ", n, " numbers (one per token)"));
    for (size_t i = 0; i < n; ++i) t.score[i] = static_cast<float>(s->number_at(i));
  }
  if (const GgufValue* ty = f.find("tokenizer.ggml.token_type")) {
    if (ty->type != GgufType::kArray || ty->count != n || ty->raw == nullptr || ty->is_float())
      throw DataLossError(str_cat(f.name(), ": tokenizer.ggml.token_type must be ", n, " integers (one per token)"));
    for (size_t i = 0; i < n; ++i) t.type[i] = static_cast<TokenType>(ty->integer_at(i));
  }
  t.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) t.ids.emplace(t.text[i], static_cast<TokenId>(i));  // the first of duplicates wins

  if (t.kind == Kind::kBytePairGpt2) {
    const GgufValue& merges = f.get_array("tokenizer.ggml.merges");
    if (merges.element_type != GgufType::kString) throw DataLossError(f.name() + ": tokenizer.ggml.merges must be strings");
    t.merges.reserve(merges.strings.size());
    for (size_t r = 0; r < merges.strings.size(); ++r) {
      const std::string_view m = merges.strings[r];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string_view::npos)
        throw DataLossError(str_cat(f.name(), ": merge ", r, " ('", m, "') is not two tokens separated by a space"));
      const auto a = t.lookup(m.substr(0, sp)), b = t.lookup(m.substr(sp + 1));
      if (!a || !b) continue;  // cannot fire: its parts never become symbols
      const auto res = t.lookup(std::string(m.substr(0, sp)) + std::string(m.substr(sp + 1)));
      if (!res) continue;
      t.merges.emplace(pair_key(*a, *b), Impl::Merge{static_cast<int32_t>(r), *res});
    }
  }
  std::fill(std::begin(t.byte_tokens), std::end(t.byte_tokens), -1);
  if (t.kind == Kind::kSentencePiece) {
    char name[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (auto id = t.lookup(name)) t.byte_tokens[b] = *id;
    }
  }

  auto special_id = [&](const char* key) -> std::optional<TokenId> {
    const GgufValue* v = f.find(key);
    if (v == nullptr) return std::nullopt;
    const int64_t id = f.get_int(key);
    if (id < 0 || id >= static_cast<int64_t>(n))
      throw DataLossError(str_cat(f.name(), ": ", key, " = ", id, " is outside the vocabulary of ", n, " tokens"));
    return static_cast<TokenId>(id);
  };
  t.bos = special_id("tokenizer.ggml.bos_token_id");
  t.eos = special_id("tokenizer.ggml.eos_token_id");
  t.unk = special_id("tokenizer.ggml.unknown_token_id");
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (auto id = special_id(key)) t.eog.push_back(*id);
  for (const char* s : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>"})
    if (auto id = t.lookup(s); id && t.type[*id] == TokenType::kControl) t.eog.push_back(*id);
  std::sort(t.eog.begin(), t.eog.end());
  t.eog.erase(std::unique(t.eog.begin(), t.eog.end()), t.eog.end());
  if (t.add_bos && !t.bos) throw DataLossError(f.name() + ": the tokenizer adds a BOS token but tokenizer.ggml.bos_token_id is missing");

  for (size_t i = 0; i < n; ++i)
    if ((t.type[i] == TokenType::kControl || t.type[i] == TokenType::kUserDefined || t.type[i] == TokenType::kUnknown) &&
        !t.text[i].empty())
      t.specials.push_back(static_cast<TokenId>(i));
  std::stable_sort(t.specials.begin(), t.specials.end(),
                   [&](TokenId a, TokenId b) { return t.text[a].size() > t.text[b].size(); });
  // Phi-3's added tokens are rstrip in its tokenizer.json, which GGUF does not carry:
  // llama.cpp recognises the model by name and marks every special token but <unk>, <s>
  // and <|endoftext|>, so "<|user|>\nHi<|end|>\n" reads as <|user|> Hi <|end|>.
  std::string name(f.get_string("general.name", ""));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    t.rstrip.assign(n, false);
    for (TokenId id : t.specials) t.rstrip[static_cast<size_t>(id)] = true;
    for (const char* keep : {"<unk>", "<s>", "<|endoftext|>"})
      if (auto id = t.lookup(keep)) t.rstrip[static_cast<size_t>(*id)] = false;
  }
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Kind Tokenizer::kind() const { return impl_->kind; }
const std::string& Tokenizer::pre() const { return impl_->pre; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->text.size()); }
std::optional<TokenId> Tokenizer::bos() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
const std::vector<TokenId>& Tokenizer::end_of_generation() const { return impl_->eog; }
bool Tokenizer::is_end_of_generation(TokenId id) const {
  return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}
std::optional<TokenId> Tokenizer::find(std::string_view text) const { return impl_->lookup(text); }
std::string_view Tokenizer::token_text(TokenId id) const {
  impl_->check_id(id);
  return impl_->text[id];
}
TokenType Tokenizer::token_type(TokenId id) const {
  impl_->check_id(id);
  return impl_->type[id];
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& t = *impl_;
  // Fragments: raw text, or a special token found in it (longest special first).
  struct Fragment {
    std::string_view text;
    TokenId token;  // -1: raw text
  };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({text, -1});
  for (TokenId sid : t.specials) {
    if (!parse_special && t.type[sid] != TokenType::kUserDefined) continue;
    const std::string_view st = t.text[sid];
    std::vector<Fragment> next;
    bool any = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = 0;
      for (size_t hit; (hit = f.text.find(st, pos)) != std::string_view::npos; pos = hit + st.size()) {
        if (hit > pos) next.push_back({f.text.substr(pos, hit - pos), -1});
        next.push_back({{}, sid});
        any = true;
      }
      if (pos < f.text.size()) next.push_back({f.text.substr(pos), -1});
    }
    if (any) frags.swap(next);
  }

  std::vector<TokenId> out;
  if (add_special && t.add_bos) out.push_back(*t.bos);
  bool after_special = true, strip = false;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      strip = !t.rstrip.empty() && t.rstrip[static_cast<size_t>(f.token)];
    } else {
      std::string_view raw = f.text;
      if (strip)
        while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.front()))) raw.remove_prefix(1);
      strip = false;
      if (raw.empty()) continue;
      t.encode_text(raw, after_special, out);
      after_special = false;
    }
  }
  if (add_special && t.add_eos && t.eos) out.push_back(*t.eos);
  return out;
}

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
  const Impl& t = *impl_;
  t.check_id(id);
  const std::string_view text = t.text[id];
  switch (t.type[id]) {
    case TokenType::kControl: return special ? std::string(text) : std::string();
    case TokenType::kUserDefined: return std::string(text);
    case TokenType::kUnused: return std::string();
    case TokenType::kByte:
      if (text.size() == 6 && text.substr(0, 3) == "<0x") return std::string(1, static_cast<char>(std::stoi(std::string(text.substr(3, 2)), nullptr, 16)));
      return std::string(text);
    default: break;
  }
  std::string out;
  if (t.kind == Kind::kSentencePiece) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 3, "\xe2\x96\x81") == 0) {
        out.push_back(' ');
        i += 2;
      } else {
        out.push_back(text[i]);
      }
    }
    return out;
  }
  const ByteMap& bm = byte_map();
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    const uint32_t cp = next_cp(text, i);
    auto it = bm.cp_to_byte.find(cp);
    if (it != bm.cp_to_byte.end()) out.push_back(static_cast<char>(it->second));
    else out.append(text.substr(at, i - at));  // not a byte-level character: kept as it is
  }
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool special) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i], special);
    if (i == 0 && impl_->add_space_prefix && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    out += piece;
  }
  return out;
}

TextStream::TextStream(const Tokenizer& tokenizer, bool special) : tokenizer_(tokenizer), special_(special) {}

std::string TextStream::push(TokenId id) {
  std::string piece = tokenizer_.token_to_piece(id, special_);
  if (first_ && tokenizer_.kind() == Tokenizer::Kind::kSentencePiece && tokenizer_.add_bos() && !piece.empty()) {
    if (piece[0] == ' ') piece.erase(0, 1);
  }
  if (!piece.empty() || tokenizer_.token_type(id) != TokenType::kControl) first_ = false;
  pending_ += piece;
  // Emit everything up to the last complete character; hold an incomplete tail back.
  size_t cut = pending_.size();
  for (size_t back = 1; back <= 4 && back <= pending_.size(); ++back) {
    const auto c = static_cast<unsigned char>(pending_[pending_.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    if (c >= 0xC0 && utf8_len(c) > back) cut = pending_.size() - back;  // its character is not complete yet
    break;
  }
  std::string ready = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return ready;
}

std::string TextStream::finish() {
  std::string rest;
  if (!pending_.empty()) rest = "\xef\xbf\xbd";  // U+FFFD for the incomplete character
  pending_.clear();
  return rest;
}

}  // namespace kiln::llm
