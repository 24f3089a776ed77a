#pragma once
// Internal: decoders with a caller-chosen size cap (fuzz/image_fuzzer.cc keeps it small
// so that headers claiming huge images cost no time).
#include <cstdint>
#include <string_view>

#include "kiln/core/tensor.h"

namespace kiln::data::internal {

// As kiln::data::decode_png / decode_jpeg / decode_image, refusing (ResourceExhaustedError)
// images whose decoded bytes exceed max_bytes; libjpeg's working memory is capped too.
Tensor decode_png(std::string_view bytes, int channels, int64_t max_bytes);
Tensor decode_jpeg(std::string_view bytes, int channels, int64_t max_bytes, bool accurate_dct = false);
Tensor decode_image(std::string_view bytes, int channels, int64_t max_bytes);

}  // namespace kiln::data::internal
