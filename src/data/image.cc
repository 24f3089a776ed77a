// PNG (libpng) and JPEG (libjpeg-turbo) decoding, PNG encoding, bilinear resize, and
// image_files_dataset.
//
// Both libraries report fatal errors by calling an error handler that must not
// return; ours longjmp back to the setjmp in the one function that drives the library
// (png_decode_into, jpeg_decode_into, png_encode_into). Those functions keep every
// C++ object with a destructor in a context struct owned by their caller, so the
// longjmp skips no destructor; the library structures are destroyed on that path.
#include "kiln/data/image.h"

#include <png.h>
#include <setjmp.h>
#include <stdio.h>  // jpeglib.h needs FILE

#include <jpeglib.h>
// (after jpeglib.h)
#include <jerror.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>

#include "dataset_internal.h"  // rethrow_with_context
#include "image_internal.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"

namespace kiln::data {
namespace {

// What a failed library call leaves for the C++ side to throw.
struct ErrorSink {
  char message[JMSG_LENGTH_MAX + 128] = {0};
  ErrorCode code = ErrorCode::kDataLoss;
  void set(ErrorCode c, const char* msg) {
    if (message[0] != 0) return;  // keep the first cause
    code = c;
    std::snprintf(message, sizeof message, "%s", msg);
  }
};

[[noreturn]] void throw_error(const char* what, const ErrorSink& sink) {
  std::string msg = std::string(what) + ": " + (sink.message[0] ? sink.message : "unknown error");
  switch (sink.code) {
    case ErrorCode::kResourceExhausted: throw ResourceExhaustedError(msg);
    case ErrorCode::kInvalidArgument: throw InvalidArgumentError(msg);
    case ErrorCode::kUnimplemented: throw UnimplementedError(msg);
    default: throw DataLossError(msg);
  }
}

// Allocates a u8 [h, w, c] tensor without letting an exception escape into C frames.
bool alloc_u8(Tensor* out, int64_t h, int64_t w, int64_t c, ErrorSink* sink) noexcept {
  try {
    *out = Tensor::empty(Shape{h, w, c}, DType::kU8);
    return true;
  } catch (const std::exception& e) {
    sink->set(ErrorCode::kResourceExhausted, e.what());
    return false;
  }
}

bool too_big(int64_t h, int64_t w, int64_t c, int64_t max_bytes, ErrorSink* sink) {
  // h, w < 2^31 and c <= 4: no overflow in int64.
  if (h * w * c <= max_bytes) return false;
  char buf[160];
  std::snprintf(buf, sizeof buf, "a %lld x %lld x %lld image (%lld bytes) exceeds the limit of %lld bytes",
                static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(c),
                static_cast<long long>(h * w * c), static_cast<long long>(max_bytes));
  sink->set(ErrorCode::kResourceExhausted, buf);
  return true;
}

// ---------------------------------------------------------------- PNG

struct PngReadCtx {
  ErrorSink sink;  // first: libpng's error pointer is this struct
  std::string_view data;
  size_t pos = 0;
  int channels = 0;
  int64_t max_bytes = 0;
  Tensor out;
  std::vector<png_bytep> rows;
};

void png_on_error(png_structp png, png_const_charp msg) {
  static_cast<ErrorSink*>(png_get_error_ptr(png))->set(ErrorCode::kDataLoss, msg);
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep dst, png_size_t n) {
  auto* c = static_cast<PngReadCtx*>(png_get_io_ptr(png));
  if (n > c->data.size() - c->pos) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "truncated: %zu more bytes needed at offset %zu of %zu", static_cast<size_t>(n),
                  c->pos, c->data.size());
    c->sink.set(ErrorCode::kDataLoss, buf);
    png_error(png, buf);
  }
  std::memcpy(dst, c->data.data() + c->pos, n);
  c->pos += n;
}

// Decodes c->data into c->out; false with c->sink set on failure.
bool png_decode_into(PngReadCtx* c) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c->sink, png_on_error, png_on_warning);
  if (png == nullptr) {
    c->sink.set(ErrorCode::kResourceExhausted, "cannot create a libpng reader");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    c->sink.set(ErrorCode::kResourceExhausted, "cannot create a libpng info struct");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, c, png_read_bytes);
  png_read_info(png, info);
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
  png_get_IHDR(png, info, &width, &height, &bit_depth, &color_type, &interlace, nullptr, nullptr);
  const bool has_trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
  int ch = c->channels;
  if (ch == 0) ch = color_type == PNG_COLOR_TYPE_PALETTE ? (has_trns ? 4 : 3) : png_get_channels(png, info);

  // Bytes of filtered, uncompressed image data; deflate cannot expand more than
  // ~1032:1, so data much larger than the file could hold means a truncated file (or a
  // header lie) and is refused before allocating for it.
  const int stored_bits = bit_depth * png_get_channels(png, info);
  const uint64_t raw_bytes = uint64_t{height} * (1 + (uint64_t{width} * stored_bits + 7) / 8);
  if (raw_bytes > 1032 * uint64_t{c->data.size()} + 1024) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "truncated: a %u x %u image needs %llu bytes of image data, more than %zu bytes "
                  "can hold", width, height, static_cast<unsigned long long>(raw_bytes), c->data.size());
    c->sink.set(ErrorCode::kDataLoss, buf);
    png_error(png, buf);
  }
  if (too_big(height, width, ch, c->max_bytes, &c->sink)) png_error(png, "too big");

  // The transformations of TensorFlow's png_io.cc (same order of calls).
  const bool has_alpha = (color_type & PNG_COLOR_MASK_ALPHA) != 0;
  if ((ch & 1) == 0) {  // alpha wanted
    if (!has_alpha) {
      if (has_trns) {
        png_set_tRNS_to_alpha(png);
      } else {
        png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
      }
    }
  } else if (has_alpha || has_trns) {
    png_set_strip_alpha(png);
  }
  if (bit_depth > 8) png_set_strip_16(png);
  png_set_packing(png);
  png_set_interlace_handling(png);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  const bool is_gray = (color_type & PNG_COLOR_MASK_COLOR) == 0;
  if (is_gray && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (ch < 3) {
    if (!is_gray) png_set_rgb_to_gray(png, 1, 0.299, 0.587);
  } else if (is_gray) {
    png_set_gray_to_rgb(png);
  }
  png_read_update_info(png, info);
  if (png_get_channels(png, info) != ch || png_get_bit_depth(png, info) != 8 ||
      png_get_rowbytes(png, info) != size_t{width} * ch) {
    c->sink.set(ErrorCode::kInternal, "libpng's output layout differs from the one asked for");
    png_error(png, "layout");
  }
  if (!alloc_u8(&c->out, height, width, ch, &c->sink)) png_error(png, "allocation");
  try {
    c->rows.resize(height);
  } catch (...) {
    c->sink.set(ErrorCode::kResourceExhausted, "cannot allocate row pointers");
    png_error(png, "allocation");
  }
  auto* base = static_cast<png_bytep>(c->out.raw_data());
  for (png_uint_32 y = 0; y < height; ++y) c->rows[y] = base + size_t{y} * width * ch;
  png_read_image(png, c->rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

struct PngWriteCtx {
  ErrorSink sink;
  std::string out;
};

void png_write_bytes(png_structp png, png_bytep data, png_size_t n) {
  auto* c = static_cast<PngWriteCtx*>(png_get_io_ptr(png));
  try {
    c->out.append(reinterpret_cast<const char*>(data), n);
  } catch (...) {
    c->sink.set(ErrorCode::kResourceExhausted, "out of memory");
    png_error(png, "out of memory");
  }
}
void png_flush(png_structp) {}

bool png_encode_into(PngWriteCtx* c, const uint8_t* pixels, png_uint_32 width, png_uint_32 height, int ch) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &c->sink, png_on_error, png_on_warning);
  if (png == nullptr) {
    c->sink.set(ErrorCode::kResourceExhausted, "cannot create a libpng writer");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    c->sink.set(ErrorCode::kResourceExhausted, "cannot create a libpng info struct");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  static constexpr int kColorType[] = {PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                       PNG_COLOR_TYPE_RGB_ALPHA};
  png_set_write_fn(png, c, png_write_bytes, png_flush);
  png_set_IHDR(png, info, width, height, 8, kColorType[ch - 1], PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (png_uint_32 y = 0; y < height; ++y) png_write_row(png, pixels + size_t{y} * width * ch);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

// ---------------------------------------------------------------- JPEG

struct JpegError {
  jpeg_error_mgr pub;  // first: libjpeg's cinfo->err points here
  jmp_buf jump;
  ErrorSink* sink;
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  char msg[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, msg);
  ErrorCode code = ErrorCode::kDataLoss;
  if (cinfo->err->msg_code == JERR_NO_BACKING_STORE || cinfo->err->msg_code == JERR_OUT_OF_MEMORY)
    code = ErrorCode::kResourceExhausted;
  if (cinfo->err->msg_code == JERR_CONVERSION_NOTIMPL) code = ErrorCode::kUnimplemented;
  e->sink->set(code, msg);
  longjmp(e->jump, 1);
}
// Warnings (corrupt-but-decodable data, as TF tolerates) are counted, not printed.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0) ++cinfo->err->num_warnings;
}

// The whole input as one buffer. Asked for more, it notes that the data ended early
// and feeds an end-of-image marker so that libjpeg stops cleanly.
struct JpegSource {
  jpeg_source_mgr pub;  // first
  bool hit_end = false;
  int refills = 0;
};

void jpeg_src_init(j_decompress_ptr) {}
boolean jpeg_src_fill(j_decompress_ptr cinfo) {
  static const JOCTET kEoi[2] = {0xFF, JPEG_EOI};
  auto* s = reinterpret_cast<JpegSource*>(cinfo->src);
  s->hit_end = true;
  if (++s->refills > 64) ERREXIT(cinfo, JERR_INPUT_EOF);
  s->pub.next_input_byte = kEoi;
  s->pub.bytes_in_buffer = 2;
  return TRUE;
}
void jpeg_src_skip(j_decompress_ptr cinfo, long n) {
  auto* s = reinterpret_cast<JpegSource*>(cinfo->src);
  if (n <= 0) return;
  while (n > static_cast<long>(s->pub.bytes_in_buffer)) {
    n -= static_cast<long>(s->pub.bytes_in_buffer);
    jpeg_src_fill(cinfo);
  }
  s->pub.next_input_byte += n;
  s->pub.bytes_in_buffer -= static_cast<size_t>(n);
}
void jpeg_src_term(j_decompress_ptr) {}

struct JpegCtx {
  ErrorSink sink;
  std::string_view data;
  int channels = 0;
  int64_t max_bytes = 0;
  bool accurate_dct = false;
  Tensor out;
  std::vector<JSAMPLE> cmyk_row;
};

const char* kTruncatedJpeg = "truncated: the data ends before the JPEG end-of-image marker";

bool jpeg_decode_into(JpegCtx* c) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  JpegError err;
  JpegSource src;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_on_error;
  err.pub.emit_message = jpeg_on_message;
  err.sink = &c->sink;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  // Progressive images buffer every coefficient (2 bytes per sample); cap libjpeg's
  // working memory near what the output may take.
  cinfo.mem->max_memory_to_use = static_cast<long>(std::min<int64_t>(2 * c->max_bytes + (64 << 20), LONG_MAX / 2));
  src.pub.init_source = jpeg_src_init;
  src.pub.fill_input_buffer = jpeg_src_fill;
  src.pub.skip_input_data = jpeg_src_skip;
  src.pub.resync_to_restart = jpeg_resync_to_restart;
  src.pub.term_source = jpeg_src_term;
  src.pub.next_input_byte = reinterpret_cast<const JOCTET*>(c->data.data());
  src.pub.bytes_in_buffer = c->data.size();
  cinfo.src = &src.pub;

  jpeg_read_header(&cinfo, TRUE);
  const int ch = c->channels != 0 ? c->channels : (cinfo.num_components == 1 ? 1 : 3);
  const bool cmyk = ch == 3 && (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK);
  cinfo.out_color_space = ch == 1 ? JCS_GRAYSCALE : cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.dct_method = c->accurate_dct ? JDCT_ISLOW : JDCT_IFAST;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_calc_output_dimensions(&cinfo);
  if (cinfo.output_width == 0 || cinfo.output_height == 0) ERREXIT(&cinfo, JERR_EMPTY_IMAGE);
  if (too_big(cinfo.output_height, cinfo.output_width, ch, c->max_bytes, &c->sink)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_start_decompress(&cinfo);  // (reads every scan of a progressive image)
  if (src.hit_end || cinfo.output_components != (cmyk ? 4 : ch)) {
    c->sink.set(ErrorCode::kDataLoss, src.hit_end ? kTruncatedJpeg : "unexpected libjpeg output layout");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  if (!alloc_u8(&c->out, cinfo.output_height, cinfo.output_width, ch, &c->sink)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  if (cmyk) {
    try {
      c->cmyk_row.resize(size_t{cinfo.output_width} * 4);
    } catch (...) {
      c->sink.set(ErrorCode::kResourceExhausted, "out of memory");
      jpeg_destroy_decompress(&cinfo);
      return false;
    }
  }
  auto* base = static_cast<JSAMPLE*>(c->out.raw_data());
  const size_t stride = size_t{cinfo.output_width} * ch;
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPLE* out_row = base + size_t{cinfo.output_scanline} * stride;
    JSAMPROW row = cmyk ? c->cmyk_row.data() : out_row;
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1 || src.hit_end) {
      c->sink.set(ErrorCode::kDataLoss, kTruncatedJpeg);
      jpeg_destroy_decompress(&cinfo);
      return false;
    }
    if (cmyk) {  // as TensorFlow's jpeg_mem.cc
      for (JDIMENSION x = 0; x < cinfo.output_width; ++x) {
        const int cc = row[4 * x], m = row[4 * x + 1], y = row[4 * x + 2], k = row[4 * x + 3];
        if (cinfo.saw_Adobe_marker) {
          out_row[3 * x] = static_cast<JSAMPLE>(k * cc / 255);
          out_row[3 * x + 1] = static_cast<JSAMPLE>(k * m / 255);
          out_row[3 * x + 2] = static_cast<JSAMPLE>(k * y / 255);
        } else {
          out_row[3 * x] = static_cast<JSAMPLE>((255 - k) * (255 - cc) / 255);
          out_row[3 * x + 1] = static_cast<JSAMPLE>((255 - k) * (255 - m) / 255);
          out_row[3 * x + 2] = static_cast<JSAMPLE>((255 - k) * (255 - y) / 255);
        }
      }
    }
  }
  jpeg_finish_decompress(&cinfo);  // reads up to the end-of-image marker
  const bool truncated = src.hit_end;
  jpeg_destroy_decompress(&cinfo);
  if (truncated) {
    c->sink.set(ErrorCode::kDataLoss, kTruncatedJpeg);
    return false;
  }
  return true;
}

// Appends an opaque alpha channel: [h, w, c] -> [h, w, c + 1].
Tensor add_alpha(const Tensor& t) {
  const int64_t h = t.dim(0), w = t.dim(1), c = t.dim(2);
  Tensor out = Tensor::empty(Shape{h, w, c + 1}, DType::kU8);
  const uint8_t* s = t.data<uint8_t>();
  uint8_t* d = out.data<uint8_t>();
  for (int64_t i = 0; i < h * w; ++i) {
    for (int64_t k = 0; k < c; ++k) d[i * (c + 1) + k] = s[i * c + k];
    d[i * (c + 1) + c] = 255;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- public API

namespace internal {

Tensor decode_png(std::string_view bytes, int channels, int64_t max_bytes) {
  KILN_CHECK_ARG(channels >= 0 && channels <= 4, "decode_png: channels must be 0 (as stored), 1, 2, 3 or 4, got ",
                 channels);
  PngReadCtx c;
  c.data = bytes;
  c.channels = channels;
  c.max_bytes = max_bytes;
  if (!png_decode_into(&c)) throw_error("PNG", c.sink);
  return std::move(c.out);
}

Tensor decode_jpeg(std::string_view bytes, int channels, int64_t max_bytes, bool accurate_dct) {
  KILN_CHECK_ARG(channels == 0 || channels == 1 || channels == 3,
                 "decode_jpeg: channels must be 0 (as stored), 1 or 3, got ", channels);
  if (bytes.empty()) throw DataLossError("JPEG: empty input");
  JpegCtx c;
  c.data = bytes;
  c.channels = channels;
  c.max_bytes = max_bytes;
  c.accurate_dct = accurate_dct;
  if (!jpeg_decode_into(&c)) throw_error("JPEG", c.sink);
  return std::move(c.out);
}

Tensor decode_image(std::string_view bytes, int channels, int64_t max_bytes) {
  KILN_CHECK_ARG(channels >= 0 && channels <= 4, "decode_image: channels must be 0 (as stored), 1, 2, 3 or 4, got ",
                 channels);
  std::string_view format = sniff_image_format(bytes);
  if (format == "png") return decode_png(bytes, channels, max_bytes);
  if (format == "jpeg") {
    if (channels == 2 || channels == 4) return add_alpha(decode_jpeg(bytes, channels - 1, max_bytes));
    return decode_jpeg(bytes, channels, max_bytes);
  }
  std::string head;
  for (size_t i = 0; i < bytes.size() && i < 4; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(bytes[i]));
    head += (i ? " " : "") + std::string(buf);
  }
  throw InvalidArgumentError("decode_image: not a PNG or JPEG image (starts with " +
                             (head.empty() ? std::string("nothing: empty input") : head) + ")");
}

}  // namespace internal

std::string_view sniff_image_format(std::string_view b) {
  if (b.size() >= 8 && b.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8)) return "png";
  if (b.size() >= 3 && b.substr(0, 3) == "\xFF\xD8\xFF") return "jpeg";
  return "";
}

Tensor decode_png(std::string_view bytes, int channels) {
  return internal::decode_png(bytes, channels, kMaxDecodedImageBytes);
}
Tensor decode_jpeg(std::string_view bytes, int channels, bool accurate_dct) {
  return internal::decode_jpeg(bytes, channels, kMaxDecodedImageBytes, accurate_dct);
}
Tensor decode_image(std::string_view bytes, int channels) {
  return internal::decode_image(bytes, channels, kMaxDecodedImageBytes);
}

std::string encode_png(const Tensor& image) {
  KILN_CHECK_ARG(image.defined() && image.dtype() == DType::kU8 && image.rank() == 3,
                 "encode_png: needs a u8 [height, width, channels] image, got ",
                 image.defined() ? image.desc() : std::string("an undefined tensor"));
  KILN_CHECK_ARG(image.device().type == DeviceType::kCPU, "encode_png: the image must be on the CPU, got ",
                 image.desc());
  const int64_t h = image.dim(0), w = image.dim(1), c = image.dim(2);
  KILN_CHECK_ARG(c >= 1 && c <= 4, "encode_png: channels must be 1..4, got ", image.desc());
  KILN_CHECK_ARG(h >= 1 && w >= 1 && h <= 0x7fffffff && w <= 0x7fffffff, "encode_png: bad image size ", image.desc());
  PngWriteCtx ctx;
  if (!png_encode_into(&ctx, image.data<uint8_t>(), static_cast<png_uint_32>(w), static_cast<png_uint_32>(h),
                       static_cast<int>(c)))
    throw_error("encode_png", ctx.sink);
  return std::move(ctx.out);
}

// ---------------------------------------------------------------- resize

namespace {

struct Interp {
  int64_t lower, upper;
  float lerp;
};

// TensorFlow's compute_interpolation_weights with HalfPixelScaler.
std::vector<Interp> interp_weights(int64_t out_size, int64_t in_size) {
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  std::vector<Interp> v(static_cast<size_t>(out_size));
  for (int64_t i = 0; i < out_size; ++i) {
    const float in = (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    const float in_f = std::floor(in);
    v[i].lower = std::max(static_cast<int64_t>(in_f), int64_t{0});
    v[i].upper = std::min(static_cast<int64_t>(std::ceil(in)), in_size - 1);
    v[i].lerp = in - in_f;
  }
  return v;
}

template <typename T>
void resize_one(const T* in, int64_t iw, int64_t c, float* out, const std::vector<Interp>& ys,
                const std::vector<Interp>& xs) {
  for (size_t y = 0; y < ys.size(); ++y) {
    const T* top = in + ys[y].lower * iw * c;
    const T* bottom = in + ys[y].upper * iw * c;
    const float yl = ys[y].lerp;
    for (size_t x = 0; x < xs.size(); ++x) {
      const int64_t l = xs[x].lower * c, r = xs[x].upper * c;
      const float xl = xs[x].lerp;
      for (int64_t k = 0; k < c; ++k) {
        const float tl = static_cast<float>(top[l + k]), tr = static_cast<float>(top[r + k]);
        const float bl = static_cast<float>(bottom[l + k]), br = static_cast<float>(bottom[r + k]);
        const float t = tl + (tr - tl) * xl;
        const float b = bl + (br - bl) * xl;
        *out++ = t + (b - t) * yl;
      }
    }
  }
}

}  // namespace

Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width) {
  KILN_CHECK_ARG(image.defined() && (image.rank() == 3 || image.rank() == 4) &&
                     (image.dtype() == DType::kU8 || image.dtype() == DType::kF32),
                 "resize_bilinear: needs a u8 or f32 image [H, W, C] or batch [N, H, W, C], got ",
                 image.defined() ? image.desc() : std::string("an undefined tensor"));
  KILN_CHECK_ARG(image.device().type == DeviceType::kCPU, "resize_bilinear: the image must be on the CPU, got ",
                 image.desc());
  KILN_CHECK_ARG(height > 0 && width > 0, "resize_bilinear: the size must be positive, got [", height, ", ", width,
                 "]");
  const bool batched = image.rank() == 4;
  const int64_t n = batched ? image.dim(0) : 1;
  const int64_t ih = image.dim(batched ? 1 : 0), iw = image.dim(batched ? 2 : 1), c = image.dim(batched ? 3 : 2);
  KILN_CHECK_ARG(ih > 0 && iw > 0, "resize_bilinear: the image is empty: ", image.desc());
  Tensor out = Tensor::empty(batched ? Shape{n, height, width, c} : Shape{height, width, c}, DType::kF32);
  auto ys = interp_weights(height, ih), xs = interp_weights(width, iw);
  float* o = out.data<float>();
  for (int64_t b = 0; b < n; ++b) {
    if (image.dtype() == DType::kU8) {
      resize_one(image.data<uint8_t>() + b * ih * iw * c, iw, c, o + b * height * width * c, ys, xs);
    } else {
      resize_one(image.data<float>() + b * ih * iw * c, iw, c, o + b * height * width * c, ys, xs);
    }
  }
  return out;
}

// ---------------------------------------------------------------- dataset

namespace {

std::string parent_name(const std::string& file) {
  return std::filesystem::path(file).parent_path().filename().string();
}

}  // namespace

std::vector<std::string> image_class_names(const std::vector<std::string>& patterns) {
  std::vector<std::string> names;
  for (const Element& e : Dataset::list_files(patterns).iterator()) names.push_back(parent_name(e[0].strings().item()));
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

Dataset image_files_dataset(std::vector<std::string> patterns, ImageOptions options) {
  KILN_CHECK_ARG(options.channels >= 0 && options.channels <= 4,
                 "image_files_dataset: channels must be 0 (as stored), 1, 2, 3 or 4, got ", options.channels);
  KILN_CHECK_ARG((options.height == 0 && options.width == 0) || (options.height > 0 && options.width > 0),
                 "image_files_dataset: height and width must both be 0 (no resize) or both positive, got ",
                 options.height, " x ", options.width);
  Dataset files = Dataset::list_files(patterns, options.shuffle, options.seed);
  auto labels = std::make_shared<std::map<std::string, int64_t>>();
  if (options.label_from_dir) {
    auto names = image_class_names(patterns);
    for (size_t i = 0; i < names.size(); ++i) (*labels)[names[i]] = static_cast<int64_t>(i);
  }
  const bool resize = options.height > 0;
  ElementSpec spec;
  spec.names = {"image"};
  spec.components = {TypeSpec::tensor(DType::kF32, {resize ? options.height : -1, resize ? options.width : -1,
                                                    options.channels ? options.channels : -1})};
  if (options.label_from_dir) {
    spec.names.push_back("label");
    spec.components.push_back(TypeSpec::tensor(DType::kI64));
  }
  auto names = std::make_shared<Element>(spec.names, std::vector<Value>(spec.names.size()));
  auto fn = [options, labels, names, resize](const Element& e) -> Element {
    const std::string& path = e[0].strings().item();
    try {
      Tensor img = decode_image(read_file(path), options.channels);
      Tensor f = resize ? resize_bilinear(img, options.height, options.width) : img.to(DType::kF32);
      float* p = f.data<float>();
      for (int64_t i = 0, n = f.numel(); i < n; ++i) p[i] /= 255.0f;
      std::vector<Value> values{Value(std::move(f))};
      if (options.label_from_dir) values.emplace_back(Tensor::scalar<int64_t>(labels->at(parent_name(path))));
      return Element::with_names_of(*names, std::move(values));
    } catch (...) {
      rethrow_with_context("image file '" + path + "'");
    }
  };
  return files.map(std::move(fn), {.num_parallel_calls = kAutotune, .deterministic = true, .output_spec = spec});
}

}  // namespace kiln::data
