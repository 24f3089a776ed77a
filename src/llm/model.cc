// The llama-family transformer: loading from GGUF and the batched forward step.
#include "kiln/llm/model.h"

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>

#include "kiln/core/error.h"
#include "kiln/core/parallel.h"
#include "kiln/llm/gguf.h"
#include "backends/cpu/vecmath.h"  // libmvec declarations: vector expf in omp simd loops
#include "llm/attention_kernels.h"
#include "llm/quant_kernels.h"
#include "llm/rope.h"
#include "llm/tensor_forward.h"

namespace kiln::llm {

using detail::str_cat;
using kernels::Q8Block;
using kernels::QMatrix;

struct Model::Weights {
  struct Layer {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm, attn_post_norm, ffn_post_norm;
    QMatrix wq, wk, wv, wo, gate, up, down;
  };
  QMatrix embedding, output;
  std::vector<float> output_norm;
  std::vector<Layer> layers;
  std::vector<std::unique_ptr<kernels::PackedMatrix>> packed;  // what the matrices' `packed` point to
};

namespace {

// A tensor that must be there, with the expected ggml-order dims.
const GgufTensor& expect_tensor(const GgufFile& f, const std::string& name, std::vector<int64_t> dims) {
  const GgufTensor* t = f.find_tensor(name);
  if (t == nullptr) throw NotFoundError(f.name() + ": tensor '" + name + "' is missing");
  if (t->dims != dims) {
    std::string want, got;
    for (int64_t d : dims) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : t->dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
    throw DataLossError(str_cat(f.name(), ": tensor '", name, "' has dims [", got, "], the metadata implies [", want, "]"));
  }
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t->type));
  if (!info->dequantizable)
    throw UnimplementedError(str_cat(f.name(), ": tensor '", name, "' is ", info->name,
                                     ", a type kiln cannot run yet (it runs f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, "
                                     "q4_K, q5_K, q6_K)"));
  return *t;
}

QMatrix matrix(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows) {
  const GgufTensor& t = expect_tensor(f, name, {cols, rows});
  return QMatrix{t.type, t.data, rows, cols, ggml_row_bytes(t.type, cols)};
}

// Rows [r0, r0 + n) of m, in place (a fused matrix's parts).
QMatrix row_range(const QMatrix& m, int64_t r0, int64_t n) {
  QMatrix v = m;
  v.data += static_cast<size_t>(r0) * m.row_bytes;
  v.rows = n;
  return v;
}

std::vector<float> vec(const GgufFile& f, const std::string& name, int64_t n) {
  return f.dequantize(expect_tensor(f, name, {n}));
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// fn(t) for each token of a batch of T, on every thread when there are more than `grain`
// (norms, rotary embedding, SwiGLU, residuals: a token's result does not depend on the split).
template <typename F>
void for_tokens(int64_t T, int64_t grain, const F& fn) {
  parallel_for(T, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) fn(t);
  });
}

// g = silu(g) * u over n values (libmvec's vector exp).
void swiglu(float* g, const float* u, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// g = gelu(g) * u over n values, GELU's tanh form (ggml's gelu; Gemma's GeGLU).
void geglu(float* g, const float* u, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i];
    g[i] = 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * u[i];
  }
}

// Activations of n tokens, quantised once for every matrix that reads them.
struct Input {
  const float* x;
  int64_t n, cols;
  std::vector<Q8Block> q;
  Input(const float* x_, int64_t n_, int64_t cols_) : x(x_), n(n_), cols(cols_) {
    if (cols % 32 == 0) {
      q.resize(static_cast<size_t>(n * cols / 32));
      const int64_t nb = cols / 32;
      parallel_for(n, 4, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) kernels::quantize_q8(x + t * cols, q.data() + t * nb, cols);
      });
    }
  }
  const Q8Block* quantized() const { return q.empty() ? nullptr : q.data(); }
};

// y_i (n x w_i.rows) = in (n x cols) times w_i^T for matrices that read the same input
// (q, k, v; gate, up): one parallel region over all their rows, in units of 16 rows (a
// packed group), so that a row's result never depends on how the work was split.
void matmul(std::initializer_list<std::pair<const QMatrix*, float*>> outs, const Input& in) {
  constexpr int64_t U = kernels::kGroupRows;
  int64_t total = 0;
  for (const auto& [w, y] : outs) total += (w->rows + U - 1) / U;
  const int64_t grain = std::max<int64_t>(1, 128 / (U * std::max<int64_t>(1, in.n)));  // >= ~128 row-tokens a chunk
  parallel_for(total, grain, [&](int64_t u0, int64_t u1) {
    int64_t base = 0;
    for (const auto& [w, y] : outs) {
      const int64_t units = (w->rows + U - 1) / U;
      const int64_t b = std::max(u0, base) - base, e = std::min(u1, base + units) - base;
      base += units;
      if (b >= e) continue;
      if (w->packed != nullptr && in.quantized() != nullptr)
        kernels::matmul_groups(*w->packed, in.quantized(), in.n, y, w->rows, b, e);
      else
        kernels::matmul_rows(*w, in.quantized(), in.x, in.n, y, w->rows, b * U, std::min(w->rows, e * U));
    }
  });
}

// Gives the file's pages under [p, p + n) back to the OS (they are read again if touched).
void release_pages(const uint8_t* p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (b < e) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

// Rotates one head vector in place (normal: adjacent pairs; neox: halves).
void rope(float* v, const float* cs, const float* sn, const ModelConfig& c) {
  for (int64_t i = 0; i < c.n_rot / 2; ++i) {
    const int64_t a = c.rope_neox ? i : 2 * i;
    const int64_t b = c.rope_neox ? i + c.n_rot / 2 : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * cs[i] - x1 * sn[i];
    v[b] = x0 * sn[i] + x1 * cs[i];
  }
}

// x[i] = exp(x[i] - mx); returns the sum (libmvec's vector exp).
float exp_shifted(float* x, int64_t n, float mx) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    x[i] = expf(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

// Causal attention of the batch's queries over their sequences' cached keys and values.
// Work is split into jobs of (up to 8 consecutive tokens of one sequence, one KV head):
// the job's queries (tokens x the query heads sharing that KV head) read each cached
// block once, straight from its f16 keys (stored transposed) and values. Every query row
// runs the same operations whatever else is in its job, so results do not depend on the
// batch.
void attention(const ModelConfig& c, std::span<const BatchToken> batch, const float* q, float* att, const KvCache& cache,
               int64_t l) {
  const int64_t T = static_cast<int64_t>(batch.size()), hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.kv_dim();
  const int64_t group = c.n_head / c.n_head_kv, bs = cache.block_tokens();
  const float scale = c.attn_scale, softcap = c.attn_softcap;
  const int64_t window = c.is_swa(l) ? c.swa_window : 0;  // a query sees positions [pos + 1 - window, pos]
  constexpr int64_t kTileTokens = 8;
  struct Tile {
    int64_t t0, m;  // batch tokens [t0, t0 + m): one sequence, consecutive positions
  };
  std::vector<Tile> tiles;
  int64_t positions = 0;
  for (int64_t t = 0; t < T;) {
    int64_t e = t + 1;
    while (e < T && e - t < kTileTokens && batch[e].seq == batch[t].seq) ++e;
    tiles.push_back({t, e - t});
    positions += batch[e - 1].pos + 1;
    t = e;
  }
  // Jobs (a tile and a KV head) cost in proportion to the positions they attend to: a
  // prompt's later tiles more than its first. Each thread takes the next costliest job
  // still waiting (longest first, so the threads end together); a job's result does not
  // depend on which thread runs it. On the calling thread when too small to pay for
  // waking the pool (a short decode step).
  const int64_t jobs = static_cast<int64_t>(tiles.size()) * c.n_head_kv;
  std::vector<int32_t> order(static_cast<size_t>(jobs));
  std::iota(order.begin(), order.end(), 0);
  auto cost = [&](int32_t j) {
    const Tile& t = tiles[static_cast<size_t>(j / c.n_head_kv)];
    return t.m * (batch[t.t0 + t.m - 1].pos + 1);
  };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return cost(a) > cost(b); });
  const int64_t workers = std::min<int64_t>(num_threads(), jobs);
  const int64_t grain = positions * c.n_head < 2048 ? workers : 1;
  std::atomic<int64_t> next{0};
  constexpr int64_t L = kernels::kAttnLanes;
  const int64_t lanes = (bs + L - 1) / L * L;  // a block's scores, padded
  parallel_for(workers, grain, [&](int64_t, int64_t) {
    std::vector<float> scores;
    std::vector<const float*> qrows;
    std::vector<float*> outs;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < jobs;) {
      const int64_t job = order[static_cast<size_t>(i)];
      const Tile& tile = tiles[static_cast<size_t>(job / c.n_head_kv)];
      const int64_t kvh = job % c.n_head_kv, rows = tile.m * group;
      const BatchToken& last = batch[tile.t0 + tile.m - 1];
      const int64_t n_max = last.pos + 1, n_blocks = (n_max + bs - 1) / bs, stride = n_blocks * lanes;
      const std::vector<int32_t>& blocks = cache.blocks(last.seq);
      scores.resize(static_cast<size_t>(rows * stride));
      // Row r: token t0 + r / group, query head kvh * group + r % group. Block b's
      // scores are at b * lanes in a row (positions p0 + j at b * lanes + j).
      qrows.resize(static_cast<size_t>(rows));
      outs.resize(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t at = (tile.t0 + r / group) * q_dim + (kvh * group + r % group) * hd;
        qrows[static_cast<size_t>(r)] = q + at;
        outs[static_cast<size_t>(r)] = att + at;
        std::fill(att + at, att + at + hd, 0.0f);
      }
      auto row_n = [&](int64_t r) { return batch[tile.t0 + r / group].pos + 1; };
      auto row_lo = [&](int64_t r) { return window > 0 ? std::max<int64_t>(0, row_n(r) - window) : 0; };
      const int64_t b_lo = row_lo(0) / bs;  // blocks before it are out of every row's window
      for (int64_t b = b_lo; b < n_blocks; ++b) {
        const half* kt = cache.block_keys(blocks[static_cast<size_t>(b)], l) + kvh * hd * bs;
        kernels::attn_scores(qrows.data(), rows, kt, bs, std::min(bs, n_max - b * bs), hd, scale,
                             scores.data() + b * lanes, stride);
      }
      for (int64_t r = 0; r < rows; ++r) {
        // The row's scores packed to consecutive positions (blocks of bs < lanes leave gaps).
        float* sr = scores.data() + r * stride;
        const int64_t n = row_n(r), lo = row_lo(r);
        if (lanes != bs)
          for (int64_t p = std::max(bs, lo); p < n; ++p) sr[p] = sr[p / bs * lanes + p % bs];
        if (softcap > 0)
          for (int64_t p = lo; p < n; ++p) sr[p] = softcap * std::tanh(sr[p] / softcap);
        const float mx = *std::max_element(sr + lo, sr + n);
        const float inv = 1.0f / exp_shifted(sr + lo, n - lo, mx);
        std::fill(sr + b_lo * bs, sr + lo, 0.0f);  // (the value sums read from block b_lo on)
        for (int64_t p = lo; p < n; ++p) sr[p] *= inv;
      }
      for (int64_t b = b_lo; b < n_blocks; ++b) {
        const int64_t p0 = b * bs, m = std::min(bs, n_max - p0);
        const half* vb = cache.block_values(blocks[static_cast<size_t>(b)], l) + kvh * hd;
        // The rows of one token see the same positions: one call per token.
        for (int64_t r = 0; r < rows; r += group) {
          const int64_t mr = std::min(m, row_n(r) - p0);
          if (mr > 0)
            kernels::attn_values(scores.data() + r * stride + p0, stride, group, mr, vb, kv_dim, hd, outs.data() + r);
        }
      }
    }
  });
}

}  // namespace

Model::~Model() = default;

std::shared_ptr<const Model> Model::load(const std::string& path, const ModelLoadOptions& options) {
  std::shared_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  const GgufFile& f = *m->file_;
  ModelConfig& c = m->config_;
  c.architecture = std::string(f.get_string("general.architecture"));
  c.name = std::string(f.get_string("general.name", ""));
  static const char* const kArchitectures[] = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"};
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), c.architecture) == std::end(kArchitectures)) {
    std::string known;
    for (const char* name : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(name);
    throw UnimplementedError(f.name() + ": architecture '" + c.architecture + "' is not supported (kiln runs " + known + ")");
  }
  const bool phi3 = c.architecture == "phi3", gemma2 = c.architecture == "gemma2", gemma3 = c.architecture == "gemma3";
  const std::string a = c.architecture + ".";
  // Mixtral and its kin are "llama" files with experts: name that, not a missing tensor.
  if (const int64_t experts = f.get_int(a + "expert_count", 0); experts > 0)
    throw UnimplementedError(str_cat(f.name(), ": a mixture-of-experts model (", experts,
                                     " experts) is not supported (kiln runs dense models)"));
  c.n_layer = f.get_int(a + "block_count");
  c.n_embd = f.get_int(a + "embedding_length");
  c.n_ff = f.get_int(a + "feed_forward_length");
  c.n_head = f.get_int(a + "attention.head_count");
  c.n_head_kv = f.get_int(a + "attention.head_count_kv", c.n_head);
  if (c.n_layer < 1 || c.n_embd < 1 || c.n_ff < 1 || c.n_head < 1 || c.n_head_kv < 1 || c.n_head % c.n_head_kv != 0)
    throw DataLossError(str_cat(f.name(), ": inconsistent hyperparameters: ", c.n_layer, " blocks, embedding ", c.n_embd, ", ffn ",
                                c.n_ff, ", ", c.n_head, " heads, ", c.n_head_kv, " kv heads"));
  c.head_dim = f.get_int(a + "attention.key_length", c.n_embd / c.n_head);
  c.n_rot = f.get_int(a + "rope.dimension_count", c.head_dim);
  if (c.head_dim < 2 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    throw DataLossError(str_cat(f.name(), ": head size ", c.head_dim, " and rotary dimensions ", c.n_rot, " are inconsistent"));
  c.n_ctx_train = f.get_int(a + "context_length", 2048);
  c.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_base = static_cast<float>(f.get_float(a + "rope.freq_base", 10000.0));
  const std::string scaling(f.get_string(a + "rope.scaling.type", "none"));
  if (scaling == "linear") c.rope_freq_scale = static_cast<float>(1.0 / f.get_float(a + "rope.scaling.factor", 1.0));
  else if (scaling != "none")
    throw UnimplementedError(f.name() + ": rope scaling '" + scaling + "' is not supported (kiln runs none and linear)");
  c.rope_neox = c.architecture == "qwen2" || c.architecture == "qwen3" || phi3 || gemma2 || gemma3;
  // Frequency factors: Llama 3's one set, or Phi-3's LongRoPE pair chosen by the context
  // to be served (llama.cpp's choice: long over the original context, else short).
  std::string factors;
  if (f.find_tensor("rope_freqs.weight")) {
    factors = "rope_freqs.weight";
  } else if (f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight")) {
    const int64_t original = f.get_int(a + "rope.scaling.original_context_length", c.n_ctx_train);
    const int64_t context = options.context_length > 0 ? std::min(options.context_length, c.n_ctx_train) : c.n_ctx_train;
    factors = context > original ? "rope_factors_long.weight" : "rope_factors_short.weight";
  }
  if (!factors.empty()) c.rope_freq_factors = vec(f, factors, c.n_rot / 2);
  for (float ff : c.rope_freq_factors)
    if (!(ff > 0) || !std::isfinite(ff)) throw DataLossError(f.name() + ": " + factors + " holds a factor that is not a positive number");
  c.rope_attn_factor = static_cast<float>(f.get_float(a + "rope.scaling.attn_factor", 1.0));
  if (!(c.rope_attn_factor > 0) || !std::isfinite(c.rope_attn_factor))
    throw DataLossError(str_cat(f.name(), ": ", a, "rope.scaling.attn_factor is ", c.rope_attn_factor, ", not a positive number"));
  c.qk_norm = c.architecture == "qwen3" || gemma3;  // (their attn_q_norm / attn_k_norm tensors are required)
  // As llama.cpp (after gemma_pytorch): the 27B Gemmas (46 and 62 blocks) scale by the model
  // width per head.
  const bool wide_scale = (gemma2 && c.n_layer == 46) || (gemma3 && c.n_layer == 62);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(wide_scale ? c.n_embd / c.n_head : c.head_dim));
  if (gemma2 || gemma3) {
    c.embed_scale = std::sqrt(static_cast<float>(c.n_embd));
    c.post_norms = c.gelu = true;
    // Sliding windows: the layers a per-layer array marks, else all but every n-th (n from
    // the pattern key; gemma2: 2, every other layer; gemma3: 6, five local layers, then a
    // global one). Gemma 2's window is 4096 unless the file says; its local layers turn as
    // the global ones unless freq_base_swa is given; Gemma 3's on base 10000, unscaled.
    c.swa_window = f.get_int(a + "attention.sliding_window", gemma2 ? 4096 : 0);
    if (c.swa_window < 0) throw DataLossError(str_cat(f.name(), ": ", a, "attention.sliding_window is ", c.swa_window));
    c.swa_layers.assign(static_cast<size_t>(c.n_layer), false);
    const GgufValue* pattern = f.find(a + "attention.sliding_window_pattern");
    if (pattern && pattern->type == GgufType::kArray) {
      if (pattern->count > static_cast<uint64_t>(c.n_layer) || pattern->element_type == GgufType::kString ||
          pattern->element_type == GgufType::kArray)
        throw DataLossError(str_cat(f.name(), ": ", a, "attention.sliding_window_pattern is not one flag per block"));
      for (uint64_t l = 0; l < pattern->count; ++l) c.swa_layers[l] = pattern->integer_at(l) != 0;
    } else {
      const int64_t n = f.get_int(a + "attention.sliding_window_pattern", gemma2 ? 2 : 6);
      if (n < 0) throw DataLossError(str_cat(f.name(), ": ", a, "attention.sliding_window_pattern is ", n));
      for (int64_t l = 0; l < c.n_layer; ++l) c.swa_layers[static_cast<size_t>(l)] = n == 0 || l % n < n - 1;
    }
    c.rope_base_swa = static_cast<float>(f.get_float(a + "rope.freq_base_swa", gemma2 ? c.rope_base : 10000.0));
    c.rope_freq_scale_swa = gemma2 ? c.rope_freq_scale : 1.0f;
  }
  // Soft caps (gemma2 by default: 50 on attention scores, 30 on logits; gemma3 if given).
  const auto cap = [&](const std::string& key, double fallback) {
    const float v = static_cast<float>(f.get_float(a + key, fallback));
    if (!(v >= 0) || !std::isfinite(v)) throw DataLossError(str_cat(f.name(), ": ", a, key, " is ", v));
    return v;
  };
  c.final_logit_softcap = cap("final_logit_softcapping", gemma2 ? 30.0 : 0.0);
  c.attn_softcap = gemma2 ? cap("attn_logit_softcapping", 50.0) : 0.0f;
  m->tokenizer_ = Tokenizer::from_gguf(f);
  c.n_vocab = m->tokenizer_->vocab_size();

  auto w = std::make_unique<Weights>();
  w->embedding = matrix(f, "token_embd.weight", c.n_embd, c.n_vocab);
  w->output_norm = vec(f, "output_norm.weight", c.n_embd);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  w->output = c.tied_output ? w->embedding : matrix(f, "output.weight", c.n_embd, c.n_vocab);
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.kv_dim();
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.fused_qkv = f.find_tensor("blk.0.attn_qkv.weight") != nullptr;
  c.fused_gate_up = phi3;  // (llama.cpp requires it there)
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Weights::Layer L;
    L.attn_norm = vec(f, p + "attn_norm.weight", c.n_embd);
    L.ffn_norm = vec(f, p + "ffn_norm.weight", c.n_embd);
    if (c.fused_qkv) {
      const QMatrix qkv = matrix(f, p + "attn_qkv.weight", c.n_embd, q_dim + 2 * kv_dim);
      L.wq = row_range(qkv, 0, q_dim), L.wk = row_range(qkv, q_dim, kv_dim), L.wv = row_range(qkv, q_dim + kv_dim, kv_dim);
    } else {
      L.wq = matrix(f, p + "attn_q.weight", c.n_embd, q_dim);
      L.wk = matrix(f, p + "attn_k.weight", c.n_embd, kv_dim);
      L.wv = matrix(f, p + "attn_v.weight", c.n_embd, kv_dim);
    }
    L.wo = matrix(f, p + "attn_output.weight", q_dim, c.n_embd);
    if (c.fused_gate_up) {  // (ggml's swiglu halves)
      const QMatrix gate_up = matrix(f, p + "ffn_up.weight", c.n_embd, 2 * c.n_ff);
      L.gate = row_range(gate_up, 0, c.n_ff), L.up = row_range(gate_up, c.n_ff, c.n_ff);
    } else {
      L.gate = matrix(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
      L.up = matrix(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
    }
    L.down = matrix(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
    if (c.qk_norm) {
      L.q_norm = vec(f, p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = vec(f, p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.post_norms) {
      L.attn_post_norm = vec(f, p + "post_attention_norm.weight", c.n_embd);
      L.ffn_post_norm = vec(f, p + "post_ffw_norm.weight", c.n_embd);
    }
    if (c.qkv_bias) {
      L.bq = vec(f, p + "attn_q.bias", q_dim);
      L.bk = vec(f, p + "attn_k.bias", kv_dim);
      L.bv = vec(f, p + "attn_v.bias", kv_dim);
    }
    w->layers.push_back(std::move(L));
  }
  if (options.device) {
    // The tensor path reads its own copy of the weights; the file's pages are given back.
    m->tensor_ = load_tensor_weights(f, c, *options.device, options.dtype);
    for (const GgufTensor& t : f.tensors()) release_pages(t.data, t.nbytes);
  } else if (options.repack) {
    // The file's pages of a packed matrix are released; a tied head's embedding rows are
    // read again (page by page) only for the tokens looked up.
    auto pack = [&](QMatrix& q) {
      if (!kernels::packable(q.type) || q.cols % 32 != 0) return;
      w->packed.push_back(std::make_unique<kernels::PackedMatrix>(q));
      q.packed = w->packed.back().get();
      release_pages(q.data, static_cast<size_t>(q.rows) * q.row_bytes);
    };
    for (Weights::Layer& L : w->layers)
      for (QMatrix* q : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) pack(*q);
    pack(w->output);
  }
  m->weights_ = std::move(w);
  return m;
}

Device Model::device() const { return tensor_ ? tensor_->device : Device::cpu(); }

KvCache Model::make_cache(KvCacheOptions options) const {
  options.layout = tensor_ ? KvLayout::kRows : KvLayout::kTransposedKeys;
  options.device = device();
  return KvCache(config_, options);
}

size_t Model::weight_bytes() const {
  if (tensor_) return tensor_->bytes();
  auto bytes = [](const QMatrix& q) { return q.packed ? q.packed->bytes() : static_cast<size_t>(q.rows) * q.row_bytes; };
  size_t n = bytes(weights_->output);
  for (const auto& L : weights_->layers)
    n += bytes(L.wq) + bytes(L.wk) + bytes(L.wv) + bytes(L.wo) + bytes(L.gate) + bytes(L.up) + bytes(L.down);
  return n;
}

void Model::forward(std::span<const BatchToken> batch, KvCache& cache, float* logits) const {
  const ModelConfig& c = config_;
  const Weights& W = *weights_;
  const int64_t T = static_cast<int64_t>(batch.size());
  if (T == 0) return;
  const KvLayout layout = tensor_ ? KvLayout::kRows : KvLayout::kTransposedKeys;
  if (cache.layout() != layout || cache.device() != device())
    throw InvalidArgumentError(str_cat("the KV cache on ", cache.device().str(), " was not made for this model (on ", device().str(),
                                       "): make it with Model::make_cache"));
  // Check the batch and reserve cache space before changing anything.
  std::map<KvCache::SeqId, std::pair<int64_t, int64_t>> span;  // seq -> (first pos, next pos)
  for (const BatchToken& b : batch) {
    if (b.token < 0 || b.token >= c.n_vocab)
      throw InvalidArgumentError(str_cat("token id ", b.token, " is outside the vocabulary of ", c.n_vocab));
    auto it = span.find(b.seq);
    if (it == span.end()) {
      const int64_t len = cache.length(b.seq);
      if (b.pos != len)
        throw InvalidArgumentError(str_cat("sequence ", b.seq, " has ", len, " cached positions; its next token must be at position ",
                                           len, ", not ", b.pos));
      span[b.seq] = {b.pos, b.pos + 1};
    } else {
      if (b.pos != it->second.second)
        throw InvalidArgumentError(str_cat("sequence ", b.seq, ": batch positions must be consecutive (", it->second.second,
                                           " expected, got ", b.pos, ")"));
      ++it->second.second;
    }
  }
  int64_t need = 0;
  for (const auto& [seq, range] : span) {
    const int64_t have = static_cast<int64_t>(cache.blocks(seq).size());
    need += std::max<int64_t>(0, (range.second + cache.block_tokens() - 1) / cache.block_tokens() - have);
  }
  if (need > cache.free_blocks())
    throw ResourceExhaustedError(str_cat("KV cache full: the batch needs ", need, " more blocks, ", cache.free_blocks(), " of ",
                                         cache.total_blocks(), " are free"));
  for (const auto& [seq, range] : span) cache.grow(seq, range.second);
  if (tensor_) return tensor_forward(c, *tensor_, batch, cache, logits);

  const int64_t d = c.n_embd, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.kv_dim();
  std::vector<float> x(static_cast<size_t>(T * d)), h(static_cast<size_t>(T * d));
  std::vector<float> q(static_cast<size_t>(T * q_dim)), k(static_cast<size_t>(T * kv_dim)), v(static_cast<size_t>(T * kv_dim));
  std::vector<float> att(static_cast<size_t>(T * q_dim)), proj(static_cast<size_t>(T * d));
  std::vector<float> g(static_cast<size_t>(T * c.n_ff)), u(static_cast<size_t>(T * c.n_ff));
  for (int64_t t = 0; t < T; ++t) {
    dequantize_row(W.embedding.type, W.embedding.data + batch[t].token * W.embedding.row_bytes, x.data() + t * d, d);
    if (c.embed_scale != 1.0f)
      for (int64_t i = t * d; i < (t + 1) * d; ++i) x[i] *= c.embed_scale;
  }

  // Angles per token, shared by every head and layer (a second set for sliding-window layers).
  const int64_t half_rot = c.n_rot / 2;
  std::vector<float> rope_cos(static_cast<size_t>(T * half_rot)), rope_sin(rope_cos.size()), swa_cos, swa_sin;
  for (int64_t t = 0; t < T; ++t) rope_angles(batch[t].pos, c, rope_cos.data() + t * half_rot, rope_sin.data() + t * half_rot);
  if (c.swa_window > 0) {
    swa_cos.resize(rope_cos.size()), swa_sin.resize(rope_cos.size());
    for (int64_t t = 0; t < T; ++t)
      rope_angles(batch[t].pos, c, swa_cos.data() + t * half_rot, swa_sin.data() + t * half_rot, true);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const Weights::Layer& L = W.layers[l];
    const float* layer_cos = c.is_swa(l) ? swa_cos.data() : rope_cos.data();
    const float* layer_sin = c.is_swa(l) ? swa_sin.data() : rope_sin.data();
    for_tokens(T, 32, [&](int64_t t) { rms_norm(x.data() + t * d, L.attn_norm.data(), h.data() + t * d, d, c.rms_eps); });
    {
      const Input in(h.data(), T, d);
      matmul({{&L.wq, q.data()}, {&L.wk, k.data()}, {&L.wv, v.data()}}, in);
    }
    for_tokens(T, 16, [&](int64_t t) {
      float* qt = q.data() + t * q_dim;
      float* kt = k.data() + t * kv_dim;
      float* vt = v.data() + t * kv_dim;
      if (c.qkv_bias) {
        for (int64_t i = 0; i < q_dim; ++i) qt[i] += L.bq[i];
        for (int64_t i = 0; i < kv_dim; ++i) kt[i] += L.bk[i], vt[i] += L.bv[i];
      }
      if (c.qk_norm) {
        for (int64_t hh = 0; hh < c.n_head; ++hh) rms_norm(qt + hh * hd, L.q_norm.data(), qt + hh * hd, hd, c.rms_eps);
        for (int64_t hh = 0; hh < c.n_head_kv; ++hh) rms_norm(kt + hh * hd, L.k_norm.data(), kt + hh * hd, hd, c.rms_eps);
      }
      const float* cs = layer_cos + t * half_rot;
      const float* sn = layer_sin + t * half_rot;
      for (int64_t hh = 0; hh < c.n_head; ++hh) rope(qt + hh * hd, cs, sn, c);
      for (int64_t hh = 0; hh < c.n_head_kv; ++hh) rope(kt + hh * hd, cs, sn, c);
      cache.store_key(batch[t].seq, l, batch[t].pos, kt);
      convert_float_to_half(vt, cache.value(batch[t].seq, l, batch[t].pos), static_cast<size_t>(kv_dim));
    });
    attention(c, batch, q.data(), att.data(), cache, l);
    {
      const Input in(att.data(), T, q_dim);
      matmul({{&L.wo, proj.data()}}, in);
    }
    for_tokens(T, 32, [&](int64_t t) {
      if (c.post_norms) rms_norm(proj.data() + t * d, L.attn_post_norm.data(), proj.data() + t * d, d, c.rms_eps);
      for (int64_t i = t * d; i < (t + 1) * d; ++i) x[i] += proj[i];
      rms_norm(x.data() + t * d, L.ffn_norm.data(), h.data() + t * d, d, c.rms_eps);
    });
    {
      const Input in(h.data(), T, d);
      matmul({{&L.gate, g.data()}, {&L.up, u.data()}}, in);
    }
    for_tokens(T, 4, [&](int64_t t) {
      (c.gelu ? geglu : swiglu)(g.data() + t * c.n_ff, u.data() + t * c.n_ff, c.n_ff);
    });
    {
      const Input in(g.data(), T, c.n_ff);
      matmul({{&L.down, proj.data()}}, in);
    }
    for_tokens(T, 64, [&](int64_t t) {
      if (c.post_norms) rms_norm(proj.data() + t * d, L.ffn_post_norm.data(), proj.data() + t * d, d, c.rms_eps);
      for (int64_t i = t * d; i < (t + 1) * d; ++i) x[i] += proj[i];
    });
  }

  std::vector<float> sel;
  for (int64_t t = 0; t < T; ++t) {
    if (!batch[t].logits) continue;
    sel.resize(sel.size() + static_cast<size_t>(d));
    rms_norm(x.data() + t * d, W.output_norm.data(), sel.data() + sel.size() - d, d, c.rms_eps);
  }
  if (sel.empty()) return;
  const Input in(sel.data(), static_cast<int64_t>(sel.size()) / d, d);
  matmul({{&W.output, logits}}, in);
  softcap_logits(c, logits, in.n);
}

}  // namespace kiln::llm
