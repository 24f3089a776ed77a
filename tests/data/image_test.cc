#include "kiln/data/image.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/image_internal.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using kiln::testing::fixture;
using kiln::testing::load;
using kiln::testing::TempDir;
using kiln::testing::write_bytes;

std::string image_bytes(const std::string& name) { return read_file(fixture("image/" + name)); }

// Every expected array of scripts/make_image_fixtures.py: tf.io.decode_png/decode_jpeg.
struct DecodeCase {
  const char* file;
  std::vector<int> channels;
};
const DecodeCase kPngs[] = {{"rgb.png", {0, 1, 3, 4}},          {"gray.png", {0, 1, 3, 4}}, {"rgba.png", {0, 1, 3, 4}},
                            {"palette_trns.png", {0, 1, 3, 4}}, {"gray16.png", {0, 3}},     {"gray1.png", {0, 3}}};
const DecodeCase kJpegs[] = {{"rgb.jpg", {0, 1, 3}}, {"gray.jpg", {0, 3}}, {"progressive.jpg", {0, 3}}, {"cmyk.jpg", {0, 3}}};

TEST(Image, DecodePngMatchesTensorFlow) {
  for (const auto& c : kPngs) {
    for (int ch : c.channels) {
      SCOPED_TRACE(std::string(c.file) + " channels " + std::to_string(ch));
      Tensor want = load("image/" + std::string(c.file) + ".c" + std::to_string(ch) + ".npy");
      Tensor got = decode_png(image_bytes(c.file), ch);
      EXPECT_TRUE(array_equal(got, want)) << describe_mismatch(got, want, 0, 0);
      EXPECT_TRUE(array_equal(decode_image(image_bytes(c.file), ch), want));
    }
  }
  // As stored: gray 1, RGBA 4, a palette with tRNS 4.
  EXPECT_EQ(decode_png(image_bytes("gray.png")).shape(), (Shape{5, 4, 1}));
  EXPECT_EQ(decode_png(image_bytes("rgba.png")).shape(), (Shape{6, 7, 4}));
  EXPECT_EQ(decode_png(image_bytes("palette_trns.png")).shape(), (Shape{5, 6, 4}));
}

TEST(Image, DecodeJpegMatchesTensorFlow) {
  for (const auto& c : kJpegs) {
    for (int ch : c.channels) {
      SCOPED_TRACE(std::string(c.file) + " channels " + std::to_string(ch));
      Tensor want = load("image/" + std::string(c.file) + ".c" + std::to_string(ch) + ".npy");
      Tensor got = decode_jpeg(image_bytes(c.file), ch);
      ASSERT_EQ(got.shape(), want.shape());
      ASSERT_EQ(got.dtype(), DType::kU8);
      // Same library (libjpeg-turbo's SIMD paths are bit-exact with its C code): exact.
      EXPECT_TRUE(allclose(got, want, 0, 0)) << describe_mismatch(got, want, 0, 0);
      EXPECT_TRUE(array_equal(decode_image(image_bytes(c.file), ch), got));
    }
  }
  for (const char* name : {"rgb.jpg", "progressive.jpg"}) {
    Tensor want = load("image/" + std::string(name) + ".c3.accurate.npy");
    Tensor got = decode_jpeg(image_bytes(name), 3, /*accurate_dct=*/true);
    EXPECT_TRUE(array_equal(got, want)) << name << ": " << describe_mismatch(got, want, 0, 0);
    EXPECT_FALSE(array_equal(got, decode_jpeg(image_bytes(name), 3))) << "the two IDCTs differ on " << name;
  }
  // decode_image adds an opaque alpha channel to a JPEG when asked for 2 or 4.
  Tensor rgba = decode_image(image_bytes("rgb.jpg"), 4);
  Tensor rgb = decode_jpeg(image_bytes("rgb.jpg"), 3);
  ASSERT_EQ(rgba.shape(), (Shape{9, 13, 4}));
  for (int64_t i = 0; i < 9 * 13; ++i) {
    EXPECT_EQ(rgba.data<uint8_t>()[4 * i + 3], 255);
    EXPECT_EQ(rgba.data<uint8_t>()[4 * i + 1], rgb.data<uint8_t>()[3 * i + 1]);
  }
}

TEST(Image, ResizeMatchesTensorFlow) {
  struct Case {
    const char* npy;
    const char* file;
    int channels;
    int64_t h, w;
    bool as_float;
  };
  const Case cases[] = {{"rgb_png_4x11", "rgb.png", 3, 4, 11, false},
                        {"rgb_png_9x3", "rgb.png", 3, 9, 3, false},
                        {"rgb_jpg_20x5", "rgb.jpg", 3, 20, 5, false},
                        {"rgba_png_f32_3x10", "rgba.png", 4, 3, 10, true},
                        {"gray_png_same", "gray.png", 1, 5, 4, false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.npy);
    Tensor img = decode_image(image_bytes(c.file), c.channels);
    if (c.as_float) {
      img = img.to(DType::kF32);
      for (int64_t i = 0; i < img.numel(); ++i) img.data<float>()[i] /= 255.0f;
    }
    Tensor want = load(std::string("image/resize_") + c.npy + ".npy");
    Tensor got = resize_bilinear(img, c.h, c.w);
    ASSERT_EQ(got.dtype(), DType::kF32);
    const double atol = 1e-4;  // f32 rounding (FMA contraction may differ from TF's build)
    EXPECT_TRUE(allclose(got, want, 1e-6, atol)) << describe_mismatch(got, want, 1e-6, atol);
  }
}

TEST(Image, ResizeByHand) {
  // [0, 10] -> 4 wide with half-pixel centers: sample points -0.25, 0.25, 0.75, 1.25,
  // clamped at the edges.
  Tensor row = Tensor::from_vector<float>({0, 10}, Shape{1, 2, 1});
  EXPECT_EQ(resize_bilinear(row, 1, 4).to_vector<float>(), (std::vector<float>{0, 2.5f, 7.5f, 10}));
  // 2x2 -> 1x1 is the mean of the four (sample point 0.5, 0.5).
  Tensor sq = Tensor::from_vector<uint8_t>({0, 10, 20, 50}, Shape{2, 2, 1});
  EXPECT_EQ(resize_bilinear(sq, 1, 1).to_vector<float>(), (std::vector<float>{20}));
  // A batch resizes each image.
  Tensor batch = Tensor::from_vector<float>({0, 10, 100, 110}, Shape{2, 1, 2, 1});
  EXPECT_EQ(resize_bilinear(batch, 1, 1).to_vector<float>(), (std::vector<float>{5, 105}));
  EXPECT_KILN_ERROR(resize_bilinear(row, 0, 3), kInvalidArgument, "positive");
  EXPECT_KILN_ERROR(resize_bilinear(Tensor::zeros(Shape{2, 2}), 1, 1), kInvalidArgument, "[H, W, C]");
  EXPECT_KILN_ERROR(resize_bilinear(Tensor::zeros(Shape{0, 2, 1}), 1, 1), kInvalidArgument, "empty");
}

TEST(Image, EncodePngRoundTrips) {
  for (int64_t c = 1; c <= 4; ++c) {
    Tensor img = kiln::testing::rand_tensor(Shape{5, 7, c}, DType::kF32, 0, 255.99, 7 + c).to(DType::kU8);
    std::string png = encode_png(img);
    EXPECT_EQ(sniff_image_format(png), "png");
    EXPECT_TRUE(array_equal(decode_png(png), img)) << "channels " << c;
  }
  EXPECT_KILN_ERROR(encode_png(Tensor::zeros(Shape{2, 2, 3})), kInvalidArgument, "u8");
  EXPECT_KILN_ERROR(encode_png(Tensor::zeros(Shape{2, 2, 5}, DType::kU8)), kInvalidArgument, "channels");
  EXPECT_KILN_ERROR(encode_png(Tensor::zeros(Shape{0, 2, 3}, DType::kU8)), kInvalidArgument, "size");
}

TEST(Image, EveryTruncationIsDataLoss) {
  for (const char* name : {"rgb.png", "palette_trns.png", "rgb.jpg", "progressive.jpg", "gray.jpg"}) {
    const std::string full = image_bytes(name);
    const bool png = std::string(name).ends_with(".png");
    for (size_t n = 0; n < full.size(); ++n) {
      std::string_view cut(full.data(), n);
      SCOPED_TRACE(std::string(name) + " cut to " + std::to_string(n) + " bytes");
      if (png) {
        EXPECT_KILN_ERROR(decode_png(cut), kDataLoss, "PNG: ");
      } else {
        EXPECT_KILN_ERROR(decode_jpeg(cut), kDataLoss, "JPEG: ");
      }
    }
  }
  const std::string jpg = image_bytes("rgb.jpg");
  EXPECT_KILN_ERROR(decode_jpeg(jpg.substr(0, jpg.size() - 40)), kDataLoss,
                    "ends before the JPEG end-of-image marker");
  EXPECT_KILN_ERROR(decode_png(image_bytes("rgb.png").substr(0, 100)), kDataLoss, "truncated");
}

TEST(Image, CorruptDataIsAnErrorNotACrash) {
  std::string png = image_bytes("rgb.png");
  std::string bad = png;
  bad[bad.size() / 2] ^= 0x40;  // inside IDAT: its CRC fails
  EXPECT_KILN_ERROR(decode_png(bad), kDataLoss, "PNG: ");
  bad = png;
  bad[16] = 0x7f;  // IHDR width = 2^31+: invalid
  EXPECT_KILN_ERROR(decode_png(bad), kDataLoss, "PNG: ");
  EXPECT_KILN_ERROR(decode_png("\x89PNG\r\n\x1a\nnonsense"), kDataLoss, "PNG: ");
  EXPECT_KILN_ERROR(decode_jpeg("\xFF\xD8\xFF\xE0garbage"), kDataLoss, "JPEG: ");
  EXPECT_KILN_ERROR(decode_jpeg("not a jpeg"), kDataLoss, "Not a JPEG file");
  // Every single-byte corruption of a small JPEG and PNG: a result or a kiln::Error.
  for (const char* name : {"gray.jpg", "gray.png"}) {
    const std::string full = image_bytes(name);
    for (size_t i = 0; i < full.size(); ++i) {
      std::string b = full;
      b[i] = static_cast<char>(b[i] ^ 0xA5);
      try {
        Tensor t = decode_image(b);
        EXPECT_EQ(t.dtype(), DType::kU8);
      } catch (const Error&) {
      }
    }
  }
}

TEST(Image, ArgumentAndLimitErrors) {
  EXPECT_KILN_ERROR(decode_image("hello"), kInvalidArgument, "not a PNG or JPEG image (starts with 68 65 6c 6c)");
  EXPECT_KILN_ERROR(decode_image(""), kInvalidArgument, "empty input");
  EXPECT_KILN_ERROR(decode_jpeg(image_bytes("rgb.jpg"), 4), kInvalidArgument, "channels");
  EXPECT_KILN_ERROR(decode_png(image_bytes("rgb.png"), 5), kInvalidArgument, "channels");
  EXPECT_KILN_ERROR(decode_jpeg(image_bytes("cmyk.jpg"), 1), kUnimplemented, "color conversion");
  EXPECT_KILN_ERROR(internal::decode_png(image_bytes("rgb.png"), 3, 100), kResourceExhausted,
                    "a 6 x 7 x 3 image (126 bytes) exceeds the limit of 100 bytes");
  EXPECT_KILN_ERROR(internal::decode_jpeg(image_bytes("rgb.jpg"), 1, 100), kResourceExhausted, "exceeds the limit");
  EXPECT_EQ(sniff_image_format(image_bytes("rgb.jpg")), "jpeg");
  EXPECT_EQ(sniff_image_format("\x89PNG"), "");
}

TEST(Image, FilesDatasetLabelsByDirectory) {
  TempDir dir("image");
  std::filesystem::create_directories(dir.file("dogs"));
  std::filesystem::create_directories(dir.file("cats"));
  write_bytes(dir.file("dogs/a.png"), image_bytes("rgb.png"));
  write_bytes(dir.file("cats/b.jpg"), image_bytes("rgb.jpg"));
  write_bytes(dir.file("cats/c.png"), image_bytes("rgb.png"));
  const std::vector<std::string> patterns{dir.file("*/*.png"), dir.file("*/*.jpg")};
  EXPECT_EQ(image_class_names(patterns), (std::vector<std::string>{"cats", "dogs"}));
  auto ds = image_files_dataset(patterns, {.channels = 3, .height = 4, .width = 11});
  EXPECT_EQ(ds.cardinality(), 3);
  EXPECT_EQ(ds.element_spec().str(), ElementSpec({{"image", "label"},
                                                  {TypeSpec::tensor(DType::kF32, {4, 11, 3}), TypeSpec::tensor(DType::kI64)}})
                                         .str());
  // keras-style pixels: tf.image.resize(decode(...)) / 255.
  Tensor want_png = load("image/resize_rgb_png_4x11.npy");
  for (int64_t i = 0; i < want_png.numel(); ++i) want_png.data<float>()[i] /= 255.0f;
  std::vector<int64_t> labels;
  int n = 0;
  for (const Element& e : ds.iterator()) {  // sorted: cats/b.jpg, cats/c.png, dogs/a.png
    labels.push_back(e.tensor("label").item<int64_t>());
    const Tensor& img = e.tensor("image");
    ASSERT_EQ(img.shape(), (Shape{4, 11, 3}));
    if (n > 0) {
      EXPECT_TRUE(allclose(img, want_png, 1e-6, 1e-6)) << describe_mismatch(img, want_png, 1e-6, 1e-6);
    }
    ++n;
  }
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 0, 1}));

  // No resize, channels as stored, no labels.
  auto raw = image_files_dataset({dir.file("dogs/*.png")}, {.channels = 0, .label_from_dir = false});
  EXPECT_EQ(raw.element_spec().str(), ElementSpec({{"image"}, {TypeSpec::tensor(DType::kF32, {-1, -1, -1})}}).str());
  auto e = raw.iterator().next();
  ASSERT_TRUE(e.has_value());
  Tensor want = load("image/rgb.png.c0.npy").to(DType::kF32);
  for (int64_t i = 0; i < want.numel(); ++i) want.data<float>()[i] /= 255.0f;
  EXPECT_TRUE(array_equal(e->tensor("image"), want));

  // A corrupt file fails the pass with its name.
  write_bytes(dir.file("dogs/bad.png"), image_bytes("rgb.png").substr(0, 50));
  auto with_bad = image_files_dataset({dir.file("dogs/*.png")});
  EXPECT_KILN_ERROR(
      [&] {
        for (const Element& x : with_bad.iterator()) (void)x;
        return 0;
      }(),
      kDataLoss, "image file '" + dir.file("dogs/bad.png") + "': PNG: truncated");
  EXPECT_KILN_ERROR(image_files_dataset({dir.file("*.gif")}), kNotFound, "no file matches");
  EXPECT_KILN_ERROR(image_files_dataset(patterns, {.height = 4}), kInvalidArgument, "height and width");
  EXPECT_KILN_ERROR(image_files_dataset(patterns, {.channels = 7}), kInvalidArgument, "channels");
}

}  // namespace
}  // namespace kiln::data
