#include "kiln/core/crc32c.h"

#include <boost/crc.hpp>

namespace kiln {

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  // Boost.CRC's table-driven reflected CRC-32C; the running value is kept
  // pre-inverted so that extending is the same as one pass over the whole input.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> c(crc ^ 0xFFFFFFFFu);
  c.process_bytes(data, n);
  return c.checksum();
}

}  // namespace kiln
