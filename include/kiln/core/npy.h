#pragma once
// NumPy .npy files (format versions 1.0, 2.0, 3.0), little-endian, C order.
// Spec: docs/formats/npy.md. Readers throw DataLossError on malformed or truncated
// input and InvalidArgumentError on valid files kiln cannot represent (Fortran
// order, big-endian, object arrays); they never crash on any input.
#include <string>
#include <string_view>

#include "kiln/core/tensor.h"

namespace kiln {

Tensor read_npy(const std::string& path);
Tensor parse_npy(std::string_view bytes);
// Writes atomically (temp file, fsync, rename). numpy has no bfloat16, so a bf16
// tensor is refused with InvalidArgumentError;
// convert to f32 first.
void write_npy(const std::string& path, const Tensor& t);
std::string serialize_npy(const Tensor& t);

}  // namespace kiln
