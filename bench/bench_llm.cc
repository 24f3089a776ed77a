// LLM throughput on a GGUF file, in llama-bench's terms: prefill of a 512-token prompt
// (pp512) and decode of 128 tokens (tg128), tokens/s, median of --reps runs per thread
// count; load time and resident memory after load; batched decode (the serving
// engine's case: N sequences decoding together, aggregate tokens/s); the memory-
// bandwidth floor of one decode step. bench/llm_compare.sh runs llama-bench beside it.
//   bench_llm MODEL [--threads 1,2] [--reps 3] [--batch 1,2,4,8,16,32] [--repack 1|0]
//             [--kernels N] [--json 1] [--device cuda:0 --dtype bf16]
// (--device: the tensor path, kiln's ops on that device, weights of --dtype; the floor is
// then the host's memory bandwidth, meaningless for a GPU; --repack 0: the row kernels over the file's blocks, for comparison; --kernels N: only
// the group kernels on layer 0's matrices with N tokens, one thread, per ISA level;
// --json 1: only the constrained-decoding mask, microseconds per token along fixed answers).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/parallel.h"
#include "kiln/llm/gguf.h"
#include "kiln/llm/json_constraint.h"
#include "kiln/llm/model.h"
#include "llm/quant_kernels.h"

#include <immintrin.h>

using namespace kiln;
using namespace kiln::llm;
using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int> ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoi(x));
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

// Tokens/s of a prefill of n tokens (one sequence, chunks of 512).
double prefill(const Model& m, int n) {
  KvCache cache = m.make_cache({n + 16, 16});
  const auto s = cache.add_sequence();
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  const auto t0 = Clock::now();
  for (int at = 0; at < n; at += 512) {
    std::vector<BatchToken> batch;
    for (int i = at; i < std::min(n, at + 512); ++i) batch.push_back({s, (i * 7919) % 1000 + 100, i, i + 1 == n});
    m.forward(batch, cache, logits.data());
  }
  return n / since(t0);
}

// Aggregate tokens/s of `seqs` sequences decoding `steps` tokens together after a
// 16-token prompt each (llama-bench's tg starts from an empty context: seqs = 1, prompt 1).
double decode(const Model& m, int seqs, int steps, int prompt) {
  KvCache cache = m.make_cache({static_cast<int64_t>(seqs) * (prompt + steps + 16), 16});
  std::vector<KvCache::SeqId> ids;
  std::vector<float> logits(static_cast<size_t>(seqs * m.config().n_vocab));
  for (int s = 0; s < seqs; ++s) ids.push_back(cache.add_sequence());
  std::vector<BatchToken> batch;
  for (int s = 0; s < seqs; ++s)
    for (int p = 0; p < prompt; ++p) batch.push_back({ids[s], 100 + s + p, p, p + 1 == prompt});
  m.forward(batch, cache, logits.data());
  const auto t0 = Clock::now();
  for (int step = 0; step < steps; ++step) {
    batch.clear();
    for (int s = 0; s < seqs; ++s) batch.push_back({ids[s], 200 + (step * 31 + s) % 500, cache.length(ids[s]), true});
    m.forward(batch, cache, logits.data());
  }
  return static_cast<double>(seqs) * steps / since(t0);
}

// Read bandwidth (GB/s) of the pool summing a buffer far larger than the caches.
double bandwidth() {
  std::vector<float> buf(256u << 20 >> 2, 1.0f);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    std::vector<double> part(static_cast<size_t>(num_threads()));
    parallel_for(static_cast<int64_t>(buf.size()), 1 << 16, [&](int64_t b, int64_t e) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t i = b; i + 8 <= e; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(buf.data() + i));
      float t[8];
      _mm256_storeu_ps(t, acc);
      part[static_cast<size_t>(b * num_threads() / static_cast<int64_t>(buf.size()))] += t[0];
    });
    best = std::max(best, buf.size() * 4.0 / since(t0) / 1e9);
  }
  return best;
}
// The group kernels alone, one thread: `tokens` activation vectors times each distinct
// matrix shape of layer 0, at every instruction-set level this CPU runs; GMAC/s.
void kernel_rates(const Model& m, int tokens, int reps) {
  set_num_threads(1);
  const CpuIsa found = cpu_isa();
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight"}) {
    const GgufTensor& t = m.file().tensor(name);
    const kernels::QMatrix q{t.type, t.data, t.rows(), t.row_length(), ggml_row_bytes(t.type, t.row_length())};
    if (!kernels::packable(q.type)) continue;
    const kernels::PackedMatrix p(q);
    std::vector<float> x(static_cast<size_t>(tokens * q.cols)), y(static_cast<size_t>(tokens * q.rows));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 201) / 100.0f - 1.0f;
    std::vector<kernels::Q8Block> xq(static_cast<size_t>(tokens * q.cols / 32));
    for (int i = 0; i < tokens; ++i) kernels::quantize_q8(x.data() + i * q.cols, xq.data() + i * q.cols / 32, q.cols);
    std::printf("%s (%s, %lld x %lld), %d tokens:", name, ggml_type_name(static_cast<uint32_t>(t.type)).c_str(),
                static_cast<long long>(q.rows), static_cast<long long>(q.cols), tokens);
    for (CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx512Vnni, CpuIsa::kAmx}) {
      if (level > found) continue;
      set_cpu_isa_cap(level);
      std::vector<double> rate;
      for (int r = 0; r < reps; ++r) {
        int calls = 0;
        const auto t0 = Clock::now();
        do {
          kernels::matmul_groups(p, xq.data(), tokens, y.data(), q.rows, 0, p.groups());
          ++calls;
        } while (since(t0) < 0.2);
        rate.push_back(static_cast<double>(calls) * tokens * q.rows * q.cols / since(t0) / 1e9);
      }
      std::printf(" %s %.1f", cpu_isa_name(level), median(rate));
    }
    set_cpu_isa_cap(found);
    std::printf(" GMAC/s\n");
  }
}
// The JSON constraint's mask (kiln/llm/json_constraint.h), one thread: the microseconds
// one token's mask takes, along answers written token by token (the mask before each
// token, then the token accepted), median of `reps` passes.
void json_mask_rates(const Model& m, int reps) {
  const auto v0 = Clock::now();
  const auto vocab = std::make_shared<const JsonVocabulary>(m.tokenizer());
  std::printf("json vocabulary made in %.0f ms (%zu trie nodes)\n", since(v0) * 1e3, vocab->all.nodes.size() + vocab->not_content.nodes.size());
  const std::string cat = R"({"type": "object", "additionalProperties": false, "required": ["name", "age", "colour", "toys"],
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
    "colour": {"enum": ["black", "white", "ginger", "grey"]},
    "toys": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3}}})";
  struct Case {
    const char* name;
    std::shared_ptr<const JsonSchema> schema;
    std::string answer;
  };
  const std::vector<Case> cases = {
      {"json_object", nullptr,
       R"({"name": "Whiskers", "age": 3, "friends": [{"name": "Tom", "kind": "cat"}, {"name": "Rex", "kind": "dog"}], "indoor": true, "note": "likes to sleep in the sun all afternoon"})"},
      {"json_schema", JsonSchema::compile(cat), R"({"name": "Whiskers", "age": 3, "colour": "ginger", "toys": ["mouse", "ball of yarn"]})"},
  };
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  for (const Case& c : cases) {
    const std::vector<TokenId> tokens = m.tokenizer().encode(c.answer, false);
    std::vector<double> per_token;
    for (int r = 0; r < reps; ++r) {
      JsonConstraint json(vocab, c.schema);
      double spent = 0;
      for (TokenId t : tokens) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const auto t0 = Clock::now();
        json.mask(logits);
        spent += since(t0);
        if (!std::isfinite(logits[static_cast<size_t>(t)])) {
          std::fprintf(stderr, "%s: token %d masked\n", c.name, t);
          std::exit(1);
        }
        json.accept(t);
      }
      per_token.push_back(spent / static_cast<double>(tokens.size()) * 1e6);
    }
    std::printf("json mask %s: %.0f us/token (%zu tokens)\n", c.name, median(per_token), tokens.size());
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_llm MODEL [--threads 1,2] [--reps 3] [--batch 1,2,4,8,16,32] [--repack 1|0] [--kernels N] [--json 1] [--device D --dtype T]\n");
    return 2;
  }
  std::vector<int> threads{1, 2}, batches;
  int reps = 3, kernel_tokens = 0, json = 0;
  ModelLoadOptions load_options;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = ints(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batches = ints(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repack")) load_options.repack = std::stoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "--kernels")) kernel_tokens = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--json")) json = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--device")) load_options.device = parse_device(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype")) load_options.dtype = dtype_from_name(argv[i + 1]);
  }
  const long rss0 = rss_kib();
  const auto t0 = Clock::now();
  auto model = Model::load(argv[1], load_options);
  const double load_ms = since(t0) * 1e3;
  const long rss1 = rss_kib();
  // First token: a one-token prompt's logits right after load.
  {
    const auto t1 = Clock::now();
    KvCache cache = model->make_cache({16, 16});
    const auto s = cache.add_sequence();
    std::vector<float> logits(static_cast<size_t>(model->config().n_vocab));
    const BatchToken b{s, 1, 0, true};
    model->forward(std::span<const BatchToken>(&b, 1), cache, logits.data());
    std::printf("load %.0f ms, first token after %.0f ms; RSS %.1f MB after load (+%.1f MB), file %.1f MB\n", load_ms,
                load_ms + since(t1) * 1e3, rss1 / 1024.0, (rss1 - rss0) / 1024.0, model->file().file_size() / 1e6);
  }
  if (model->tensor_path())
    std::printf("tensor path on %s, weights %s (%.1f MB)\n", model->device().str().c_str(), std::string(dtype_name(load_options.dtype)).c_str(),
                model->weight_bytes() / 1e6);
  else
    std::printf("kernels: %s, %s (CPU: %s)\n", kernels::kernel_isa(), load_options.repack ? "packed groups" : "rows",
                cpu_isa_name(detected_cpu_isa()));
  if (json) {
    set_num_threads(1);
    json_mask_rates(*model, reps);
    return 0;
  }
  if (kernel_tokens > 0 && !model->tensor_path()) {
    kernel_rates(*model, kernel_tokens, reps);
    return 0;
  }
  for (int t : threads) {
    set_num_threads(t);
    std::vector<double> pp, tg;
    prefill(*model, 64);  // warm-up
    for (int r = 0; r < reps; ++r) {
      pp.push_back(prefill(*model, 512));
      tg.push_back(decode(*model, 1, 128, 1));
    }
    const double gbs = bandwidth();
    const double floor_tps = gbs * 1e9 / static_cast<double>(model->weight_bytes());
    std::printf("kiln threads=%d pp512 %.1f tokens/s | tg128 %.1f tokens/s | floor %.0f tokens/s (%.1f MB/token at %.1f GB/s): %.0f%%\n",
                t, median(pp), median(tg), floor_tps, model->weight_bytes() / 1e6, gbs, 100 * median(tg) / floor_tps);
  }
  if (!batches.empty()) {
    set_num_threads(threads.back());
    double one = 0;
    for (int b : batches) {
      std::vector<double> v;
      for (int r = 0; r < reps; ++r) v.push_back(decode(*model, b, 32, 16));
      const double tps = median(v);
      if (b == batches.front()) one = tps;
      std::printf("kiln batched decode threads=%d sequences=%d: %.1f tokens/s aggregate (%.2fx one)\n", threads.back(), b, tps,
                  tps / one);
    }
  }
  return 0;
}
