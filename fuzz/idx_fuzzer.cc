// Fuzzes the IDX parser (plain and gzip): any input must parse or throw kiln::Error,
// never crash or allocate more than the input justifies.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "data/idx_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    kiln::Tensor t = kiln::data::detail::parse_idx(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    // A plain (not gzip) input that parsed is exactly header + data.
    if (!(size >= 2 && data[0] == 0x1f && data[1] == 0x8b)) {
      size_t item = data[2] == 0x0B ? 2 : data[2] == 0x0E ? 8 : (data[2] == 0x0C || data[2] == 0x0D) ? 4 : 1;
      if (4 + 4 * static_cast<size_t>(t.rank()) + static_cast<size_t>(t.numel()) * item != size) __builtin_trap();
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
