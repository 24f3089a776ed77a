// The llama-family forward step from kiln ops, on any device (see tensor_forward.h).
#include "llm/tensor_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kiln/core/error.h"
#include "kiln/llm/gguf.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/shape.h"
#include "llm/rope.h"

namespace kiln::llm {

using detail::str_cat;

namespace {

// A tensor of the file as [rows, cols] f32 values (ggml's dims are {cols, rows}).
Tensor dequantized(const GgufFile& f, const std::string& name, const std::vector<int64_t>& shape) {
  return Tensor::from_vector(f.dequantize(f.tensor(name)), Shape(shape));
}

// y = x w^T: x [n, in] f32, w [out, in]; x rounded to w's dtype, y f32.
Tensor linear(const Tensor& x, const Tensor& w) {
  if (w.dtype() == DType::kF32) return ops::matmul(x, w, false, true);
  return ops::cast(ops::matmul(ops::cast(x, w.dtype()), w, false, true), DType::kF32);
}

// Rotates the first n_rot dimensions of every head of x [T, H, hd] by the tokens'
// angles cs, sn [T, 1, n_rot / 2]: pairs (2i, 2i + 1), or (i, i + n_rot / 2) for NeoX.
Tensor rope(const Tensor& x, const Tensor& cs, const Tensor& sn, const ModelConfig& c) {
  const int64_t T = x.dim(0), H = x.dim(1), hd = x.dim(2), r = c.n_rot, hr = r / 2;
  const Tensor rot = r == hd ? x : ops::slice(x, {0, 0, 0}, {T, H, r});
  Tensor x0, x1;
  if (c.rope_neox) {
    x0 = ops::slice(rot, {0, 0, 0}, {T, H, hr});
    x1 = ops::slice(rot, {0, 0, hr}, {T, H, hr});
  } else {
    const Tensor pairs = ops::reshape(rot, {T, H, hr, 2});
    x0 = ops::reshape(ops::slice(pairs, {0, 0, 0, 0}, {T, H, hr, 1}), {T, H, hr});
    x1 = ops::reshape(ops::slice(pairs, {0, 0, 0, 1}, {T, H, hr, 1}), {T, H, hr});
  }
  const Tensor y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
  Tensor y = c.rope_neox ? ops::concat({y0, y1}, 2) : ops::reshape(ops::stack({y0, y1}, 3), {T, H, r});
  if (r < hd) y = ops::concat({y, ops::slice(x, {0, 0, r}, {T, H, hd - r})}, 2);
  return y;
}

}  // namespace

size_t TensorWeights::bytes() const {
  size_t n = embedding.nbytes() + output_norm.nbytes() + (output.is_same(embedding) ? 0 : output.nbytes());
  for (const Layer& L : layers)
    for (const Tensor* t : {&L.attn_norm, &L.ffn_norm, &L.bqkv, &L.q_norm, &L.k_norm, &L.wqkv, &L.wo, &L.gate_up, &L.down})
      if (t->defined()) n += t->nbytes();
  return n;
}

std::unique_ptr<TensorWeights> load_tensor_weights(const GgufFile& f, const ModelConfig& c, Device device, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16)
    throw InvalidArgumentError(str_cat("language model weights on ", device.str(), " must be f32, f16 or bf16, not ",
                                       dtype_name(dtype)));
  if (!backend_for(device).supports(dtype))
    throw InvalidArgumentError(str_cat(device.str(), " does not run ", dtype_name(dtype), " tensors"));
  auto w = std::make_unique<TensorWeights>();
  w->device = device;
  w->dtype = dtype;
  auto f32 = [&](const std::string& name, std::vector<int64_t> shape) { return dequantized(f, name, shape).to(device); };
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    return dequantized(f, name, {rows, cols}).to(dtype).to(device);
  };
  // Matrices that read the same input, stacked by rows (biases by elements).
  auto stacked = [&](const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols, bool to_dtype) {
    std::vector<Tensor> ts;
    for (const auto& [name, rows] : parts)
      ts.push_back(dequantized(f, name, cols ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows}));
    const Tensor all = ops::concat(ts, 0);
    return (to_dtype ? all.to(dtype) : all).to(device);
  };
  const int64_t d = c.n_embd, q_dim = c.n_head * c.head_dim, kv_dim = c.kv_dim();
  const Tensor embedding = dequantized(f, "token_embd.weight", {c.n_vocab, d});
  w->embedding = embedding.to(device);
  w->output = c.tied_output ? (dtype == DType::kF32 ? w->embedding : embedding.to(dtype).to(device))
                            : mat("output.weight", c.n_vocab, d);
  w->output_norm = f32("output_norm.weight", {d});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    TensorWeights::Layer L;
    L.attn_norm = f32(p + "attn_norm.weight", {d});
    L.ffn_norm = f32(p + "ffn_norm.weight", {d});
    L.wqkv = c.fused_qkv  // fused in the file in the same order
                 ? mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d)
                 : stacked({{p + "attn_q.weight", q_dim}, {p + "attn_k.weight", kv_dim}, {p + "attn_v.weight", kv_dim}}, d, true);
    L.wo = mat(p + "attn_output.weight", d, q_dim);
    L.gate_up = c.fused_gate_up ? mat(p + "ffn_up.weight", 2 * c.n_ff, d)
                                : stacked({{p + "ffn_gate.weight", c.n_ff}, {p + "ffn_up.weight", c.n_ff}}, d, true);
    L.down = mat(p + "ffn_down.weight", d, c.n_ff);
    if (c.qk_norm) {
      L.q_norm = f32(p + "attn_q_norm.weight", {c.head_dim});
      L.k_norm = f32(p + "attn_k_norm.weight", {c.head_dim});
    }
    if (c.post_norms) {
      L.attn_post_norm = f32(p + "post_attention_norm.weight", {d});
      L.ffn_post_norm = f32(p + "post_ffw_norm.weight", {d});
    }
    if (c.qkv_bias)
      L.bqkv = stacked({{p + "attn_q.bias", q_dim}, {p + "attn_k.bias", kv_dim}, {p + "attn_v.bias", kv_dim}}, 0, false);
    w->layers.push_back(std::move(L));
  }
  return w;
}

void tensor_forward(const ModelConfig& c, const TensorWeights& w, std::span<const BatchToken> batch, KvCache& cache,
                    float* logits) {
  const Device dev = w.device;
  const int64_t T = static_cast<int64_t>(batch.size()), hd = c.head_dim, q_dim = c.n_head * hd;
  const int64_t kv_dim = c.kv_dim(), bs = cache.block_tokens(), hr = c.n_rot / 2;
  const double scale = c.attn_scale;

  // Host-side inputs of the step, made once for every layer.
  std::vector<int32_t> ids(static_cast<size_t>(T));
  std::vector<float> cs(static_cast<size_t>(T * hr)), sn(cs.size());
  for (int64_t t = 0; t < T; ++t) {
    ids[static_cast<size_t>(t)] = batch[t].token;
    rope_angles(batch[t].pos, c, cs.data() + t * hr, sn.data() + t * hr);
  }
  const Tensor rope_cos = Tensor::from_vector(cs, {T, 1, hr}).to(dev), rope_sin = Tensor::from_vector(sn, {T, 1, hr}).to(dev);
  Tensor swa_cos, swa_sin;  // the sliding-window layers' angles (their own base)
  if (c.swa_window > 0) {
    for (int64_t t = 0; t < T; ++t) rope_angles(batch[t].pos, c, cs.data() + t * hr, sn.data() + t * hr, true);
    swa_cos = Tensor::from_vector(cs, {T, 1, hr}).to(dev), swa_sin = Tensor::from_vector(sn, {T, 1, hr}).to(dev);
  }
  // The step's sequences' block tables (one row each, padded with block 0, never read)
  // and each token's row and position, for paged attention.
  std::vector<KvCache::SeqId> seqs;
  std::vector<int32_t> seq_ids(static_cast<size_t>(T)), positions(static_cast<size_t>(T));
  int64_t max_blocks = 1;
  for (int64_t t = 0; t < T; ++t) {
    const auto it = std::find(seqs.begin(), seqs.end(), batch[t].seq);
    seq_ids[static_cast<size_t>(t)] = static_cast<int32_t>(it - seqs.begin());
    if (it == seqs.end()) seqs.push_back(batch[t].seq);
    positions[static_cast<size_t>(t)] = static_cast<int32_t>(batch[t].pos);
    max_blocks = std::max(max_blocks, batch[t].pos / bs + 1);
  }
  std::vector<int32_t> table(seqs.size() * static_cast<size_t>(max_blocks), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<int32_t>& blocks = cache.blocks(seqs[i]);
    std::copy(blocks.begin(), blocks.begin() + std::min<int64_t>(max_blocks, static_cast<int64_t>(blocks.size())),
              table.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(max_blocks)));
  }
  const Tensor block_tables = Tensor::from_vector(table, {static_cast<int64_t>(seqs.size()), max_blocks}).to(dev);
  const Tensor seq_of = Tensor::from_vector(seq_ids, {T}).to(dev), pos_of = Tensor::from_vector(positions, {T}).to(dev);

  // Each token's cache row (block * block_tokens + slot) in a layer's [blocks x
  // block_tokens, kv_dim] keys or values: where its key and value are written.
  std::vector<int32_t> slots(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int32_t>& blocks = cache.blocks(batch[t].seq);
    slots[static_cast<size_t>(t)] = static_cast<int32_t>(blocks[static_cast<size_t>(batch[t].pos / bs)] * bs + batch[t].pos % bs);
  }
  const Tensor rows_of = Tensor::from_vector(slots, {T}).to(dev);
  const Shape flat{cache.total_blocks() * bs, kv_dim}, pool{cache.total_blocks(), bs, c.n_head_kv, hd};

  Tensor x = ops::embedding(w.embedding, Tensor::from_vector(ids, {T}).to(dev));  // [T, d]
  if (c.embed_scale != 1.0f) x = x * static_cast<double>(c.embed_scale);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const TensorWeights::Layer& L = w.layers[static_cast<size_t>(l)];
    const bool swa = c.is_swa(l);
    const Tensor h = ops::rms_norm(x, L.attn_norm, c.rms_eps);
    Tensor qkv = linear(h, L.wqkv);
    if (c.qkv_bias) qkv = qkv + L.bqkv;
    const std::vector<Tensor> parts = ops::split(qkv, {q_dim, kv_dim, kv_dim}, 1);
    Tensor q = ops::reshape(parts[0], {T, c.n_head, hd}), k = ops::reshape(parts[1], {T, c.n_head_kv, hd});
    if (c.qk_norm) {  // each head normalised over its head_dim values
      q = ops::rms_norm(q, L.q_norm, c.rms_eps);
      k = ops::rms_norm(k, L.k_norm, c.rms_eps);
    }
    q = rope(q, swa ? swa_cos : rope_cos, swa ? swa_sin : rope_sin, c);
    k = rope(k, swa ? swa_cos : rope_cos, swa ? swa_sin : rope_sin, c);
    const Tensor& v = parts[2];
    const Tensor keys = cache.layer_rows(l, 0), values = cache.layer_rows(l, 1);
    ops::index_copy(keys.reshape(flat), rows_of, ops::cast(ops::reshape(k, {T, kv_dim}), DType::kF16), true);
    ops::index_copy(values.reshape(flat), rows_of, ops::cast(v, DType::kF16), true);
    const Tensor att =
        ops::reshape(ops::paged_attention(q, keys.reshape(pool), values.reshape(pool), block_tables, seq_of, pos_of, scale,
                                          swa ? c.swa_window : 0, c.attn_softcap),
                     {T, q_dim});
    Tensor o = linear(att, L.wo);
    if (c.post_norms) o = ops::rms_norm(o, L.attn_post_norm, c.rms_eps);
    x = x + o;
    const Tensor h2 = ops::rms_norm(x, L.ffn_norm, c.rms_eps);
    const std::vector<Tensor> gate_up = ops::split(linear(h2, L.gate_up), 2, 1);
    Tensor f = linear((c.gelu ? ops::gelu(gate_up[0], true) : ops::silu(gate_up[0])) * gate_up[1], L.down);
    if (c.post_norms) f = ops::rms_norm(f, L.ffn_post_norm, c.rms_eps);
    x = x + f;
  }

  std::vector<int32_t> rows;
  for (int64_t t = 0; t < T; ++t)
    if (batch[t].logits) rows.push_back(static_cast<int32_t>(t));
  if (rows.empty()) return;
  const int64_t n = static_cast<int64_t>(rows.size());
  const Tensor sel = n == T ? x : ops::gather(x, Tensor::from_vector(rows, {n}).to(dev));
  const Tensor out = linear(ops::rms_norm(sel, w.output_norm, c.rms_eps), w.output).to(Device::cpu());
  std::memcpy(logits, out.raw_data(), static_cast<size_t>(n * c.n_vocab) * sizeof(float));
  softcap_logits(c, logits, n);
}

}  // namespace kiln::llm
