#pragma once
// The regex pre-tokenizer of byte-level BPE: splits text into words with a list of
// patterns applied one after another, each splitting every piece the previous one left
// (matches and the gaps between them are both pieces, as llama.cpp does). PCRE2 with
// Unicode properties (\p{L}, \p{N}), look-ahead and JIT; invalid UTF-8 never matches a
// pattern and so stays in the gaps.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::llm {

class PreTokenizer {
 public:
  // The patterns llama.cpp uses for the pre-tokenizer `name` (tokenizer.ggml.pre).
  // UnimplementedError listing the known names for another.
  static std::unique_ptr<PreTokenizer> for_name(const std::string& name);
  explicit PreTokenizer(const std::vector<std::string>& patterns);  // InternalError if one does not compile
  ~PreTokenizer();
  // Words of `text` as views into it, in order; their concatenation is `text`.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Pattern;
  std::vector<std::unique_ptr<Pattern>> patterns_;
};

}  // namespace kiln::llm
