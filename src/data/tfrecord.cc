#include "kiln/data/tfrecord.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "kiln/core/crc32c.h"
#include "kiln/core/error.h"

namespace kiln::data {
namespace {

// Records are buffered up to this size, then handed to the OS in one write.
constexpr size_t kFlushBytes = 256 << 10;
constexpr size_t kHeaderBytes = 12;  // u64 length + u32 masked crc of the length
constexpr size_t kFooterBytes = 4;   // u32 masked crc of the data
constexpr size_t kFramingBytes = kHeaderBytes + kFooterBytes;
constexpr uInt kMaxZlibChunk = 1u << 30;  // zlib counts in uInt

void store_le32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void store_le64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t load_le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
uint64_t load_le64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

void fsync_dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// zlib's windowBits: 15 (32 KiB window, TF's MAX_WBITS), +16 for a gzip wrapper.
int window_bits(Compression c) { return c == Compression::kGzip ? 15 + 16 : 15; }

// kAuto: uncompressed if the first 12 bytes are a header whose length CRC matches (a
// compressed stream does so by chance once in 2^32), else gzip by its magic 1f 8b,
// else zlib by its header (CMF method 8, window <= 32 KiB, CMF*256+FLG divisible by
// 31), else uncompressed (whose reading then reports the bad header).
Compression detect_compression(const unsigned char* p, size_t n) {
  if (n >= kHeaderBytes &&
      load_le32(reinterpret_cast<const char*>(p) + 8) == crc32c_mask(crc32c(p, 8)))
    return Compression::kNone;
  if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) return Compression::kGzip;
  if (n >= 2 && (p[0] & 0x0f) == 8 && (p[0] >> 4) <= 7 && (p[0] * 256 + p[1]) % 31 == 0) return Compression::kZlib;
  return Compression::kNone;
}

}  // namespace

Compression parse_compression(std::string_view name) {
  std::string s(name);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.empty() || s == "none") return Compression::kNone;
  if (s == "gzip") return Compression::kGzip;
  if (s == "zlib") return Compression::kZlib;
  if (s == "auto") return Compression::kAuto;
  throw InvalidArgumentError("unknown TFRecord compression '" + std::string(name) +
                             "' (expected none, gzip, zlib or auto)");
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "none";
    case Compression::kGzip:
      return "gzip";
    case Compression::kZlib:
      return "zlib";
    case Compression::kAuto:
      return "auto";
  }
  return "?";
}

// ---- writer ----

struct TFRecordWriter::Deflater {
  z_stream zs{};
  std::unique_ptr<char[]> out{new char[kFlushBytes]};
  bool pending = false;   // input deflated or buffered since the last sync flush
  bool finished = false;  // Z_FINISH done
  ~Deflater() { deflateEnd(&zs); }
};

TFRecordWriter::TFRecordWriter(const std::string& path, TFRecordWriterOptions options)
    : path_(path), options_(options) {
  if (options_.compression == Compression::kAuto)
    throw InvalidArgumentError("TFRecord writer for " + path + ": compression must be none, gzip or zlib, not auto");
  if (options_.compression_level < -1 || options_.compression_level > 9)
    throw InvalidArgumentError("TFRecord writer for " + path + ": compression_level " +
                               std::to_string(options_.compression_level) + " is not in [-1, 9]");
  if (options_.compression != Compression::kNone) {
    deflater_ = std::make_unique<Deflater>();
    // TF's ZlibCompressionOptions: default level and strategy, memLevel 9, 32 KiB window.
    if (deflateInit2(&deflater_->zs, options_.compression_level, Z_DEFLATED, window_bits(options_.compression), 9,
                     Z_DEFAULT_STRATEGY) != Z_OK)
      throw InternalError("zlib deflateInit2 failed");  // (deflateEnd copes with the failed init)
  }
  file_path_ = options_.atomic ? path + ".tmp." + std::to_string(::getpid()) : path;
  if (options_.atomic && options_.exclusive && ::access(path.c_str(), F_OK) == 0)
    throw FailedPreconditionError("TFRecord file " + path + " already exists");
  int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (options_.exclusive && !options_.atomic) flags |= O_EXCL;
  fd_ = ::open(file_path_.c_str(), flags, 0644);
  if (fd_ < 0) {
    int e = errno;
    if (e == EEXIST) throw FailedPreconditionError("TFRecord file " + path + " already exists");
    throw FailedPreconditionError("cannot create TFRecord file " + file_path_ + ": " + std::strerror(e));
  }
}

TFRecordWriter::~TFRecordWriter() {
  if (fd_ < 0) return;
  if (options_.atomic) {
    // Not committed: leave `path` as it was.
    ::close(fd_);
    ::unlink(file_path_.c_str());
    return;
  }
  try {
    close();
  } catch (const Error&) {
  }
}

void TFRecordWriter::write_out(const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw DataLossError("write error on TFRecord file " + file_path_ + ": " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Compresses buffer_ (emptying it) and writes what deflate produces.
void TFRecordWriter::deflate_buffer(int flush_mode) {
  Deflater& d = *deflater_;
  // Drop the buffer even on error: retrying could write a record twice.
  std::string pending;
  pending.swap(buffer_);
  buffer_.reserve(pending.capacity());
  z_stream& zs = d.zs;
  zs.next_in = reinterpret_cast<Bytef*>(pending.data());
  size_t in_left = pending.size();
  for (;;) {
    if (zs.avail_in == 0 && in_left > 0) {
      zs.avail_in = static_cast<uInt>(std::min<size_t>(in_left, kMaxZlibChunk));
      in_left -= zs.avail_in;
    }
    int mode = in_left > 0 ? Z_NO_FLUSH : flush_mode;
    zs.next_out = reinterpret_cast<Bytef*>(d.out.get());
    zs.avail_out = kFlushBytes;
    int rc = deflate(&zs, mode);
    if (rc == Z_STREAM_ERROR) throw InternalError("zlib deflate failed on TFRecord file " + file_path_);
    write_out(d.out.get(), kFlushBytes - zs.avail_out);
    if (zs.avail_out == 0 || in_left > 0) continue;  // more output (or input) may be pending
    break;
  }
  if (flush_mode == Z_FINISH) d.finished = true;
  d.pending = flush_mode == Z_NO_FLUSH;
}

void TFRecordWriter::write(std::string_view record) {
  if (fd_ < 0) throw FailedPreconditionError("TFRecord file " + path_ + " is closed");
  char header[kHeaderBytes], footer[kFooterBytes];
  store_le64(header, record.size());
  store_le32(header + 8, crc32c_mask(crc32c(header, 8)));
  store_le32(footer, crc32c_mask(crc32c(record.data(), record.size())));
  buffer_.append(header, kHeaderBytes);
  buffer_.append(record);
  buffer_.append(footer, kFooterBytes);
  ++records_;
  bytes_ += kFramingBytes + record.size();
  if (deflater_) {
    deflater_->pending = true;
    if (buffer_.size() >= kFlushBytes) deflate_buffer(Z_NO_FLUSH);
  } else if (buffer_.size() >= kFlushBytes) {
    flush();
  }
}

void TFRecordWriter::flush() {
  if (fd_ < 0) return;
  if (deflater_) {
    if (deflater_->pending && !deflater_->finished) deflate_buffer(Z_SYNC_FLUSH);
    return;
  }
  if (buffer_.empty()) return;
  // Drop the buffer even on error: retrying could write a record twice.
  std::string pending;
  pending.swap(buffer_);
  write_out(pending.data(), pending.size());
}

void TFRecordWriter::sync() {
  flush();
  if (fd_ >= 0 && ::fsync(fd_) != 0)
    throw DataLossError("fsync failed on TFRecord file " + file_path_ + ": " + std::strerror(errno));
}

void TFRecordWriter::close() {
  if (fd_ < 0) return;
  try {
    if (deflater_ && !deflater_->finished) deflate_buffer(Z_FINISH);
    sync();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    if (options_.atomic) ::unlink(file_path_.c_str());
    throw;
  }
  int rc = ::close(fd_);
  int e = errno;
  fd_ = -1;
  if (rc != 0) {
    if (options_.atomic) ::unlink(file_path_.c_str());
    throw DataLossError("close failed on TFRecord file " + file_path_ + ": " + std::strerror(e));
  }
  if (options_.atomic) {
    // exclusive: link() fails instead of replacing a file created meanwhile.
    rc = options_.exclusive ? ::link(file_path_.c_str(), path_.c_str()) : ::rename(file_path_.c_str(), path_.c_str());
    e = errno;
    if (rc != 0 || options_.exclusive) ::unlink(file_path_.c_str());
    if (rc != 0) {
      if (e == EEXIST) throw FailedPreconditionError("TFRecord file " + path_ + " already exists");
      throw FailedPreconditionError("cannot rename " + file_path_ + " to " + path_ + ": " + std::strerror(e));
    }
  }
  fsync_dir_of(path_);
}

// ---- reader ----
//
// Bytes of the (decompressed) stream land in `buf`; [begin, end) is what has not been
// consumed, and buf[begin] is at stream offset `consumed`. A record is consumed only
// once it is whole and valid, so after an error the reader is still at its start.

struct TFRecordReader::Impl {
  std::string path;
  TFRecordReaderOptions opt;
  Compression comp = Compression::kNone;  // kAuto until detected
  int fd = -1;
  bool from_memory = false;
  std::string memory;
  uint64_t raw_pos = 0;  // file (compressed) bytes read so far

  // Compressed input.
  std::unique_ptr<char[]> raw;
  size_t raw_cap = 0;
  z_stream zs{};
  bool z_init = false;
  bool member_end = false;  // the last inflate() ended a stream and no input followed yet
  std::string z_error;      // a corrupt stream (sticky): what and where

  // Decompressed bytes.
  std::unique_ptr<char[]> buf;
  size_t cap = 0, begin = 0, end = 0;
  uint64_t consumed = 0;

  uint64_t records_read = 0, skipped = 0;
  bool done = false;  // skip_corrupt reached an end it cannot read past

  ~Impl() {
    if (fd >= 0) ::close(fd);
    if (z_init) inflateEnd(&zs);
  }

  size_t avail() const { return end - begin; }
  const char* cur() const { return buf.get() + begin; }
  void consume(size_t n) {
    begin += n;
    consumed += n;
  }
  size_t base_bytes() const {
    size_t b = std::max<size_t>(opt.buffer_bytes, 64);
    if (from_memory) b = std::clamp<size_t>(memory.size() * (comp == Compression::kNone ? 1 : 4), 64, b);
    return b;
  }

  std::string prefix() const {
    std::string s = "TFRecord file " + path;
    if (comp == Compression::kGzip || comp == Compression::kZlib) s += std::string(" (") + compression_name(comp) + ")";
    return s;
  }
  std::string where(uint64_t off) const {
    bool z = comp == Compression::kGzip || comp == Compression::kZlib;
    return prefix() + ": record at " + (z ? "decompressed offset " : "offset ") + std::to_string(off) + ": ";
  }

  // Up to n file bytes; 0 only at the end of the file.
  size_t read_raw(char* dst, size_t n) {
    if (from_memory) {
      size_t k = raw_pos < memory.size() ? std::min<uint64_t>(n, memory.size() - raw_pos) : 0;
      std::memcpy(dst, memory.data() + raw_pos, k);
      raw_pos += k;
      return k;
    }
    for (;;) {
      ssize_t k = ::read(fd, dst, n);
      if (k >= 0) {
        raw_pos += static_cast<uint64_t>(k);
        return static_cast<size_t>(k);
      }
      if (errno == EINTR) continue;
      throw DataLossError(prefix() + ": read error at file offset " + std::to_string(raw_pos) + ": " +
                          std::strerror(errno));
    }
  }

  // Stream bytes from the unconsumed start to the end of the file, when cheaply known
  // (uncompressed files and memory).
  std::optional<uint64_t> known_left() {
    if (comp != Compression::kNone) return std::nullopt;
    uint64_t size;
    if (from_memory) {
      size = memory.size();
    } else {
      struct stat st;
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
      size = static_cast<uint64_t>(st.st_size);
    }
    return avail() + (size > raw_pos ? size - raw_pos : 0);
  }

  // Makes free space after `end`, aiming at `target` unconsumed bytes in all: compacts,
  // and grows the buffer by doubling when it is full (so that an unverified length
  // never allocates much more than the data there is) or straight to `target` when
  // the data is known to exist.
  void make_room(uint64_t target, bool trusted) {
    if (!buf) {
      cap = base_bytes();
      if (trusted && target > cap) cap = target;
      buf.reset(new char[cap]);
    }
    if (begin == end) begin = end = 0;
    size_t base = base_bytes();
    if (cap > 4 * base && avail() <= base && target <= base) {  // drop the room a huge record needed
      std::unique_ptr<char[]> b(new char[base]);
      std::memcpy(b.get(), cur(), avail());
      buf = std::move(b);
      end = avail();
      begin = 0;
      cap = base;
    }
    uint64_t want_free = target > avail() ? target - avail() : 1;
    if (begin > 0 && cap - end < std::max<uint64_t>(want_free, cap / 4)) {
      std::memmove(buf.get(), cur(), avail());
      end = avail();
      begin = 0;
    }
    size_t new_cap = cap;
    if (end == cap) new_cap = 2 * cap;
    if (trusted && target > new_cap) new_cap = target;
    if (new_cap != cap) {
      std::unique_ptr<char[]> b(new char[new_cap]);
      std::memcpy(b.get(), cur(), avail());
      buf = std::move(b);
      end = avail();
      begin = 0;
      cap = new_cap;
    }
  }

  void start_inflate() {
    if (!raw) {
      raw_cap = base_bytes();
      raw.reset(new char[raw_cap]);
    }
    if (inflateInit2(&zs, window_bits(comp)) != Z_OK) throw InternalError("zlib inflateInit2 failed");
    z_init = true;
  }

  // Detects the compression from the first bytes (kAuto); false while the file is empty.
  bool detect() {
    char head[kHeaderBytes];
    size_t n = 0;
    while (n < kHeaderBytes) {
      size_t k = read_raw(head + n, kHeaderBytes - n);
      if (k == 0) break;
      n += k;
    }
    if (n == 0) return false;
    comp = detect_compression(reinterpret_cast<const unsigned char*>(head), n);
    if (comp == Compression::kNone) {
      make_room(n, true);
      std::memcpy(buf.get() + end, head, n);
      end += n;
    } else {
      start_inflate();
      std::memcpy(raw.get(), head, n);
      zs.next_in = reinterpret_cast<Bytef*>(raw.get());
      zs.avail_in = static_cast<uInt>(n);
    }
    return true;
  }

  // Appends stream bytes to the buffer; returns how many (0: the end of the file).
  size_t fill(uint64_t target, bool trusted) {
    if (comp == Compression::kAuto) {
      if (!detect()) return 0;
      if (comp == Compression::kNone) return avail();
    }
    make_room(target, trusted);
    if (comp == Compression::kNone) {
      size_t k = read_raw(buf.get() + end, cap - end);
      end += k;
      return k;
    }
    if (!z_error.empty()) throw DataLossError(where(consumed) + z_error);
    for (;;) {
      if (zs.avail_in == 0) {
        size_t k = read_raw(raw.get(), raw_cap);
        if (k == 0) return 0;
        zs.next_in = reinterpret_cast<Bytef*>(raw.get());
        zs.avail_in = static_cast<uInt>(k);
      }
      if (member_end) {
        // More input after the end of a stream: another gzip member (as `cat a.gz b.gz`
        // makes, and gzip -d reads); a zlib stream has no successor.
        if (comp == Compression::kZlib) {
          set_corrupt("data after the end of the zlib stream");
          throw DataLossError(where(consumed) + z_error);
        }
        if (inflateReset(&zs) != Z_OK) throw InternalError("zlib inflateReset failed");
        member_end = false;
      }
      size_t room = std::min<size_t>(cap - end, kMaxZlibChunk);
      zs.next_out = reinterpret_cast<Bytef*>(buf.get() + end);
      zs.avail_out = static_cast<uInt>(room);
      int rc = inflate(&zs, Z_NO_FLUSH);
      size_t produced = room - zs.avail_out;
      end += produced;
      if (rc == Z_STREAM_END) {
        member_end = true;
      } else if (rc == Z_MEM_ERROR) {
        throw ResourceExhaustedError(prefix() + ": out of memory decompressing");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        // Records decompressed before the damage still count (each has its CRC): the
        // error comes when the reader needs bytes past it.
        set_corrupt(zs.msg ? zs.msg : "zlib error " + std::to_string(rc));
        if (produced > 0) return produced;
        throw DataLossError(where(consumed) + z_error);
      }
      if (produced > 0) return produced;
      if (rc == Z_BUF_ERROR && zs.avail_in > 0) throw InternalError(prefix() + ": inflate made no progress");
    }
  }

  void set_corrupt(const std::string& why) {
    z_error = "corrupt " + std::string(compression_name(comp)) + " stream at decompressed offset " +
              std::to_string(consumed + avail()) + " (compressed offset " + std::to_string(raw_pos - zs.avail_in) +
              "): " + why;
  }

  // Fills until n unconsumed bytes are there or the file ends; returns avail().
  size_t ensure(uint64_t n, bool trusted = false) {
    while (avail() < n)
      if (fill(n, trusted) == 0) break;
    return avail();
  }

  // At the end of the file with nothing unconsumed: is the end clean?
  bool clean_end() const {
    if (comp == Compression::kGzip || comp == Compression::kZlib) return member_end || raw_pos == 0;
    return true;
  }
  // Why the data ended early, beyond the record itself.
  std::string eof_detail() const {
    if (clean_end()) return "";
    return "; the " + std::string(compression_name(comp)) + " stream is truncated (ends after " +
           std::to_string(raw_pos) + " compressed bytes)";
  }
};

TFRecordReader::TFRecordReader(const std::string& path, TFRecordReaderOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->opt = std::move(options);
  impl_->comp = impl_->opt.compression;
  impl_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl_->fd < 0) {
    int e = errno;
    if (e == ENOENT) throw NotFoundError("TFRecord file not found: " + path);
    throw FailedPreconditionError("cannot open TFRecord file " + path + ": " + std::strerror(e));
  }
  if (impl_->comp == Compression::kGzip || impl_->comp == Compression::kZlib) impl_->start_inflate();
}

TFRecordReader TFRecordReader::from_string(std::string data, std::string name, TFRecordReaderOptions options) {
  TFRecordReader r;
  r.impl_ = std::make_unique<Impl>();
  Impl& m = *r.impl_;
  m.path = std::move(name);
  m.opt = std::move(options);
  m.comp = m.opt.compression;
  m.memory = std::move(data);
  m.from_memory = true;
  if (m.comp == Compression::kGzip || m.comp == Compression::kZlib) m.start_inflate();
  return r;
}

TFRecordReader::TFRecordReader(TFRecordReader&& o) noexcept = default;
TFRecordReader& TFRecordReader::operator=(TFRecordReader&& o) noexcept = default;
TFRecordReader::~TFRecordReader() = default;

uint64_t TFRecordReader::offset() const { return impl_->consumed; }
uint64_t TFRecordReader::records_read() const { return impl_->records_read; }
uint64_t TFRecordReader::records_skipped() const { return impl_->skipped; }
Compression TFRecordReader::compression() const { return impl_->comp; }
const std::string& TFRecordReader::path() const { return impl_->path; }

bool TFRecordReader::next(std::string* record) {
  Impl& m = *impl_;
  const bool skip = m.opt.skip_corrupt;
  // After a length CRC mismatch (skip_corrupt): looking for the next whole valid record.
  bool scanning = false;
  // A corrupt record: throws, or (skip_corrupt) counts it once per corrupt region.
  auto bad = [&](uint64_t off, const std::string& why) {
    std::string msg = m.where(off) + why;
    if (!skip) throw DataLossError(msg);
    if (scanning) return;
    ++m.skipped;
    if (m.opt.on_skip) m.opt.on_skip(msg);
  };
  for (;;) {
    if (m.done) return false;
    const uint64_t off = m.consumed;
    try {
      size_t have = m.ensure(kHeaderBytes);
      if (have == 0) {
        if (m.clean_end()) return false;
        bad(off, "truncated " + std::string(compression_name(m.comp)) + " stream (ends after " +
                     std::to_string(m.raw_pos) + " compressed bytes)");
        m.done = true;
        return false;
      }
      if (have < kHeaderBytes) {
        bad(off, "truncated header (" + std::to_string(have) + " of " + std::to_string(kHeaderBytes) + " bytes)" +
                     m.eof_detail());
        m.done = true;
        return false;
      }
      uint64_t len = load_le64(m.cur());
      uint32_t stored = load_le32(m.cur() + 8), computed = crc32c_mask(crc32c(m.cur(), 8));
      if (stored != computed) {
        bad(off, "length CRC mismatch (stored " + hex32(stored) + ", computed " + hex32(computed) + ")");
        scanning = true;
        m.consume(1);
        continue;
      }
      // The whole record. A corrupt length whose CRC happens to match must not allocate
      // terabytes: check it against the data there is first (uncompressed), or let the
      // buffer grow only as data arrives (compressed).
      const uint64_t need = len > (uint64_t{1} << 62) ? ~uint64_t{0} : len + kFramingBytes;
      if (have < need) {
        std::optional<uint64_t> left;
        if (need > m.cap) left = m.known_left();
        if (!left || *left >= need) have = m.ensure(need, left.has_value());
      }
      if (have < need) {
        if (scanning) {  // not a record start after all
          m.consume(1);
          continue;
        }
        std::optional<uint64_t> left = m.known_left();
        uint64_t rem = std::max<uint64_t>(left ? *left : have, kHeaderBytes) - kHeaderBytes;
        bad(off, "truncated: the record needs " + std::to_string(len) + " data + " + std::to_string(kFooterBytes) +
                     " CRC bytes, " + std::to_string(rem) + " remain" + m.eof_detail());
        m.done = true;
        return false;
      }
      const char* data = m.cur() + kHeaderBytes;
      stored = load_le32(data + len);
      computed = crc32c_mask(crc32c(data, len));
      if (stored != computed) {
        if (scanning) {
          m.consume(1);
          continue;
        }
        bad(off, "data CRC mismatch (stored " + hex32(stored) + ", computed " + hex32(computed) + ")");
        m.consume(need);
        continue;
      }
      record->assign(data, len);
      m.consume(need);
      ++m.records_read;
      return true;
    } catch (const DataLossError& e) {
      // A read error or a corrupt compressed stream: the data ends here.
      if (!skip) throw;
      if (!scanning) {
        ++m.skipped;
        if (m.opt.on_skip) m.opt.on_skip(e.message());
      }
      m.done = true;
      return false;
    }
  }
}

std::vector<std::string> read_tfrecords(const std::string& path, TFRecordReaderOptions options) {
  TFRecordReader r(path, std::move(options));
  std::vector<std::string> out;
  std::string rec;
  while (r.next(&rec)) out.push_back(std::move(rec));
  return out;
}

void write_tfrecords(const std::string& path, const std::vector<std::string>& records, TFRecordWriterOptions options) {
  TFRecordWriter w(path, options);
  for (const auto& r : records) w.write(r);
  w.close();
}

}  // namespace kiln::data
