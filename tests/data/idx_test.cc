#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/data/idx.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "data/idx_internal.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using kiln::testing::TempDir;
using kiln::testing::write_bytes;

namespace fs = std::filesystem;

void put_be32(std::string* s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s->push_back(static_cast<char>(v >> (8 * i)));
}

// An IDX header written by hand from the spec: 00 00 <type> <rank>, then BE u32 dims.
std::string idx_header(uint8_t type, std::vector<uint32_t> dims) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) put_be32(&s, d);
  return s;
}

// CRC-32 (the gzip/zlib polynomial 0xEDB88320), bit by bit: an independent reference.
uint32_t crc32_ref(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

// A gzip member (RFC 1952) holding `data` in stored (uncompressed) deflate blocks
// (RFC 1951 section 3.2.4), built without zlib.
std::string gzip_stored(const std::string& data) {
  std::string g = {'\x1f', '\x8b', 8, 0, 0, 0, 0, 0, 0, '\x03'};
  size_t off = 0;
  do {
    size_t n = std::min<size_t>(data.size() - off, 65535);
    bool last = off + n == data.size();
    g.push_back(last ? 1 : 0);
    g.push_back(static_cast<char>(n & 0xff));
    g.push_back(static_cast<char>(n >> 8));
    g.push_back(static_cast<char>(~n & 0xff));
    g.push_back(static_cast<char>((~n >> 8) & 0xff));
    g.append(data, off, n);
    off += n;
  } while (off < data.size());
  uint32_t crc = crc32_ref(data), isize = static_cast<uint32_t>(data.size());
  for (int i = 0; i < 4; ++i) g.push_back(static_cast<char>(crc >> (8 * i)));
  for (int i = 0; i < 4; ++i) g.push_back(static_cast<char>(isize >> (8 * i)));
  return g;
}

TEST(Idx, ReadsU8Rank3) {
  TempDir dir("idx");
  std::string f = idx_header(0x08, {2, 2, 3});
  for (int i = 0; i < 12; ++i) f.push_back(static_cast<char>(i * 20));
  write_bytes(dir.file("a.idx"), f);
  Tensor t = read_idx(dir.file("a.idx"));
  EXPECT_EQ(t.dtype(), DType::kU8);
  EXPECT_EQ(t.shape(), (Shape{2, 2, 3}));
  std::vector<uint8_t> expect(12);
  for (int i = 0; i < 12; ++i) expect[i] = static_cast<uint8_t>(i * 20);
  EXPECT_EQ(t.to_vector<uint8_t>(), expect);
}

TEST(Idx, BigEndianTypesConvert) {
  TempDir dir("idx");
  // i8: 0xff is -1.
  write_bytes(dir.file("i8"), idx_header(0x09, {3}) + std::string("\x01\xff\x80", 3));
  EXPECT_EQ(read_idx(dir.file("i8")).to_vector<int32_t>(), (std::vector<int32_t>{1, -1, -128}));
  EXPECT_EQ(read_idx(dir.file("i8")).dtype(), DType::kI8);
  // i16 widens to i32: 0x0102 = 258, 0xfffe = -2.
  write_bytes(dir.file("i16"), idx_header(0x0B, {2}) + std::string("\x01\x02\xff\xfe", 4));
  Tensor i16 = read_idx(dir.file("i16"));
  EXPECT_EQ(i16.dtype(), DType::kI32);
  EXPECT_EQ(i16.to_vector<int32_t>(), (std::vector<int32_t>{258, -2}));
  // i32: 0x01020304 = 16909060, 0xffffffff = -1.
  write_bytes(dir.file("i32"), idx_header(0x0C, {1, 2}) + std::string("\x01\x02\x03\x04\xff\xff\xff\xff", 8));
  Tensor i32 = read_idx(dir.file("i32"));
  EXPECT_EQ(i32.shape(), (Shape{1, 2}));
  EXPECT_EQ(i32.to_vector<int32_t>(), (std::vector<int32_t>{16909060, -1}));
  // f32: 0x3fc00000 = 1.5, 0xc0200000 = -2.5 (IEEE 754 by hand).
  write_bytes(dir.file("f32"), idx_header(0x0D, {2}) + std::string("\x3f\xc0\x00\x00\xc0\x20\x00\x00", 8));
  Tensor f32 = read_idx(dir.file("f32"));
  EXPECT_EQ(f32.dtype(), DType::kF32);
  EXPECT_EQ(f32.to_vector<float>(), (std::vector<float>{1.5f, -2.5f}));
  // f64: 0x400921fb54442d18 = pi.
  write_bytes(dir.file("f64"), idx_header(0x0E, {1}) + std::string("\x40\x09\x21\xfb\x54\x44\x2d\x18", 8));
  Tensor f64 = read_idx(dir.file("f64"));
  EXPECT_EQ(f64.dtype(), DType::kF64);
  EXPECT_EQ(f64.to_vector<double>()[0], 3.141592653589793);
}

TEST(Idx, EmptyAndScalarShapes) {
  TempDir dir("idx");
  write_bytes(dir.file("empty"), idx_header(0x08, {0, 28}));
  EXPECT_EQ(read_idx(dir.file("empty")).shape(), (Shape{0, 28}));
  write_bytes(dir.file("scalar"), idx_header(0x08, {}) + "\x07");
  Tensor s = read_idx(dir.file("scalar"));
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.item<int>(), 7);
}

TEST(Idx, GzipMatchesPlain) {
  TempDir dir("idx");
  std::string plain = idx_header(0x08, {300, 300});  // > 64 KiB: several stored blocks
  for (int i = 0; i < 90000; ++i) plain.push_back(static_cast<char>((i * 7) % 251));
  write_bytes(dir.file("x.idx"), plain);
  write_bytes(dir.file("x.idx.gz"), gzip_stored(plain));
  Tensor a = read_idx(dir.file("x.idx")), b = read_idx(dir.file("x.idx.gz"));
  EXPECT_EQ(b.shape(), (Shape{300, 300}));
  EXPECT_TRUE(array_equal(a, b));
  EXPECT_EQ(b.to_vector<int>()[89999], (89999 * 7) % 251);
}

TEST(Idx, GzipDetectedByMagicNotName) {
  TempDir dir("idx");
  std::string plain = idx_header(0x08, {2}) + "\x05\x06";
  write_bytes(dir.file("no_suffix"), gzip_stored(plain));
  EXPECT_EQ(read_idx(dir.file("no_suffix")).to_vector<int>(), (std::vector<int>{5, 6}));
  write_bytes(dir.file("fake.gz"), plain);
  EXPECT_EQ(read_idx(dir.file("fake.gz")).to_vector<int>(), (std::vector<int>{5, 6}));
}

TEST(Idx, GzipConcatenatedMembers) {
  TempDir dir("idx");
  std::string plain = idx_header(0x08, {4}) + "\x01\x02\x03\x04";
  write_bytes(dir.file("m.gz"), gzip_stored(plain.substr(0, 6)) + gzip_stored(plain.substr(6)));
  EXPECT_EQ(read_idx(dir.file("m.gz")).to_vector<int>(), (std::vector<int>{1, 2, 3, 4}));
}

TEST(Idx, MissingFileIsNotFound) {
  TempDir dir("idx");
  EXPECT_KILN_ERROR(read_idx(dir.file("nope.idx")), kNotFound, "nope.idx");
}

TEST(Idx, TruncatedData) {
  TempDir dir("idx");
  write_bytes(dir.file("t"), idx_header(0x08, {2, 3}) + "\x01\x02\x03\x04\x05");
  EXPECT_KILN_ERROR(read_idx(dir.file("t")), kDataLoss, "truncated data");
  EXPECT_KILN_ERROR(read_idx(dir.file("t")), kDataLoss, dir.file("t"));
  EXPECT_KILN_ERROR(read_idx(dir.file("t")), kDataLoss, "needs 6 bytes, found 5");
}

TEST(Idx, TruncatedHeader) {
  TempDir dir("idx");
  write_bytes(dir.file("h2"), std::string("\x00\x00", 2));
  EXPECT_KILN_ERROR(read_idx(dir.file("h2")), kDataLoss, "truncated header");
  std::string h = idx_header(0x08, {5, 5});
  write_bytes(dir.file("h9"), h.substr(0, 9));  // second dim cut
  EXPECT_KILN_ERROR(read_idx(dir.file("h9")), kDataLoss, "truncated header");
}

TEST(Idx, TrailingBytes) {
  TempDir dir("idx");
  write_bytes(dir.file("t"), idx_header(0x08, {2}) + "\x01\x02\x03");
  EXPECT_KILN_ERROR(read_idx(dir.file("t")), kDataLoss, "trailing bytes");
}

TEST(Idx, BadMagic) {
  TempDir dir("idx");
  write_bytes(dir.file("m"), std::string("\x01\x00\x08\x01\x00\x00\x00\x01\x07", 9));
  EXPECT_KILN_ERROR(read_idx(dir.file("m")), kDataLoss, "bad magic 01 00 08 01");
  EXPECT_KILN_ERROR(read_idx(dir.file("m")), kDataLoss, dir.file("m"));
  write_bytes(dir.file("npy"), "\x93NUMPY\x01\x00");
  EXPECT_KILN_ERROR(read_idx(dir.file("npy")), kDataLoss, "bad magic");
}

TEST(Idx, BadTypeCode) {
  TempDir dir("idx");
  write_bytes(dir.file("t"), idx_header(0x0A, {1}) + "\x00");
  EXPECT_KILN_ERROR(read_idx(dir.file("t")), kDataLoss, "unknown type code 0x0a");
}

TEST(Idx, RankAboveKilnMaximum) {
  TempDir dir("idx");
  write_bytes(dir.file("r"), idx_header(0x08, std::vector<uint32_t>(9, 1)) + "\x00");
  EXPECT_KILN_ERROR(read_idx(dir.file("r")), kDataLoss, "rank 9");
}

TEST(Idx, AbsurdDimsRejectedBeforeAllocating) {
  // 2^32-1 cubed would overflow 64 bits; must be refused from the header alone.
  std::string h = idx_header(0x0E, {0xffffffffu, 0xffffffffu, 0xffffffffu});
  EXPECT_KILN_ERROR(detail::parse_idx(h, "big"), kDataLoss, "absurd");
  // Plausible-looking dims but no data: refused by size, nothing allocated.
  EXPECT_KILN_ERROR(detail::parse_idx(idx_header(0x0D, {1u << 30, 1u << 10}), "big2"), kDataLoss, "truncated");
  // Same through gzip: the stream ends long before the claimed size.
  EXPECT_KILN_ERROR(detail::parse_idx(gzip_stored(idx_header(0x0D, {1u << 30, 1u << 10})), "big3"), kDataLoss,
                    "truncated");
}

TEST(Idx, CorruptGzip) {
  TempDir dir("idx");
  std::string plain = idx_header(0x08, {64});
  for (int i = 0; i < 64; ++i) plain.push_back(static_cast<char>(i));
  std::string gz = gzip_stored(plain);
  std::string flipped = gz;
  flipped[30] ^= 0x40;  // a data byte: the CRC-32 in the trailer no longer matches
  write_bytes(dir.file("crc.gz"), flipped);
  EXPECT_KILN_ERROR(read_idx(dir.file("crc.gz")), kDataLoss, "corrupt gzip stream");
  EXPECT_KILN_ERROR(read_idx(dir.file("crc.gz")), kDataLoss, dir.file("crc.gz"));
  std::string bad_block = gz;
  bad_block[10] = 0x07;  // first block header: BTYPE 11 is reserved
  write_bytes(dir.file("block.gz"), bad_block);
  EXPECT_KILN_ERROR(read_idx(dir.file("block.gz")), kDataLoss, "corrupt gzip stream");
  write_bytes(dir.file("cut.gz"), gz.substr(0, gz.size() - 20));
  EXPECT_KILN_ERROR(read_idx(dir.file("cut.gz")), kDataLoss, "truncated gzip stream");
  // A valid gzip stream that holds a truncated IDX file.
  write_bytes(dir.file("short.gz"), gzip_stored(plain.substr(0, plain.size() - 1)));
  EXPECT_KILN_ERROR(read_idx(dir.file("short.gz")), kDataLoss, "truncated data");
}

// ---- Fashion-MNIST ----

constexpr const char* kDebianDir = "/usr/share/datasets/fashion-mnist";

void require_debian_dataset() {
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"}) {
    ASSERT_TRUE(fs::exists(std::string(kDebianDir) + "/" + f))
        << kDebianDir << "/" << f
        << " is missing: the Debian package dataset-fashion-mnist is not installed; run scripts/install-deps.sh";
  }
}

TEST(FashionMnist, LoadsDebianFiles) {
  require_debian_dataset();
  FashionMnist f = load_fashion_mnist(kDebianDir);
  EXPECT_EQ(f.train_images.shape(), (Shape{60000, 28, 28}));
  EXPECT_EQ(f.train_labels.shape(), (Shape{60000}));
  EXPECT_EQ(f.test_images.shape(), (Shape{10000, 28, 28}));
  EXPECT_EQ(f.test_labels.shape(), (Shape{10000}));
  for (const Tensor* t : {&f.train_images, &f.train_labels, &f.test_images, &f.test_labels})
    EXPECT_EQ(t->dtype(), DType::kU8);
  const uint8_t* tl = f.train_labels.data<uint8_t>();
  const uint8_t* vl = f.test_labels.data<uint8_t>();
  EXPECT_EQ(tl[0], 9);  // an ankle boot
  EXPECT_EQ(vl[0], 9);
  // Reference values from Python's gzip module + NumPy on the same files: the classes
  // are balanced (6000 / 1000 each), and pixel sums of the first images and the set.
  std::vector<int> train_counts(10), test_counts(10);
  for (int64_t i = 0; i < 60000; ++i) {
    ASSERT_LE(tl[i], 9);
    ++train_counts[tl[i]];
  }
  for (int64_t i = 0; i < 10000; ++i) {
    ASSERT_LE(vl[i], 9);
    ++test_counts[vl[i]];
  }
  EXPECT_EQ(train_counts, std::vector<int>(10, 6000));
  EXPECT_EQ(test_counts, std::vector<int>(10, 1000));
  const uint8_t* ti = f.train_images.data<uint8_t>();
  EXPECT_EQ(std::accumulate(ti, ti + 784, int64_t{0}), 76247);
  EXPECT_EQ(std::accumulate(ti, ti + 60000 * 784, int64_t{0}), 3431114169);
  const uint8_t* vi = f.test_images.data<uint8_t>();
  EXPECT_EQ(std::accumulate(vi, vi + 784, int64_t{0}), 33456);
}

// Writes a small, valid Fashion-MNIST-shaped set (n train, m test images).
void write_fake_set(const std::string& dir, int n, int m, bool gz) {
  auto put = [&](const std::string& name, std::string bytes) {
    write_bytes(dir + "/" + name + (gz ? ".gz" : ""), gz ? gzip_stored(bytes) : bytes);
  };
  put("train-images-idx3-ubyte", idx_header(0x08, {uint32_t(n), 28, 28}) + std::string(n * 784, '\x11'));
  put("train-labels-idx1-ubyte", idx_header(0x08, {uint32_t(n)}) + std::string(n, '\x03'));
  put("t10k-images-idx3-ubyte", idx_header(0x08, {uint32_t(m), 28, 28}) + std::string(m * 784, '\x22'));
  put("t10k-labels-idx1-ubyte", idx_header(0x08, {uint32_t(m)}) + std::string(m, '\x04'));
}

TEST(FashionMnist, EnvironmentOverridesDefaultDir) {
  TempDir dir("idx");
  write_fake_set(dir.path(), 3, 2, /*gz=*/false);  // uncompressed copies are accepted too
  const char* old = std::getenv("KILN_FASHION_MNIST_DIR");
  std::string saved = old ? old : "";
  ::setenv("KILN_FASHION_MNIST_DIR", dir.path().c_str(), 1);
  FashionMnist f = load_fashion_mnist();
  if (old) ::setenv("KILN_FASHION_MNIST_DIR", saved.c_str(), 1);
  else ::unsetenv("KILN_FASHION_MNIST_DIR");
  EXPECT_EQ(f.train_images.shape(), (Shape{3, 28, 28}));
  EXPECT_EQ(f.test_labels.shape(), (Shape{2}));
  EXPECT_EQ(f.test_labels.to_vector<int>(), (std::vector<int>{4, 4}));
  EXPECT_EQ(f.train_images.to_vector<int>()[100], 0x11);
}

TEST(FashionMnist, MissingFileNamesFileAndPackage) {
  TempDir dir("idx");
  EXPECT_KILN_ERROR(load_fashion_mnist(dir.path()), kNotFound, dir.file("train-images-idx3-ubyte.gz"));
  EXPECT_KILN_ERROR(load_fashion_mnist(dir.path()), kNotFound, "dataset-fashion-mnist");
  EXPECT_KILN_ERROR(load_fashion_mnist(dir.path()), kNotFound, "scripts/install-deps.sh");
  write_fake_set(dir.path(), 2, 2, /*gz=*/true);
  fs::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
  EXPECT_KILN_ERROR(load_fashion_mnist(dir.path()), kNotFound, "t10k-labels-idx1-ubyte.gz");
}

TEST(FashionMnist, MismatchedFilesAreDataLoss) {
  TempDir dir("idx");
  write_fake_set(dir.path(), 2, 2, /*gz=*/true);
  write_bytes(dir.file("train-labels-idx1-ubyte.gz"), gzip_stored(idx_header(0x08, {3}) + "\x01\x02\x03"));
  EXPECT_KILN_ERROR(load_fashion_mnist(dir.path()), kDataLoss, "expected u8 labels [2]");
  write_fake_set(dir.path(), 2, 2, /*gz=*/true);
  write_bytes(dir.file("train-labels-idx1-ubyte.gz"), gzip_stored(idx_header(0x08, {2}) + "\x01\x0a"));
  EXPECT_KILN_ERROR(load_fashion_mnist(dir.path()), kDataLoss, "label 10 at index 1");
  write_fake_set(dir.path(), 2, 2, /*gz=*/true);
  write_bytes(dir.file("t10k-images-idx3-ubyte.gz"), gzip_stored(idx_header(0x08, {2, 27, 28}) + std::string(2 * 27 * 28, '\0')));
  EXPECT_KILN_ERROR(load_fashion_mnist(dir.path()), kDataLoss, "expected u8 images [N, 28, 28]");
}

}  // namespace
}  // namespace kiln::data
