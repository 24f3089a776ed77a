#include "kiln/data/idx.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sys/stat.h>
#include <vector>
#include <zlib.h>

#include "idx_internal.h"
#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "kiln/core/flags.h"

namespace kiln::data {
namespace detail {
namespace {

// Larger than any real data set; keeps the size arithmetic far from overflow.
constexpr uint64_t kMaxDataBytes = uint64_t{1} << 48;
// deflate cannot compress better than about 1032:1, which bounds how much output a
// gzip input can justify reserving up front.
constexpr uint64_t kMaxDeflateRatio = 1032;

[[noreturn]] void bad(const std::string& name, const std::string& why) {
  throw DataLossError("IDX file " + name + ": " + why);
}

uint32_t load_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct Header {
  DType dtype;          // kiln dtype of the result
  size_t file_itemsize;  // bytes per element in the file
  unsigned char code;
  Shape shape;
  size_t header_bytes;
  uint64_t data_bytes;
};

// The header at the front of `b`, or nullopt when `b` is too short to hold it all.
// Throws for a malformed header.
std::optional<Header> try_header(std::string_view b, const std::string& name) {
  if (b.size() < 4) return std::nullopt;
  auto* u = reinterpret_cast<const unsigned char*>(b.data());
  if (u[0] != 0 || u[1] != 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "bad magic %02x %02x %02x %02x (expected 00 00 <type> <rank>)", u[0], u[1], u[2],
                  u[3]);
    bad(name, buf);
  }
  Header h{};
  h.code = u[2];
  switch (h.code) {
    case 0x08: h.dtype = DType::kU8, h.file_itemsize = 1; break;
    case 0x09: h.dtype = DType::kI8, h.file_itemsize = 1; break;
    case 0x0B: h.dtype = DType::kI32, h.file_itemsize = 2; break;  // i16 widens: kiln has no i16
    case 0x0C: h.dtype = DType::kI32, h.file_itemsize = 4; break;
    case 0x0D: h.dtype = DType::kF32, h.file_itemsize = 4; break;
    case 0x0E: h.dtype = DType::kF64, h.file_itemsize = 8; break;
    default: {
      char buf[96];
      std::snprintf(buf, sizeof buf, "unknown type code 0x%02x (expected 0x08, 0x09, 0x0b, 0x0c, 0x0d or 0x0e)", h.code);
      bad(name, buf);
    }
  }
  int rank = u[3];
  if (rank > Shape::kMaxRank)
    bad(name, "rank " + std::to_string(rank) + " exceeds kiln's maximum of " + std::to_string(Shape::kMaxRank));
  h.header_bytes = 4 + 4 * static_cast<size_t>(rank);
  if (b.size() < h.header_bytes) return std::nullopt;
  uint64_t numel = 1;
  std::vector<int64_t> dims(rank);
  for (int i = 0; i < rank; ++i) {
    uint32_t d = load_be32(u + 4 + 4 * i);
    dims[i] = d;
    // Saturate past the cap so the product never overflows.
    if (d != 0 && numel > kMaxDataBytes / d) numel = kMaxDataBytes + 1;
    else numel *= d;
  }
  if (numel > kMaxDataBytes / h.file_itemsize) {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    bad(name, "dims " + s + "] describe an absurd amount of data (over 2^48 bytes)");
  }
  h.shape = Shape(dims);
  h.data_bytes = numel * h.file_itemsize;
  return h;
}

struct InflateGuard {
  z_stream* zs;
  ~InflateGuard() { inflateEnd(zs); }
};

// Decompresses a gzip stream (concatenated members allowed), stopping as soon as
// the output is longer than the IDX header in it says the file should be.
std::string gunzip(std::string_view in, const std::string& name) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) throw InternalError("zlib inflateInit2 failed");
  InflateGuard guard{&zs};
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  std::string out;
  std::optional<uint64_t> expected;  // total decompressed size, once the header is out
  size_t in_left = in.size();
  // Output grows in chunks sized to the input: small files stay cheap, big ones take few calls.
  const size_t chunk = std::clamp<size_t>(in.size() * 4, 4 << 10, 1 << 20);
  for (;;) {
    // zlib counts in uInt; feed the input in pieces that fit.
    if (zs.avail_in == 0 && in_left > 0) {
      zs.avail_in = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
      in_left -= zs.avail_in;
    }
    size_t old = out.size();
    out.resize(old + chunk);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + old);
    zs.avail_out = chunk;
    int rc = inflate(&zs, Z_NO_FLUSH);
    out.resize(old + chunk - zs.avail_out);
    if (!expected) {
      if (auto h = try_header(out, name)) {
        expected = h->header_bytes + h->data_bytes;
        uint64_t justified = std::min<uint64_t>(*expected, kMaxDeflateRatio * in.size() + chunk);
        if (justified > out.capacity()) out.reserve(justified);
      }
    }
    if (expected && out.size() > *expected)
      bad(name, "decompressed data is longer than the " + std::to_string(*expected) + " bytes its header describes");
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0 && in_left == 0) break;
      // Another gzip member follows (gzip allows concatenation).
      if (inflateReset(&zs) != Z_OK) throw InternalError("zlib inflateReset failed");
      continue;
    }
    if (rc == Z_MEM_ERROR) throw ResourceExhaustedError("out of memory decompressing " + name);
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0)
      bad(name, "truncated gzip stream (ends after " + std::to_string(in.size()) + " compressed bytes)");
    if (rc != Z_OK && rc != Z_BUF_ERROR)
      bad(name, std::string("corrupt gzip stream: ") + (zs.msg ? zs.msg : "zlib error " + std::to_string(rc)));
  }
  return out;
}

void to_host_order(const Header& h, const unsigned char* src, void* dst) {
  int64_t n = h.shape.numel();
  switch (h.code) {
    case 0x08:
    case 0x09:
      std::memcpy(dst, src, static_cast<size_t>(n));
      break;
    case 0x0B: {
      auto* d = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int16_t>((src[2 * i] << 8) | src[2 * i + 1]);
      break;
    }
    case 0x0C:
    case 0x0D: {
      auto* d = static_cast<uint32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = load_be32(src + 4 * i);
      break;
    }
    case 0x0E: {
      auto* d = static_cast<uint64_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = (uint64_t{load_be32(src + 8 * i)} << 32) | load_be32(src + 8 * i + 4);
      break;
    }
  }
}

Tensor parse_plain(std::string_view b, const std::string& name) {
  auto h = try_header(b, name);
  if (!h) bad(name, "truncated header: " + std::to_string(b.size()) + " bytes");
  uint64_t have = b.size() - h->header_bytes;
  if (have != h->data_bytes) {
    bad(name, std::string(have < h->data_bytes ? "truncated data" : "trailing bytes after the data") + ": shape " +
                  h->shape.str() + " needs " + std::to_string(h->data_bytes) + " bytes, found " +
                  std::to_string(have));
  }
  Tensor t = Tensor::empty(h->shape, h->dtype);
  to_host_order(*h, reinterpret_cast<const unsigned char*>(b.data()) + h->header_bytes, t.raw_data());
  return t;
}

}  // namespace

Tensor parse_idx(std::string_view bytes, const std::string& name) {
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f && static_cast<unsigned char>(bytes[1]) == 0x8b)
    return parse_plain(gunzip(bytes, name), name);
  return parse_plain(bytes, name);
}

}  // namespace detail

Tensor read_idx(const std::string& path) { return detail::parse_idx(read_file(path), path); }

namespace {

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Debian ships the files gzipped; accept uncompressed copies too.
std::string find_idx(const std::string& dir, const std::string& base) {
  std::string gz = dir + "/" + base + ".gz";
  if (is_file(gz)) return gz;
  if (is_file(dir + "/" + base)) return dir + "/" + base;
  throw NotFoundError("Fashion-MNIST file " + gz + " not found (nor " + base +
                      " uncompressed); install the Debian package dataset-fashion-mnist (run "
                      "scripts/install-deps.sh) or set KILN_FASHION_MNIST_DIR");
}

void load_split(const std::string& dir, const std::string& prefix, Tensor* images, Tensor* labels) {
  std::string ip = find_idx(dir, prefix + "-images-idx3-ubyte");
  std::string lp = find_idx(dir, prefix + "-labels-idx1-ubyte");
  *images = read_idx(ip);
  *labels = read_idx(lp);
  if (images->dtype() != DType::kU8 || images->rank() != 3 || images->dim(1) != 28 || images->dim(2) != 28)
    throw DataLossError(ip + ": expected u8 images [N, 28, 28], got " + images->desc());
  if (labels->dtype() != DType::kU8 || labels->rank() != 1 || labels->dim(0) != images->dim(0))
    throw DataLossError(lp + ": expected u8 labels [" + std::to_string(images->dim(0)) + "] to match " + ip +
                        ", got " + labels->desc());
  const uint8_t* l = labels->data<uint8_t>();
  for (int64_t i = 0; i < labels->numel(); ++i)
    if (l[i] > 9) throw DataLossError(lp + ": label " + std::to_string(l[i]) + " at index " + std::to_string(i) +
                                      " is outside the 10 classes 0..9");
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir) {
  std::string d = dir;
  if (d.empty()) {
    d = flags().fashion_mnist_dir.empty() ? kDefaultFashionMnistDir : flags().fashion_mnist_dir;
  }
  FashionMnist f;
  load_split(d, "train", &f.train_images, &f.train_labels);
  load_split(d, "t10k", &f.test_images, &f.test_labels);
  return f;
}

}  // namespace kiln::data
