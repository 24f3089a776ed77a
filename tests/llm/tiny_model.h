#pragma once
// Tiny language models with random weights, one per GGUF tensor type, written byte for
// byte here (a splitmix64 stream: no library's random numbers or float formatting), so the
// test that runs them in kiln (tiny_models_test.cc) and the fixture maker that runs them
// in llama.cpp (bench/peers/make_llm_fixtures.py, through kiln_tiny_gguf) see the same
// files. Every model: 2 layers, 256 wide (the K types' blocks are 256 weights), 4 query
// and 2 key/value heads of 64 (grouped-query attention), a SwiGLU MLP of 512, and every
// matrix, the token embedding included, in the model's type; the architectures (llama,
// qwen2 with its q/k/v biases and NeoX RoPE, qwen3 with its per-head q/k norms and NeoX
// RoPE, llama with Llama 3's rope_freqs.weight: "llama3", phi3 with its fused attn_qkv and
// gate+up, NeoX RoPE over half of each head, LongRoPE factors and attention factor;
// gemma3 with q/k norms, post-norms, GeGLU, scaled embeddings and a sliding window of 8
// positions on layer 0 (a pattern of 2 and a final logit cap of 3 in the SentencePiece
// one, a per-layer flag array in the BPE one), its global layer on another RoPE base;
// gemma2 likewise without q/k norms, its window on layer 0 by default, scores capped at
// 0.5 and logits at the default 30),
// tokenizer kinds (the BPE phi3 with Phi-4-mini's gpt-4o pre-tokenizer)
// (SentencePiece-style BPE with byte fallback, and byte-level BPE) and tied or separate
// output heads alternate over the types. Quantised blocks are random bytes with small random scales, as the
// kernels' tests make them.
#include <unistd.h>

#include <algorithm>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/core/half.h"
#include "kiln/llm/ggml_type.h"
#include "kiln/llm/model.h"
#include "llm/gguf_builder.h"

namespace kiln::llm::testing {

struct TinyModel {
  std::string name;  // "q4_K-llama-spm": the fixture files' stem
  GgmlType type;
  std::string arch;  // "llama", "qwen2", "qwen3", "phi3", "gemma2" or "gemma3"
  bool bpe;          // byte-level BPE ("gpt2"); else SentencePiece-style ("llama")
  bool tied;         // no output.weight: the head is the token embedding
  bool rope_freqs = false;  // llama with Llama 3's frequency factors (rope_freqs.weight)
  // phi3: an original context of 64 positions, below the trained 256 (and llama.cpp's
  // 2048), so the long factors apply; else 4096, above both: the short ones.
  bool long_rope = false;
};

inline std::vector<TinyModel> tiny_models() {
  struct Row {
    GgmlType type;
    const char* type_name;
    const char* arch;
    bool bpe, tied;
    bool rope_freqs = false, long_rope = false;
  };
  const Row rows[] = {
      {GgmlType::kF32, "f32", "llama", false, false},   {GgmlType::kF16, "f16", "qwen2", true, true},
      {GgmlType::kBF16, "bf16", "llama", true, false},  {GgmlType::kQ8_0, "q8_0", "llama", false, true},
      {GgmlType::kQ4_0, "q4_0", "qwen2", false, false}, {GgmlType::kQ4_1, "q4_1", "llama", true, false},
      {GgmlType::kQ5_0, "q5_0", "llama", false, false}, {GgmlType::kQ5_1, "q5_1", "qwen2", true, true},
      {GgmlType::kQ4_K, "q4_K", "llama", false, false}, {GgmlType::kQ5_K, "q5_K", "llama", true, true},
      {GgmlType::kQ6_K, "q6_K", "qwen2", false, false},
      {GgmlType::kF32, "f32", "qwen3", true, false},    {GgmlType::kQ8_0, "q8_0", "qwen3", false, true},
      {GgmlType::kF16, "f16", "llama", false, false, true}, {GgmlType::kQ4_K, "q4_K", "llama", true, true, true},
      {GgmlType::kQ4_0, "q4_0", "phi3", false, false, false, true}, {GgmlType::kQ8_0, "q8_0", "phi3", true, true},
      {GgmlType::kQ5_0, "q5_0", "gemma3", false, true}, {GgmlType::kF16, "f16", "gemma3", true, false},
      {GgmlType::kQ4_1, "q4_1", "gemma2", false, true},
  };
  std::vector<TinyModel> out;
  for (const Row& r : rows)
    out.push_back({std::string(r.type_name) + "-" + (r.rope_freqs ? "llama3" : r.arch) + (r.bpe ? "-bpe" : "-spm"), r.type, r.arch,
                   r.bpe, r.tied, r.rope_freqs, r.long_rope});
  return out;
}

namespace tiny_detail {

constexpr int64_t kEmbd = 256, kFf = 512, kHead = 4, kHeadKv = 2, kHeadDim = 64, kLayers = 2, kCtx = 256;

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi): 24 random bits, exact in float.
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
};

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = half::from_float(v);
  std::memcpy(p, &h, 2);
}

// UTF-8 of one code point.
inline std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12)), s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// GPT-2's byte-level alphabet: byte b is the character byte_char(b) in token texts.
inline std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff); };
  if (printable(b)) return utf8(static_cast<uint32_t>(b));
  int n = 0;
  for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
  return utf8(256u + static_cast<uint32_t>(n));
}

struct Vocab {
  std::vector<std::string> tokens, merges;
  std::vector<float> scores;
  std::vector<int32_t> types;  // 1 normal, 2 unknown, 3 control, 6 byte
  uint32_t bos = 0, eos = 0, unk = 0;
};

// Pieces both vocabularies build from ("_" is the word-start marker: U+2581 for
// SentencePiece, U+0120 "Ġ" for byte-level BPE), each made of two earlier ones or of
// single characters.
inline const std::vector<std::pair<std::string, std::string>>& piece_merges() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"_", "t"},   {"h", "e"},   {"_t", "he"}, {"i", "n"},   {"_", "a"},    {"e", "r"},   {"a", "t"},
      {"_", "c"},   {"_c", "at"}, {"_", "h"},   {"_h", "at"}, {"o", "n"},    {"_", "s"},   {"r", "e"},
      {"_", "w"},   {"o", "r"},   {"_w", "or"}, {"l", "d"},   {"_wor", "ld"}, {"l", "l"},   {"e", "n"},
      {"_", "i"},   {"_i", "n"},  {"_a", "n"},  {"_an", "d"}, {"_", "o"},    {"_o", "n"},  {"i", "s"},
      {"_", "1"},   {"2", "3"},   {"_1", "23"}, {"_", "k"},   {"_k", "i"},   {"l", "n"},   {"_ki", "ln"},
  };
  return m;
}

inline std::string marked(const std::string& s, const std::string& marker) {
  std::string out;
  for (char c : s) out += c == '_' ? marker : std::string(1, c);
  return out;
}

inline Vocab spm_vocab() {
  Vocab v;
  const std::string marker = "\xe2\x96\x81";  // U+2581
  auto add = [&](std::string t, float score, int32_t type) {
    v.tokens.push_back(std::move(t)), v.scores.push_back(score), v.types.push_back(type);
  };
  add("<unk>", 0, 2), add("<s>", 0, 3), add("</s>", 0, 3);
  v.unk = 0, v.bos = 1, v.eos = 2;
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add(hex, 0, 6);
  }
  // Single characters (so most text merges), then the pieces; SentencePiece merges the
  // pair whose result scores highest first.
  for (char c : std::string("_abcdefghijklmnopqrstuvwxyz0123456789.,!?'")) add(marked(std::string(1, c), marker), -1000, 1);
  float score = -1.0f;
  for (const auto& [a, b] : piece_merges()) {
    add(marked(a + b, marker), score, 1);
    score -= 1.0f;
  }
  return v;
}

inline Vocab bpe_vocab() {
  Vocab v;
  const std::string marker = byte_char(' ');  // "Ġ"
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_char(b)), v.types.push_back(1);
  for (const auto& [a, b] : piece_merges()) {
    v.merges.push_back(marked(a, marker) + " " + marked(b, marker));
    v.tokens.push_back(marked(a + b, marker)), v.types.push_back(1);
  }
  v.tokens.push_back("<|endoftext|>"), v.types.push_back(3);
  v.bos = v.eos = static_cast<uint32_t>(v.tokens.size() - 1);
  return v;
}

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: row length first
  GgmlType type;
  std::string data;
};

// A rows x cols matrix of `type`, random, of magnitude ~0.1.
inline std::string random_matrix(GgmlType type, int64_t rows, int64_t cols, Rng& rng) {
  const size_t n = static_cast<size_t>(rows * cols);
  std::string out;
  if (type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      const float w = rng.uniform(-0.15f, 0.15f);
      if (type == GgmlType::kF32) out.append(reinterpret_cast<const char*>(&w), 4);
      else {
        const uint16_t h = type == GgmlType::kF16 ? half::from_float(w) : bfloat16::from_float(w);
        out.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    return out;
  }
  out.resize(ggml_row_bytes(type, cols) * static_cast<size_t>(rows));
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  for (size_t i = 0; i < out.size(); ++i) p[i] = static_cast<uint8_t>(rng.next() >> 56);
  // Scales such that a typical weight is ~0.05-0.1 (q - zero point times the scale;
  // the K types multiply by 6-bit or 8-bit sub-block scales as well), and offsets of the
  // types with a minimum that centre the weights on 0 (else every row's mean would add
  // the same direction to every output, and a random model would repeat one token).
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  for (size_t at = 0; at < out.size(); at += info->block_bytes) {
    uint8_t* b = p + at;
    const float d = rng.uniform(0.006f, 0.018f);
    switch (type) {
      case GgmlType::kQ4_0: put_f16(b, d); break;
      case GgmlType::kQ4_1: put_f16(b, d), put_f16(b + 2, -7.5f * d + rng.uniform(-0.01f, 0.01f)); break;
      case GgmlType::kQ5_0: put_f16(b, d / 2); break;
      case GgmlType::kQ5_1: put_f16(b, d / 2), put_f16(b + 2, -7.75f * d + rng.uniform(-0.01f, 0.01f)); break;
      case GgmlType::kQ8_0: put_f16(b, d / 16); break;
      // weight = d x scale x q - dmin x min, scale and min 6-bit (mean 31.5), q mean 7.5 / 15.5
      case GgmlType::kQ4_K: put_f16(b, d / 32), put_f16(b + 2, 7.5f * d / 32); break;
      case GgmlType::kQ5_K: put_f16(b, d / 64), put_f16(b + 2, 15.5f * d / 64); break;
      case GgmlType::kQ6_K: put_f16(b + 208, d / 128); break;
      default: break;
    }
  }
  return out;
}

inline std::string f32_vector(int64_t n, float lo, float hi, Rng& rng) {
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const float v = rng.uniform(lo, hi);
    out.append(reinterpret_cast<const char*>(&v), 4);
  }
  return out;
}

}  // namespace tiny_detail

// The GGUF file's bytes (version 3, alignment 32).
inline std::string tiny_model_gguf(const TinyModel& m) {
  using namespace tiny_detail;
  Vocab v = m.bpe ? bpe_vocab() : spm_vocab();
  if (m.arch == "phi3")  // Phi-3's chat tokens, and those llama.cpp looks up in a file named phi3
    for (const char* s : {"<unk>", "<s>", "</s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"})
      if (std::find(v.tokens.begin(), v.tokens.end(), s) == v.tokens.end())
        v.tokens.push_back(s), v.scores.push_back(0), v.types.push_back(3);
  const int64_t n_vocab = static_cast<int64_t>(v.tokens.size()), kv_dim = kHeadKv * kHeadDim;
  const bool phi3 = m.arch == "phi3", gemma2 = m.arch == "gemma2", gemma3 = m.arch == "gemma3";
  const int64_t n_rot = phi3 ? kHeadDim / 2 : kHeadDim;
  Rng rng{0x6b696c6e + static_cast<uint64_t>(m.type) * 1000003u};
  std::vector<Tensor> ts;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    ts.push_back({name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, m.type,
                  random_matrix(m.type, rows, cols, rng)});
  };
  auto vec = [&](const std::string& name, int64_t n, float lo, float hi) {
    ts.push_back({name, {static_cast<uint64_t>(n)}, GgmlType::kF32, f32_vector(n, lo, hi, rng)});
  };
  matrix("token_embd.weight", n_vocab, kEmbd);
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", kEmbd, 0.8f, 1.2f);
    if (phi3) {
      matrix(p + "attn_qkv.weight", kHead * kHeadDim + 2 * kv_dim, kEmbd);
    } else {
      matrix(p + "attn_q.weight", kHead * kHeadDim, kEmbd);
      matrix(p + "attn_k.weight", kv_dim, kEmbd);
      matrix(p + "attn_v.weight", kv_dim, kEmbd);
    }
    if (m.arch == "qwen2") {
      vec(p + "attn_q.bias", kHead * kHeadDim, -0.2f, 0.2f);
      vec(p + "attn_k.bias", kv_dim, -0.2f, 0.2f);
      vec(p + "attn_v.bias", kv_dim, -0.2f, 0.2f);
    }
    if (m.arch == "qwen3" || gemma3) {
      vec(p + "attn_q_norm.weight", kHeadDim, 0.5f, 1.5f);
      vec(p + "attn_k_norm.weight", kHeadDim, 0.5f, 1.5f);
    }
    matrix(p + "attn_output.weight", kEmbd, kHead * kHeadDim);
    if (gemma2 || gemma3) vec(p + "post_attention_norm.weight", kEmbd, 0.8f, 1.2f);
    vec(p + "ffn_norm.weight", kEmbd, 0.8f, 1.2f);
    if (phi3) {
      matrix(p + "ffn_up.weight", 2 * kFf, kEmbd);  // the gate's rows, then up's
    } else {
      matrix(p + "ffn_gate.weight", kFf, kEmbd);
      matrix(p + "ffn_up.weight", kFf, kEmbd);
    }
    matrix(p + "ffn_down.weight", kEmbd, kFf);
    if (gemma2 || gemma3) vec(p + "post_ffw_norm.weight", kEmbd, 0.8f, 1.2f);
  }
  vec("output_norm.weight", kEmbd, 0.8f, 1.2f);
  if (!m.tied) matrix("output.weight", n_vocab, kEmbd);
  // Llama 3's factors: 1 for the fast-turning pairs, up to 8 for the slow ones (random
  // here, so that every pair's factor counts).
  if (m.rope_freqs) vec("rope_freqs.weight", kHeadDim / 2, 1.0f, 8.0f);
  // Phi-3's LongRoPE (over n_rot = 32 of the 64 dimensions): both sets, as its converter
  // writes them; long factors grow to ~40 for the slow pairs, short ones stay near 1.
  if (phi3) {
    vec("rope_factors_long.weight", n_rot / 2, 1.0f, 40.0f);
    vec("rope_factors_short.weight", n_rot / 2, 0.9f, 1.6f);
  }

  GgufBuilder kv;  // the metadata, counted
  const std::string a = m.arch + ".";
  kv.kv_string("general.architecture", m.arch);
  kv.kv_string("general.name", "kiln tiny " + m.name);
  kv.kv_u32(a + "context_length", kCtx);
  kv.kv_u32(a + "embedding_length", kEmbd);
  kv.kv_u32(a + "block_count", kLayers);
  kv.kv_u32(a + "feed_forward_length", kFf);
  kv.kv_u32(a + "attention.head_count", kHead);
  kv.kv_u32(a + "attention.head_count_kv", kHeadKv);
  kv.kv_u32(a + "rope.dimension_count", static_cast<uint32_t>(n_rot));
  if (phi3) {
    kv.kv_u32(a + "rope.scaling.original_context_length", m.long_rope ? 64 : 4096);
    kv.kv_f32(a + "rope.scaling.attn_factor", 1.19f);
    kv.kv_u32(a + "attention.sliding_window", 48);  // (not applied, as in llama.cpp)
  }
  if (gemma2) {
    kv.kv_u32(a + "attention.sliding_window", 8);
    kv.kv_f32(a + "attn_logit_softcapping", 0.5f);
  }
  if (gemma3) {
    kv.kv_u32(a + "attention.sliding_window", 8);
    if (m.bpe) {
      kv.kv_array(a + "attention.sliding_window_pattern", 7, std::vector<uint8_t>{1, 0});
    } else {
      kv.kv_u32(a + "attention.sliding_window_pattern", 2);
      kv.kv_f32(a + "final_logit_softcapping", 3.0f);
    }
  }
  kv.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  kv.kv_f32(a + "rope.freq_base", m.arch == "llama" ? 10000.0f : 1000000.0f);
  kv.kv_u32("general.alignment", 32);
  if (m.bpe) {
    kv.kv_string("tokenizer.ggml.model", "gpt2");
    kv.kv_string("tokenizer.ggml.pre", phi3 ? "gpt-4o" : "gpt-2");  // (Phi-4-mini's pre-tokenizer)
    kv.kv_array("tokenizer.ggml.merges", 8, v.merges);
  } else {
    kv.kv_string("tokenizer.ggml.model", "llama");
    kv.kv_array("tokenizer.ggml.scores", 6, v.scores);
    kv.kv_u32("tokenizer.ggml.unknown_token_id", v.unk);
  }
  kv.kv_array("tokenizer.ggml.tokens", 8, v.tokens);
  kv.kv_array("tokenizer.ggml.token_type", 5, v.types);
  kv.kv_u32("tokenizer.ggml.bos_token_id", v.bos);
  kv.kv_u32("tokenizer.ggml.eos_token_id", v.eos);
  kv.kv_bool("tokenizer.ggml.add_bos_token", !m.bpe);
  kv.kv_bool("tokenizer.ggml.add_eos_token", false);
  GgufBuilder w;
  w.header(ts.size(), kv.n_kv);
  w.bytes += kv.bytes;
  uint64_t offset = 0;
  for (const Tensor& t : ts) {
    w.tensor(t.name, t.dims, static_cast<uint32_t>(t.type), offset);
    offset += (t.data.size() + 31) / 32 * 32;
  }
  for (const Tensor& t : ts) {
    w.data(0);  // (padding to the alignment)
    w.bytes += t.data;
  }
  w.data(0);
  return w.bytes;
}

// The model, written to a temporary file, loaded (Model::load) and the file removed (the
// weights are read or mapped by then).
inline std::shared_ptr<const Model> load_tiny_model(const TinyModel& m, const ModelLoadOptions& options = {}) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_tiny_" + m.name + "_" + std::to_string(::getpid()) + "_" +
                             std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + ".gguf"))
                               .string();
  std::ofstream(path, std::ios::binary) << tiny_model_gguf(m);
  std::shared_ptr<const Model> model;
  try {
    model = Model::load(path, options);
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
  std::filesystem::remove(path);
  return model;
}

}  // namespace kiln::llm::testing
