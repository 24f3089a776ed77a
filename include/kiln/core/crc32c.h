#pragma once
// CRC-32C (Castagnoli), as used by TFRecord, LevelDB and kiln's checkpoints.
#include <cstddef>
#include <cstdint>

namespace kiln {

// CRC-32C of n bytes, continuing from `crc` (0 to start).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }
// TFRecord's masked form: rotate right by 15 and add 0xa282ead8.
inline uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t crc32c_unmask(uint32_t m) {
  uint32_t rot = m - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace kiln
