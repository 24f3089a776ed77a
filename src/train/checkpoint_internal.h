#pragma once
// In-memory halves of save_checkpoint/load_checkpoint, for tests and the fuzzer
// (fuzz/checkpoint_fuzzer.cc). Format: docs/formats/checkpoint.md.
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/train/checkpoint.h"

namespace kiln::train::internal {

// The exact bytes save_checkpoint writes. Throws InvalidArgumentError like it.
std::string serialize_checkpoint(const CheckpointData& data);
// Parses and fully validates a checkpoint image; `source` (a path) names it in
// DataLossError messages.
CheckpointData parse_checkpoint(std::string_view bytes, const std::string& source);
// CRC-32C of A||B from crc32c(A), crc32c(B) and |B| (zlib's crc32_combine).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Largest JSON header accepted (the limit of the reference safetensors reader).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr const char* kFormatVersion = "kiln-checkpoint-1";

}  // namespace kiln::train::internal
