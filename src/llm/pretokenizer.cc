// Pre-tokenizer regexes on PCRE2 (UTF + UCP, JIT-compiled).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "llm/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln::llm {
namespace {

// The regexes, as llama.cpp adapts them from each model's tokenizer.json.
const char* const kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const char* const kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Family {
  std::vector<std::string> names;
  std::vector<std::string> patterns;
};

const std::vector<Family>& families() {
  static const std::vector<Family> kFamilies = {
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais"}, {kGpt2}},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}, {R"(\p{N})", kGpt2}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {kQwen2}},
      {{"qwen35"},
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      // o200k (Phi-4-mini, Llama 4): words split at case changes, as llama.cpp's form of
      // it (an upper-case run is any letter but a-z, a lower-case one any but A-Z).
      {{"gpt-4o", "llama4", "kanana2", "talkie"},
       {R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
  };
  return kFamilies;
}

}  // namespace

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }
};

std::unique_ptr<PreTokenizer> PreTokenizer::for_name(const std::string& name) {
  std::string known;
  for (const Family& f : families()) {
    for (const std::string& n : f.names) {
      if (n == name) return std::make_unique<PreTokenizer>(f.patterns);
      known += (known.empty() ? "" : ", ") + n;
    }
  }
  throw UnimplementedError("pre-tokenizer '" + name + "' is not supported (kiln knows: " + known + ")");
}

PreTokenizer::PreTokenizer(const std::vector<std::string>& patterns) {
  for (const std::string& p : patterns) {
    int err = 0;
    PCRE2_SIZE at = 0;
    auto pat = std::make_unique<Pattern>();
    pat->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
    if (pat->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw InternalError("pre-tokenizer regex does not compile at " + std::to_string(at) + ": " +
                          reinterpret_cast<const char*>(msg) + ": " + p);
    }
    pcre2_jit_compile(pat->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
    patterns_.push_back(std::move(pat));
  }
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const auto& pat : patterns_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(pat->code, nullptr);
    if (md == nullptr) throw ResourceExhaustedError("pre-tokenizer: out of memory");
    next.clear();
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0, gap = 0;
      while (pos < piece.size()) {
        const int rc = pcre2_match(pat->code, subject, piece.size(), pos, 0, md, nullptr);
        if (rc < 0) break;  // no more matches (or a match error: the rest is one gap)
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t b = ov[0], e = ov[1];
        if (e == b) {  // an empty match: step over one character
          pos = b + 1;
          while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (b > gap) next.push_back(piece.substr(gap, b - gap));
        next.push_back(piece.substr(b, e - b));
        gap = pos = e;
      }
      if (gap < piece.size()) next.push_back(piece.substr(gap));
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace kiln::llm
