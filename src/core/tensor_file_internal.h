#pragma once
// In-memory halves of save_tensor_file/load_tensor_file, for tests and the fuzzer
// (fuzz/checkpoint_fuzzer.cc). Format: docs/formats/checkpoint.md.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/core/tensor_file.h"

namespace kiln::internal {

// The exact bytes save_tensor_file writes. Throws InvalidArgumentError like it.
std::string serialize_tensor_file(const TensorFile& data);
// Parses and fully validates a tensor file image; `source` (a path) names it in
// DataLossError messages. With `owner` (which keeps `bytes` alive), tensors borrow
// `bytes` instead of copying them.
TensorFile parse_tensor_file(std::string_view bytes, const std::string& source,
                             const std::shared_ptr<const void>& owner = nullptr);
// CRC-32C of A||B from crc32c(A), crc32c(B) and |B| (zlib's crc32_combine).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Largest JSON header accepted (the limit of the reference safetensors reader).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr const char* kFormatVersion = "kiln-checkpoint-1";

}  // namespace kiln::internal
