#pragma once
// Decoder-only transformers of the llama family (llama, mistral, qwen2, qwen3, phi3, gemma2,
// gemma3) from
// GGUF: token embedding, RMSNorm, rotary position embedding (GGUF's normal or neox pairing,
// over all or the first n_rot dimensions of a head; Llama 3's per-pair frequency factors,
// rope_freqs.weight, when the file has them; Phi-3's LongRoPE: short or long factors by the
// context size, and its attention factor; qwen3's and gemma3's per-head RMSNorm of q and k
// before it; Gemma's sliding-window layers with their own RoPE base, scaled embeddings,
// post-norms, GeGLU and soft caps),
// grouped-query attention over the paged KV cache, SwiGLU MLP, tied or separate output
// head. Phi-3's fused attn_qkv and gate+up (ffn_up of 2 x n_ff rows) are read as views of
// their row ranges; its sliding window (phi3.attention.sliding_window) is not applied, as
// llama.cpp does not (full attention over the context). Every hyperparameter is read from the file's metadata. Weights stay quantised:
// the matrices of the types the group kernels take (q4_0 ... q8_0, q4_K, q5_K, q6_K) are
// repacked at load into their interleaved layout (src/llm/quant_kernels.h; the same
// bytes or fewer for 4- and 8-bit types, up to 1.8x for 5- and 6-bit ones) and the
// file's pages they came from are released; others are multiplied in the file's mapping.
//
// forward() runs one step over a batch of tokens that may belong to different
// sequences at different positions (a prompt's tokens, or one new token of each of many
// sequences): the serving engine's continuous batching calls it once per step.
//
// Two ways to run it (ModelLoadOptions::device): by default on the CPU with kiln's
// hand-written kernels on the quantised weights (above); or, given a device, on that
// device through kiln's ops (the tensor path: weights dequantised to bf16/f16/f32 in the
// device's memory, the KV cache there too), which is how a model runs on a GPU
// ("cuda:0": cuBLASLt matmuls and the fused attention kernel).
//
// Thread-safety: a Model is immutable after load; forward() may run concurrently on
// different KV caches. forward() uses kiln's intra-op pool (kiln/core/parallel.h).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/llm/kv_cache.h"
#include "kiln/llm/tokenizer.h"

namespace kiln::llm {

class GgufFile;
struct TensorWeights;

struct ModelConfig {
  std::string architecture;  // general.architecture
  std::string name;          // general.name, if any
  int64_t n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_rot = 0;         // rotated dimensions per head
  int64_t n_ctx_train = 0;   // context length the model was trained for
  int64_t n_vocab = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // positions are multiplied by this (linear scaling)
  bool rope_neox = false;        // rotate (i, i + n_rot/2) instead of (2i, 2i+1)
  // Per rotary pair, the angle is divided by this (Llama 3's rope_freqs.weight, or Phi-3's
  // rope_factors_short / rope_factors_long as ModelLoadOptions::context_length selects:
  // n_rot / 2 values, as ggml's freq_factors); empty: none.
  std::vector<float> rope_freq_factors;
  // cos and sin of every angle are multiplied by this (ggml's attn_factor; Phi-3's
  // rope.scaling.attn_factor, which scales q.k by its square).
  float rope_attn_factor = 1.0f;
  bool tied_output = false;      // the output head is the token embedding
  bool qkv_bias = false;
  // How the file stores the projections (phi3): q, k and v rows in one attn_qkv; the gate's
  // rows, then up's, in one ffn_up of 2 x n_ff rows. Both paths read them from these.
  bool fused_qkv = false, fused_gate_up = false;
  bool qk_norm = false;          // qwen3, gemma3: each head of q and k RMS-normalised (weights of head_dim) before RoPE
  float attn_scale = 0;          // scores are scale * q.k: 1/sqrt(head_dim) (gemma3 27B: 1/sqrt(n_embd / n_head))
  // gemma2, gemma3: token embeddings times sqrt(n_embd); each block's attention and MLP outputs
  // RMS-normalised (attn_post_norm, ffn_post_norm) before their residual adds; GeGLU
  // (GELU, tanh form, of the gate) instead of SwiGLU.
  float embed_scale = 1.0f;
  bool post_norms = false;
  bool gelu = false;
  float final_logit_softcap = 0;  // > 0: logits become c * tanh(logits / c)
  float attn_softcap = 0;         // > 0: attention scores (scaled) become c * tanh(s / c) (gemma2)
  // Sliding-window attention (gemma2, gemma3): in the layers swa_layers marks, a query
  // attends to its last swa_window positions only (itself included), with RoPE base
  // rope_base_swa, scale rope_freq_scale_swa and no factors; the other layers see the
  // whole context. 0: none.
  int64_t swa_window = 0;
  std::vector<bool> swa_layers;
  float rope_base_swa = 10000.0f, rope_freq_scale_swa = 1.0f;
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  bool is_swa(int64_t layer) const { return swa_window > 0 && swa_layers[static_cast<size_t>(layer)]; }
};

// One token of a batch.
struct BatchToken {
  KvCache::SeqId seq;
  TokenId token;
  int64_t pos;          // its position in the sequence (the cache grows to pos + 1)
  bool logits = false;  // compute the logits of the next token after it
};

struct ModelLoadOptions {
  // Repack the weight matrices for the group kernels (faster; false keeps every matrix
  // in the file's mapping and multiplies with the row kernels: for comparisons).
  bool repack = true;
  // Run on this device with kiln's ops (the tensor path) instead of the CPU kernels;
  // weights are dequantised at load to `dtype` (f32, f16 or bf16; bf16: half the memory
  // of f32 and Tensor Core matmuls on a GPU). Unset: the CPU kernels. Errors at load:
  // NotFoundError for a device kiln does not have (a CPU-only build, no GPU),
  // InvalidArgumentError for another dtype, ResourceExhaustedError when the weights do
  // not fit in the device's memory.
  std::optional<Device> device;
  DType dtype = DType::kBF16;
  // The longest context the model will run (0: the one it was trained for; larger is
  // capped to it). Chooses Phi-3's long RoPE factors when over the file's
  // rope.scaling.original_context_length, else the short ones, as llama.cpp does with its
  // context size; no other model reads it. Pass the serving engine's context length.
  int64_t context_length = 0;
};

class Model {
 public:
  // Maps and checks `path`: DataLossError for a malformed file, UnimplementedError for an
  // architecture or tensor type kiln does not run (named), NotFoundError for a missing
  // tensor (named) or file.
  static std::shared_ptr<const Model> load(const std::string& path, const ModelLoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& file() const { return *file_; }
  size_t weight_bytes() const;  // bytes of weights one decode step reads
  // Where forward() runs: the CPU for the CPU kernels, else the tensor path's device.
  Device device() const;
  bool tensor_path() const { return tensor_ != nullptr; }

  // Runs the batch. Tokens of one sequence must come in position order; each token's
  // key and value are written to the cache at its position first, and it attends to
  // positions 0..pos of its sequence. Writes n_vocab logits per token with `logits` set,
  // in batch order, to `logits` (size: count x n_vocab). InvalidArgumentError for a token
  // id outside the vocabulary or a position past the cache's sequence length + batch;
  // ResourceExhaustedError when the cache cannot hold the batch (then nothing changed);
  // InvalidArgumentError for a cache whose layout or device is not this model's.
  void forward(std::span<const BatchToken> batch, KvCache& cache, float* logits) const;

  // A KV cache for this model: options' size, with the layout and device forward()
  // reads (options.layout and options.device are replaced).
  KvCache make_cache(KvCacheOptions options = {}) const;

  struct Weights;

 private:
  Model() = default;
  ModelConfig config_;
  std::shared_ptr<const GgufFile> file_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<TensorWeights> tensor_;  // the tensor path's, when it runs
};

}  // namespace kiln::llm
