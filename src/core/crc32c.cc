#include "kiln/core/crc32c.h"

#include <boost/crc.hpp>

namespace kiln {

namespace {
uint32_t reverse_bits(uint32_t v) {
  v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
  v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
  v = ((v >> 4) & 0x0F0F0F0Fu) | ((v & 0x0F0F0F0Fu) << 4);
  v = ((v >> 8) & 0x00FF00FFu) | ((v & 0x00FF00FFu) << 8);
  return (v >> 16) | (v << 16);
}
}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  // Boost.CRC's table-driven reflected CRC-32C. To continue from a finished CRC, undo
  // its final inversion; Boost takes the initial remainder unreflected, hence the
  // bit reversal.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> c(reverse_bits(crc ^ 0xFFFFFFFFu));
  c.process_bytes(data, n);
  return c.checksum();
}

}  // namespace kiln
