#pragma once
// Image decoding (PNG with libpng, JPEG with libjpeg-turbo), bilinear resizing, and a
// dataset of image files labelled by directory (keras' image_dataset_from_directory).
//
// Decoders follow TensorFlow's tf.io.decode_png / decode_jpeg (TF links the same
// libraries), so decoded pixels match TF's for the same bytes:
//   PNG: palette and low-bit-depth gray expand to 8 bits; 16-bit samples keep their
//        high byte (png_set_strip_16); to gray: libpng's rgb_to_gray with weights
//        0.299/0.587(/0.114); gray to RGB replicates; alpha is kept, dropped, taken
//        from tRNS or added as 255 as the channel count asks. No gamma correction.
//   JPEG: TF's defaults: the fast integer IDCT (dct_method "INTEGER_FAST"; the
//        accurate one on request), fancy upsampling; CMYK/YCCK converts to RGB like
//        TF (Adobe-inverted when the Adobe marker says so).
// Results are u8 [height, width, channels] on the CPU.
//
// Errors: DataLossError for corrupt or truncated data (the library's message says
// what), InvalidArgumentError for bytes that are no PNG/JPEG at all and for bad
// arguments, ResourceExhaustedError when the header asks for more than
// kMaxDecodedImageBytes. Never a crash, never a leak (libpng/libjpeg errors are caught
// in their own error handlers and unwound with their structures destroyed).
// Thread-safe: every call uses its own decoder state.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/data/dataset.h"

namespace kiln::data {

// Larger decoded images are refused before any pixel memory is allocated.
inline constexpr int64_t kMaxDecodedImageBytes = int64_t{1} << 31;

// channels: 0 as stored (gray 1, gray+alpha 2, RGB 3, RGBA 4; palette 3, or 4 with a
// tRNS chunk), 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA.
Tensor decode_png(std::string_view bytes, int channels = 0);
// channels: 0 as stored (1 for gray, else 3), 1 gray, 3 RGB. accurate_dct: libjpeg's
// JDCT_ISLOW (TF's dct_method="INTEGER_ACCURATE") instead of JDCT_IFAST.
Tensor decode_jpeg(std::string_view bytes, int channels = 0, bool accurate_dct = false);
// PNG or JPEG by their magic bytes (89 'PNG' / ff d8 ff); other bytes are an
// InvalidArgumentError. channels as above (4 with a JPEG: RGB plus alpha 255).
Tensor decode_image(std::string_view bytes, int channels = 0);
// "png", "jpeg", or "" for bytes that are neither.
std::string_view sniff_image_format(std::string_view bytes);

// An 8-bit PNG of a u8 [H, W, C] image, C in 1..4 (zlib's default level, no
// interlace). H and W must be >= 1.
std::string encode_png(const Tensor& image);

// Bilinear resize of [H, W, C] (or a batch [N, H, W, C]) u8 or f32 images to
// [height, width]: tf.image.resize(method="bilinear", antialias=False) of TF2, i.e.
// half-pixel centers without align_corners, computed in f32 as TF's kernel does.
// Returns f32.
Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width);

struct ImageOptions {
  int channels = 3;     // as decode_image; 0: as stored (shapes may then differ)
  int64_t height = 0;   // both 0: no resize (shapes may differ); both > 0: resize_bilinear
  int64_t width = 0;
  // Add "label": the index of the file's parent directory name among all those of the
  // listed files, sorted (class_a/x.png -> 0, class_b/y.jpg -> 1).
  bool label_from_dir = true;
  // File order: sorted, or shuffled per pass (Dataset::list_files).
  bool shuffle = false;
  uint64_t seed = 0;
};

// Elements {"image": f32 [h, w, c] in [0, 1], "label": i64 []} from the image files
// matching the glob patterns (NotFoundError when a pattern matches nothing). Files are
// read, decoded, resized (then divided by 255) in a parallel map (kAutotune). Errors
// from a pass name the file. Cardinality: the number of files.
Dataset image_files_dataset(std::vector<std::string> patterns, ImageOptions options = {});
// The label names of image_files_dataset(patterns): sorted parent directory names.
std::vector<std::string> image_class_names(const std::vector<std::string>& patterns);

}  // namespace kiln::data
