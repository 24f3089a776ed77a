// The llama-family transformer: loading from GGUF and the batched forward step.
#include "kiln/llm/model.h"

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "kiln/core/error.h"
#include "kiln/core/parallel.h"
#include "kiln/llm/gguf.h"
#include "llm/quant_kernels.h"

namespace kiln::llm {

using detail::str_cat;
using kernels::Q8Block;
using kernels::QMatrix;

struct Model::Weights {
  struct Layer {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv;
    QMatrix wq, wk, wv, wo, gate, up, down;
  };
  QMatrix embedding, output;
  std::vector<float> output_norm;
  std::vector<Layer> layers;
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

std::vector<float> vec(const GgufFile& f, const std::string& name, int64_t n) {
  return f.dequantize(expect_tensor(f, name, {n}));
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
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
// (q, k, v; gate, up): one parallel region over all their rows.
void matmul(std::initializer_list<std::pair<const QMatrix*, float*>> outs, const Input& in) {
  int64_t total = 0;
  for (const auto& [w, y] : outs) total += w->rows;
  const int64_t grain = std::max<int64_t>(4, 128 / std::max<int64_t>(1, in.n));  // >= ~128 row-tokens a chunk
  parallel_for(total, grain, [&](int64_t r0, int64_t r1) {
    int64_t base = 0;
    for (const auto& [w, y] : outs) {
      const int64_t b = std::max(r0, base), e = std::min(r1, base + w->rows);
      if (b < e) kernels::matmul_rows(*w, in.quantized(), in.x, in.n, y, w->rows, b - base, e - base);
      base += w->rows;
    }
  });
}

// Rotary embedding of one head vector in place, as ggml's rope (normal: adjacent pairs;
// neox: halves), angles built by repeated multiplication like ggml's cache.
void rope(float* v, int64_t n_rot, int64_t pos, const ModelConfig& c) {
  const float theta_scale = std::pow(c.rope_base, -2.0f / static_cast<float>(n_rot));
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const float angle = theta * c.rope_freq_scale;
    const float cs = std::cos(angle), sn = std::sin(angle);
    const int64_t a = c.rope_neox ? i : 2 * i;
    const int64_t b = c.rope_neox ? i + n_rot / 2 : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * cs - x1 * sn;
    v[b] = x0 * sn + x1 * cs;
    theta *= theta_scale;
  }
}

inline float dot_f16(const float* q, const half* k, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i))), acc);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += q[i] * half::to_float(k[i].bits);
  return r;
}

inline void axpy_f16(float a, const half* v, float* out, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i))),
                                              _mm256_loadu_ps(out + i)));
  for (; i < n; ++i) out[i] += a * half::to_float(v[i].bits);
}

}  // namespace

Model::~Model() = default;

std::shared_ptr<const Model> Model::load(const std::string& path) {
  std::shared_ptr<Model> m(new Model());
  m->file_ = GgufFile::open(path);
  const GgufFile& f = *m->file_;
  ModelConfig& c = m->config_;
  c.architecture = std::string(f.get_string("general.architecture"));
  c.name = std::string(f.get_string("general.name", ""));
  if (c.architecture != "llama" && c.architecture != "mistral" && c.architecture != "qwen2")
    throw UnimplementedError(f.name() + ": architecture '" + c.architecture + "' is not supported (kiln runs llama, mistral, qwen2)");
  const std::string a = c.architecture + ".";
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
  c.rope_neox = c.architecture == "qwen2";
  m->tokenizer_ = Tokenizer::from_gguf(f);
  c.n_vocab = m->tokenizer_->vocab_size();

  auto w = std::make_unique<Weights>();
  w->embedding = matrix(f, "token_embd.weight", c.n_embd, c.n_vocab);
  w->output_norm = vec(f, "output_norm.weight", c.n_embd);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  w->output = c.tied_output ? w->embedding : matrix(f, "output.weight", c.n_embd, c.n_vocab);
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.kv_dim();
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Weights::Layer L;
    L.attn_norm = vec(f, p + "attn_norm.weight", c.n_embd);
    L.ffn_norm = vec(f, p + "ffn_norm.weight", c.n_embd);
    L.wq = matrix(f, p + "attn_q.weight", c.n_embd, q_dim);
    L.wk = matrix(f, p + "attn_k.weight", c.n_embd, kv_dim);
    L.wv = matrix(f, p + "attn_v.weight", c.n_embd, kv_dim);
    L.wo = matrix(f, p + "attn_output.weight", q_dim, c.n_embd);
    L.gate = matrix(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
    L.up = matrix(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
    L.down = matrix(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
    if (c.qkv_bias) {
      L.bq = vec(f, p + "attn_q.bias", q_dim);
      L.bk = vec(f, p + "attn_k.bias", kv_dim);
      L.bv = vec(f, p + "attn_v.bias", kv_dim);
    }
    w->layers.push_back(std::move(L));
  }
  m->weights_ = std::move(w);
  return m;
}

size_t Model::weight_bytes() const {
  auto bytes = [](const QMatrix& q) { return static_cast<size_t>(q.rows) * q.row_bytes; };
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

  const int64_t d = c.n_embd, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.kv_dim();
  std::vector<float> x(static_cast<size_t>(T * d)), h(static_cast<size_t>(T * d));
  std::vector<float> q(static_cast<size_t>(T * q_dim)), k(static_cast<size_t>(T * kv_dim)), v(static_cast<size_t>(T * kv_dim));
  std::vector<float> att(static_cast<size_t>(T * q_dim)), proj(static_cast<size_t>(T * d));
  std::vector<float> g(static_cast<size_t>(T * c.n_ff)), u(static_cast<size_t>(T * c.n_ff));
  for (int64_t t = 0; t < T; ++t)
    dequantize_row(W.embedding.type, W.embedding.data + batch[t].token * W.embedding.row_bytes, x.data() + t * d, d);

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = c.n_head / c.n_head_kv;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const Weights::Layer& L = W.layers[l];
    for (int64_t t = 0; t < T; ++t) rms_norm(x.data() + t * d, L.attn_norm.data(), h.data() + t * d, d, c.rms_eps);
    {
      const Input in(h.data(), T, d);
      matmul({{&L.wq, q.data()}, {&L.wk, k.data()}, {&L.wv, v.data()}}, in);
    }
    for (int64_t t = 0; t < T; ++t) {
      float* qt = q.data() + t * q_dim;
      float* kt = k.data() + t * kv_dim;
      float* vt = v.data() + t * kv_dim;
      if (c.qkv_bias) {
        for (int64_t i = 0; i < q_dim; ++i) qt[i] += L.bq[i];
        for (int64_t i = 0; i < kv_dim; ++i) kt[i] += L.bk[i], vt[i] += L.bv[i];
      }
      for (int64_t hh = 0; hh < c.n_head; ++hh) rope(qt + hh * hd, c.n_rot, batch[t].pos, c);
      for (int64_t hh = 0; hh < c.n_head_kv; ++hh) rope(kt + hh * hd, c.n_rot, batch[t].pos, c);
      convert_float_to_half(kt, cache.key(batch[t].seq, l, batch[t].pos), static_cast<size_t>(kv_dim));
      convert_float_to_half(vt, cache.value(batch[t].seq, l, batch[t].pos), static_cast<size_t>(kv_dim));
    }
    // Attention: each (token, head) over its sequence's positions 0..pos; on the calling
    // thread when the work is too small to pay for waking the pool (a short decode step).
    int64_t positions = 0;
    for (const BatchToken& bt : batch) positions += bt.pos + 1;
    // Jobs are dealt round-robin to stripes: a prompt's later tokens attend to more
    // positions, and contiguous ranges would leave one thread the expensive half.
    const int64_t jobs = T * c.n_head, stripes = std::min<int64_t>(jobs, 64);
    const int64_t attn_grain = positions * c.n_head < 2048 ? stripes : 1;
    parallel_for(stripes, attn_grain, [&](int64_t sb, int64_t se) {
      std::vector<float> scores;
      for (int64_t stripe = sb; stripe < se; ++stripe)
      for (int64_t job = stripe; job < jobs; job += stripes) {
        const int64_t t = job / c.n_head, hh = job % c.n_head, kvh = hh / group;
        const BatchToken& bt = batch[t];
        const float* qh = q.data() + t * q_dim + hh * hd;
        float* out = att.data() + t * q_dim + hh * hd;
        const std::vector<int32_t>& blocks = cache.blocks(bt.seq);
        const int64_t n = bt.pos + 1, bs = cache.block_tokens();
        scores.resize(static_cast<size_t>(n));
        float mx = -INFINITY;
        // Walk the block table: within a block, positions are kv_dim apart.
        for (int64_t p0 = 0; p0 < n; p0 += bs) {
          const half* kb = cache.block_keys(blocks[p0 / bs], l) + kvh * hd;
          const int64_t m = std::min(bs, n - p0);
          for (int64_t j = 0; j < m; ++j) {
            const float sc = dot_f16(qh, kb + j * kv_dim, hd) * scale;
            scores[p0 + j] = sc;
            mx = std::max(mx, sc);
          }
        }
        float sum = 0;
        for (int64_t p = 0; p < n; ++p) sum += (scores[p] = std::exp(scores[p] - mx));
        const float inv = 1.0f / sum;
        std::fill(out, out + hd, 0.0f);
        for (int64_t p0 = 0; p0 < n; p0 += bs) {
          const half* vb = cache.block_values(blocks[p0 / bs], l) + kvh * hd;
          const int64_t m = std::min(bs, n - p0);
          for (int64_t j = 0; j < m; ++j) axpy_f16(scores[p0 + j] * inv, vb + j * kv_dim, out, hd);
        }
      }
    });
    {
      const Input in(att.data(), T, q_dim);
      matmul({{&L.wo, proj.data()}}, in);
    }
    for (int64_t i = 0; i < T * d; ++i) x[i] += proj[i];
    for (int64_t t = 0; t < T; ++t) rms_norm(x.data() + t * d, L.ffn_norm.data(), h.data() + t * d, d, c.rms_eps);
    {
      const Input in(h.data(), T, d);
      matmul({{&L.gate, g.data()}, {&L.up, u.data()}}, in);
    }
    for (int64_t i = 0; i < T * c.n_ff; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    {
      const Input in(g.data(), T, c.n_ff);
      matmul({{&L.down, proj.data()}}, in);
    }
    for (int64_t i = 0; i < T * d; ++i) x[i] += proj[i];
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
}

}  // namespace kiln::llm
