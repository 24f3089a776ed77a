// Fuzzes the PNG and JPEG decoders (kiln/data/image.h): any input must decode to a u8
// [H, W, C] image or throw kiln::Error, never crash or leak (libpng/libjpeg errors
// unwind through their error handlers). A decoded image must survive encode_png ->
// decode_png unchanged and resize_bilinear to a small size.
//
// Byte 0 of the input picks the channels (byte % 5: 0 as stored, 1, 2, 3, 4), the rest
// is the image file. Decoded images are capped at 16 MiB (internal::decode_image) so
// that headers claiming huge images cost no time.
// Seeds: fuzz/corpus/image.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "data/image_internal.h"
#include "kiln/core/error.h"
#include "kiln/data/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size == 0) return 0;
  const int channels = bytes[0] % 5;
  const std::string_view data(reinterpret_cast<const char*>(bytes) + 1, size - 1);
  kiln::Tensor img;
  try {
    img = kiln::data::internal::decode_image(data, channels, int64_t{16} << 20);
  } catch (const kiln::Error&) {
    return 0;
  }
  if (img.dtype() != kiln::DType::kU8 || img.rank() != 3 || img.dim(0) < 1 || img.dim(1) < 1) __builtin_trap();
  if (channels != 0 && img.dim(2) != channels) __builtin_trap();
  if (img.dim(2) < 1 || img.dim(2) > 4) __builtin_trap();
  if (img.numel() <= (1 << 16)) {
    if (!kiln::array_equal(kiln::data::decode_png(kiln::data::encode_png(img)), img)) __builtin_trap();
  }
  kiln::Tensor small = kiln::data::resize_bilinear(img, 3, 5);
  const float* p = small.data<float>();
  for (int64_t i = 0; i < small.numel(); ++i)
    if (!(p[i] >= 0.0f && p[i] <= 255.0f)) __builtin_trap();
  return 0;
}
