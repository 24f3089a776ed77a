// Tokenizers against llama.cpp's own vocabulary tests (models/ggml-vocab-*.gguf with the
// token ids of each .inp string in .out, from the llama-cpp-python sdist that
// scripts/llama-cpp-source.sh unpacks) and the real SmolLM2 vocabulary.
#include "kiln/llm/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/llm/gguf.h"
#include "llm/gguf_builder.h"
#include "llm/pretokenizer.h"
#include "llm/llm_test_util.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

const std::string kModels = std::string(kiln::testing::llama_cpp_dir()) + "/models/";

struct VocabCase {
  std::string text;
  std::vector<TokenId> ids;
};

// llama.cpp's layout: inputs separated by a marker line in .inp, one line of ids per input in .out.
std::vector<VocabCase> read_cases(const std::string& base) {
  const std::string inp = read_file(base + ".inp"), out = read_file(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<VocabCase> cases;
  std::istringstream lines(out);
  std::string line;
  for (size_t i = 0; std::getline(lines, line); ++i) {
    if (i >= texts.size()) break;
    VocabCase c{texts[i], {}};
    std::istringstream ids(line);
    for (TokenId id; ids >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << base;
  return cases;
}

class LlamaCppVocab : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaCppVocab, MatchesExpectedTokenIds) {
  const std::string base = kModels + "ggml-vocab-" + GetParam() + ".gguf";
  ASSERT_TRUE(std::filesystem::exists(base)) << base << " is missing: run scripts/python-venv.sh (it runs scripts/llama-cpp-source.sh)";
  auto file = GgufFile::open(base);
  auto tok = Tokenizer::from_gguf(*file);
  const std::vector<VocabCase> cases = read_cases(base);
  ASSERT_GT(cases.size(), 20u);
  int wrong = 0;
  for (const VocabCase& c : cases) {
    const std::vector<TokenId> got = tok->encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    if (got != c.ids && wrong++ < 5) {
      std::ostringstream g, w;
      for (TokenId id : got) g << id << ' ';
      for (TokenId id : c.ids) w << id << ' ';
      ADD_FAILURE() << "text '" << c.text << "'\n  kiln:      " << g.str() << "\n  llama.cpp: " << w.str();
    }
    // Byte-level BPE is lossless; SentencePiece loses only the added leading space.
    if (tok->kind() == Tokenizer::Kind::kBytePairGpt2) {
      EXPECT_EQ(tok->decode(got), c.text);
    }
  }
  EXPECT_EQ(wrong, 0) << wrong << " of " << cases.size() << " strings differ";
}

INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaCppVocab,
                         ::testing::Values("gpt-2", "llama-bpe", "llama-spm", "phi-3", "qwen2", "qwen35", "starcoder",
                                           "refact", "command-r", "mpt", "falcon"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// o200k's pre-tokenizer (Phi-4-mini, Llama 4; no vocabulary test of it in llama.cpp):
// hand-split with its pattern. Words break where lower case turns to upper ("HelloWorld"),
// an upper-case run keeps the lower-case letters after it ("CAPSLock"), any letter
// outside A-Z / a-z counts as either case (as llama.cpp's form of the pattern has it),
// digits go in threes, a contraction stays on its word.
TEST(PreTokenizer, Gpt4oSplitsWordsAtCaseChanges) {
  const auto pre = PreTokenizer::for_name("gpt-4o");
  const auto split = [&](std::string_view text) {
    std::vector<std::string> out;
    for (std::string_view piece : pre->split(text)) out.emplace_back(piece);
    return out;
  };
  EXPECT_EQ(split("HelloWorld's CAPSLock don'T"), (std::vector<std::string>{"Hello", "World's", " CAPSLock", " don'T"}));
  EXPECT_EQ(split(" \xc3\x89" "coleNormale 12345 x/y\n\nz"),  // (É)
            (std::vector<std::string>{" \xc3\x89" "cole", "Normale", " ", "123", "45", " x", "/y", "\n\n", "z"}));
  EXPECT_EQ(split("a  b\t"), (std::vector<std::string>{"a", " ", " b", "\t"}));
  EXPECT_EQ(split("\xce\xb1\xce\x92\xce\xb3"), (std::vector<std::string>{"\xce\xb1\xce\x92\xce\xb3"}));  // Greek: no A-Z
}

// 300 varied strings tokenized by llama.cpp's llama-tokenize on the real SmolLM2 file
// (bench/peers/make_llm_fixtures.py): special tokens parsed, BOS as the file says.
TEST(Tokenizer, SmolLM2MatchesLlamaCpp) {
  auto file = GgufFile::open(testing::smollm2_path());
  auto tok = Tokenizer::from_gguf(*file);
  const std::vector<VocabCase> cases = read_cases(kiln::testing::fixture("llm/smollm2.tokens"));
  ASSERT_GE(cases.size(), 300u);
  int wrong = 0;
  for (const VocabCase& c : cases) {
    const std::vector<TokenId> got = tok->encode(c.text, /*add_special=*/true, /*parse_special=*/true);
    if (got != c.ids && wrong++ < 5) {
      std::ostringstream g, w;
      for (TokenId id : got) g << id << ' ';
      for (TokenId id : c.ids) w << id << ' ';
      ADD_FAILURE() << "text '" << c.text << "'\n  kiln:      " << g.str() << "\n  llama.cpp: " << w.str();
    }
    EXPECT_EQ(tok->decode(got, /*special=*/true), c.text);
  }
  EXPECT_EQ(wrong, 0) << wrong << " of " << cases.size() << " strings differ";
}

TEST(Tokenizer, SmolLM2SpecialTokensAndRoundTrip) {
  auto file = GgufFile::open(testing::smollm2_path());
  auto tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok->kind(), Tokenizer::Kind::kBytePairGpt2);
  EXPECT_EQ(tok->pre(), "smollm");
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->is_end_of_generation(2));
  EXPECT_EQ(tok->token_text(1), "<|im_start|>");

  // Control tokens in text are text unless parse_special.
  const std::string chat = "<|im_start|>user\nHi<|im_end|>";
  const std::vector<TokenId> parsed = tok->encode(chat, false, true);
  ASSERT_GE(parsed.size(), 4u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  const std::vector<TokenId> plain = tok->encode(chat, false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(tok->decode(plain), chat);
  EXPECT_EQ(tok->decode(parsed), "user\nHi");  // control tokens are not text
  EXPECT_EQ(tok->decode(parsed, /*special=*/true), chat);

  // smollm splits digits one by one.
  const std::vector<TokenId> digits = tok->encode("12345", false, false);
  EXPECT_EQ(digits.size(), 5u);

  // Any text round-trips, invalid UTF-8 included...
  for (const std::string& s : {std::string("héllo wörld 🌍 日本語  \t\n x"), std::string("\xc3 broken \xe2\x82"),
                               std::string(1000, ' '), std::string("a\0b", 3)}) {
    EXPECT_EQ(tok->decode(tok->encode(s, false, false)), s);
  }
  // ...except bytes the vocabulary has no token for (0xF5-0xFF never occur in UTF-8 and
  // SmolLM2 dropped them): they are skipped, as llama.cpp does.
  EXPECT_EQ(tok->decode(tok->encode("\xff\xfe ok", false, false)), " ok");
  EXPECT_TRUE(tok->encode("", true, true).empty());
  EXPECT_THROW(tok->token_to_piece(49152), OutOfRangeError);
  EXPECT_THROW(tok->token_to_piece(-1), OutOfRangeError);
}

// A stream never emits half a UTF-8 character.
TEST(Tokenizer, StreamHoldsBackIncompleteCharacters) {
  auto file = GgufFile::open(testing::smollm2_path());
  auto tok = Tokenizer::from_gguf(*file);
  const std::string text = "emoji 🌍🎉 and 日本語 text";
  const std::vector<TokenId> ids = tok->encode(text, false, false);
  TextStream stream(*tok);
  std::string all;
  int held = 0;
  for (TokenId id : ids) {
    const std::string piece = stream.push(id);
    // Every piece is whole characters: a lead byte's continuation bytes are all there.
    for (size_t i = 0; i < piece.size();) {
      const auto c = static_cast<unsigned char>(piece[i]);
      const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      ASSERT_LE(i + n, piece.size()) << "a split character in '" << piece << "'";
      i += n;
    }
    held += piece.empty();
    all += piece;
  }
  all += stream.finish();
  EXPECT_EQ(all, text);
  EXPECT_GT(held, 0);  // the emoji are several byte tokens each
  TextStream cut(*tok);
  std::string partial;
  for (TokenId id : tok->encode("🌍", false, false)) partial += cut.push(id);
  EXPECT_EQ(partial + cut.finish(), "🌍");
}

TEST(Tokenizer, UnsupportedAndMalformedVocabularies) {
  using testing::GgufBuilder;
  auto parse = [](const std::string& bytes) { return GgufFile::parse(bytes.data(), bytes.size(), "vocab.gguf"); };
  {
    GgufBuilder b;
    b.header(0, 1).kv_string("tokenizer.ggml.model", "rwkv");
    auto f = parse(b.bytes);
    try {
      Tokenizer::from_gguf(*f);
      ADD_FAILURE() << "no error";
    } catch (const UnimplementedError& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer model 'rwkv' is not supported"), std::string::npos) << e.what();
    }
  }
  {
    GgufBuilder b;
    b.header(0, 2).kv_string("tokenizer.ggml.model", "gpt2").kv_string("tokenizer.ggml.pre", "deepseek-coder");
    auto f = parse(b.bytes);
    try {
      Tokenizer::from_gguf(*f);
      ADD_FAILURE() << "no error";
    } catch (const UnimplementedError& e) {
      EXPECT_NE(std::string(e.what()).find("pre-tokenizer 'deepseek-coder' is not supported (kiln knows: default"), std::string::npos)
          << e.what();
    }
  }
  {  // scores that do not match the tokens; a BOS id outside the vocabulary
    GgufBuilder b;
    b.header(0, 3).kv_string("tokenizer.ggml.model", "llama");
    b.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(2).str("a").str("b");
    b.str("tokenizer.ggml.scores").u32(9).u32(6).u64(1).put(0.0f);
    auto f = parse(b.bytes);
    EXPECT_THROW(Tokenizer::from_gguf(*f), DataLossError);
    GgufBuilder c;
    c.header(0, 3).kv_string("tokenizer.ggml.model", "llama");
    c.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(2).str("a").str("b");
    c.kv_u32("tokenizer.ggml.bos_token_id", 7);
    auto g = parse(c.bytes);
    try {
      Tokenizer::from_gguf(*g);
      ADD_FAILURE() << "no error";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.bos_token_id = 7 is outside the vocabulary of 2 tokens"), std::string::npos)
          << e.what();
    }
  }
  {  // missing vocabulary
    GgufBuilder b;
    b.header(0, 1).kv_string("tokenizer.ggml.model", "gpt2");
    auto f = parse(b.bytes);
    EXPECT_THROW(Tokenizer::from_gguf(*f), NotFoundError);
  }
}

}  // namespace
}  // namespace kiln::llm
