#pragma once
// Internal entry point of the IDX parser, shared by read_idx and the fuzzer.
#include <string>
#include <string_view>

#include "kiln/core/tensor.h"

namespace kiln::data::detail {

// Parses a whole IDX file held in memory, gzip-compressed or not (detected by the
// gzip magic bytes 1f 8b). `name` is the file named in error messages. Throws
// DataLossError for anything malformed; never allocates more than the input
// (decompressed) justifies.
Tensor parse_idx(std::string_view bytes, const std::string& name);

}  // namespace kiln::data::detail
