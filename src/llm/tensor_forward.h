#pragma once
// The tensor path: the llama-family forward step built from kiln ops (kiln/ops), so that
// it runs on any device with kernels for them, a GPU first (cuBLASLt matmuls, the fused
// attention kernel, the KV cache in device memory). On the CPU, model.cc's hand-written
// kernels on the quantised weights are faster; the tensor path runs there too, which is
// how its tests check it (against those kernels and the tiny models' exact logits).
//
// Weights are dequantised once at load to f32 and stored as `dtype` (bf16 halves the
// memory and runs on Tensor Cores; f32 is exact); activations, norms, rotary embedding
// and attention stay f32, and a matmul rounds its input to the weights' dtype. The KV
// cache is f16 in KvLayout::kRows on the device: a step writes its keys and values with
// ops::index_copy in place (per layer, one call for the keys and one for the values of
// every token) and reads them with ops::paged_attention (one call per layer).
#include <cmath>
#include <memory>
#include <span>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/llm/model.h"

namespace kiln::llm {

class GgufFile;

struct TensorWeights {
  struct Layer {
    Tensor attn_norm, ffn_norm, bqkv;  // f32 (the bias undefined without one)
    Tensor q_norm, k_norm;             // f32 [head_dim] (qwen3, gemma3; undefined otherwise)
    Tensor attn_post_norm, ffn_post_norm;  // f32 [n_embd] (gemma3; undefined otherwise)
    // [out, in] of `dtype`; q, k and v stacked (one matmul), gate and up too.
    Tensor wqkv, wo, gate_up, down;
  };
  Device device;
  DType dtype = DType::kF32;
  Tensor embedding;    // [n_vocab, n_embd], f32 (rows looked up, never multiplied)
  Tensor output;       // [n_vocab, n_embd] of `dtype` (the embedding's values when tied)
  Tensor output_norm;  // f32
  std::vector<Layer> layers;
  size_t bytes() const;  // device memory the weights take
};

// Dequantises the model's weights onto `device` as `dtype` (f32, f16 or bf16;
// InvalidArgumentError otherwise or when the device's backend cannot hold that dtype).
std::unique_ptr<TensorWeights> load_tensor_weights(const GgufFile& f, const ModelConfig& c, Device device, DType dtype);

// One forward step of a checked batch whose cache positions are reserved (Model::forward
// does both): logits of the tokens that ask for them to host memory, as Model::forward.
void tensor_forward(const ModelConfig& c, const TensorWeights& w, std::span<const BatchToken> batch, KvCache& cache,
                    float* logits);

// Both paths' last step: logits = cap * tanh(logits / cap) when the model caps them
// (final_logit_softcapping), over `rows` rows of the vocabulary.
inline void softcap_logits(const ModelConfig& c, float* logits, int64_t rows) {
  if (c.final_logit_softcap <= 0) return;
  const float cap = c.final_logit_softcap;
  for (int64_t i = 0; i < rows * c.n_vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
}

}  // namespace kiln::llm
