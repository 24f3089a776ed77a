// llama.cpp as the oracle for kiln's LLM tests (not built by kiln's CMake: compiled by
// bench/peers/make_llm_fixtures.py against the peer build of bench/peers/llama_cpp.sh).
// For each prompt of a file (prompts separated by "\n__ggml_vocab_test__\n"): tokenize
// (BOS as the model says, special tokens parsed), run the prompt, write the logits of
// its last position (n_vocab float32, appended to LOGITS), then decode N tokens
// greedily and print one line per prompt:
//   prompt_ids <ids> | greedy <ids> | gaps <top1 - top2 logit at each greedy step>
//   llama_oracle MODEL PROMPTS N LOGITS
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: llama_oracle MODEL PROMPTS N LOGITS\n");
    return 2;
  }
  const int n_gen = std::stoi(argv[3]);
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str(), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> prompts;
  for (size_t pos = 0; pos < all.size();) {
    size_t next = all.find(sep, pos);
    if (next == std::string::npos) next = all.size();
    prompts.push_back(all.substr(pos, next - pos));
    pos = next + sep.size();
  }
  llama_backend_init();
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::FILE* logits_out = std::fopen(argv[4], "wb");
  for (const std::string& p : prompts) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;  // (make_llm_fixtures.py: ORACLE_CONTEXT)
    cp.n_batch = 2048;
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context* ctx = llama_init_from_model(model, cp);
    std::vector<llama_token> toks(p.size() + 8);
    const int n = llama_tokenize(vocab, p.data(), static_cast<int32_t>(p.size()), toks.data(), static_cast<int32_t>(toks.size()), true, true);
    toks.resize(n);
    std::printf("prompt_ids");
    for (llama_token t : toks) std::printf(" %d", t);
    if (llama_decode(ctx, llama_batch_get_one(toks.data(), n)) != 0) return 1;
    std::fwrite(llama_get_logits_ith(ctx, -1), sizeof(float), n_vocab, logits_out);
    std::vector<llama_token> gen;
    std::vector<float> gaps;
    for (int i = 0; i < n_gen; ++i) {
      const float* l = llama_get_logits_ith(ctx, -1);
      int best = 0, second = 1;
      if (l[second] > l[best]) std::swap(best, second);
      for (int v = 2; v < n_vocab; ++v) {
        if (l[v] > l[best]) {
          second = best;
          best = v;
        } else if (l[v] > l[second]) {
          second = v;
        }
      }
      gen.push_back(best);
      gaps.push_back(l[best] - l[second]);
      llama_token t = best;
      if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) return 1;
    }
    std::printf(" | greedy");
    for (llama_token t : gen) std::printf(" %d", t);
    std::printf(" | gaps");
    for (float g : gaps) std::printf(" %.4f", g);
    std::printf("\n");
    llama_free(ctx);
  }
  std::fclose(logits_out);
  llama_model_free(model);
  return 0;
}
