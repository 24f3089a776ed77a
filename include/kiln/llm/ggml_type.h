#pragma once
// ggml's tensor types as GGUF files store them: ids, block geometry, names, and
// dequantisation to f32 (docs/formats/gguf.md lists the block layouts).
//
// A quantised type packs `block_elements` consecutive weights of a row into
// `block_bytes` bytes; rows are whole blocks. The ids are ggml's (stable across
// llama.cpp releases); types kiln cannot decode are listed too, so that a file using
// them opens and the error names the type. q8_1 is ggml's 36-byte block (an activation
// format that files do not store; the `gguf` Python package's table says 40).
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::llm {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

struct GgmlTypeInfo {
  const char* name;       // ggml's name: "q4_K", "bf16" ...
  int64_t block_elements;  // weights per block (1 for plain types)
  size_t block_bytes;      // bytes per block
  bool dequantizable;      // kiln decodes it (dequantize_row below)
};

// The type's geometry, or nullptr for an id ggml does not define (a corrupt file).
const GgmlTypeInfo* ggml_type_info(uint32_t id);

// "q4_K", or "type 42" for an unknown id: for messages.
std::string ggml_type_name(uint32_t id);

// Bytes of `elements` weights of `type`; `elements` must be a multiple of the block size.
size_t ggml_row_bytes(GgmlType type, int64_t elements);

// Decodes `n` weights (a multiple of the type's block size) from `src` into `dst`, as
// ggml's dequantize_row_* does (bit-exact with llama.cpp's scalar reference and the
// `gguf` Python package). Throws UnimplementedError, naming the type, for a type kiln
// does not decode, InvalidArgumentError when n is not whole blocks.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace kiln::llm
