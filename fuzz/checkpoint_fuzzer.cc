// Fuzzes the checkpoint loader (docs/formats/checkpoint.md): any input must load or
// throw DataLossError, never crash or allocate far beyond the input's size; what
// loads must save and load back bit-identically.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/tensor_file_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kiln::TensorFile;
  TensorFile d;
  try {
    d = kiln::internal::parse_tensor_file(std::string_view(reinterpret_cast<const char*>(data), size), "<fuzz>");
  } catch (const kiln::DataLossError&) {
    return 0;
  }  // any other exception escapes and is reported as a crash
  TensorFile back = kiln::internal::parse_tensor_file(kiln::internal::serialize_tensor_file(d), "<fuzz re-save>");
  if (back.tensors.size() != d.tensors.size() || back.metadata != d.metadata) __builtin_trap();
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    const kiln::Tensor& a = d.tensors[i].second;
    const kiln::Tensor& b = back.tensors[i].second;
    if (d.tensors[i].first != back.tensors[i].first || a.dtype() != b.dtype() || a.shape() != b.shape() ||
        std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0)
      __builtin_trap();
  }
  return 0;
}
