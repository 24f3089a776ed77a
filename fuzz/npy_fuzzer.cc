// Fuzzes the .npy parser: any input must parse or throw kiln::Error, never crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/core/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    kiln::Tensor t = kiln::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size));
    // A parsed tensor must re-serialise to something that parses to the same thing.
    if (t.dtype() != kiln::DType::kBF16) {
      kiln::Tensor back = kiln::parse_npy(kiln::serialize_npy(t));
      if (!kiln::array_equal(t, back) && t.numel() > 0) {
        bool has_nan = false;
        for (int64_t i = 0; i < t.numel() && !has_nan; ++i) has_nan = t.get_double(i) != t.get_double(i);
        if (!has_nan) __builtin_trap();
      }
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
