#include "kiln/data/tfrecord.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kiln/core/crc32c.h"
#include "kiln/core/error.h"

namespace kiln::data {
namespace {

// Records are buffered up to this size, then handed to the OS in one write.
constexpr size_t kFlushBytes = 256 << 10;
constexpr size_t kHeaderBytes = 12;  // u64 length + u32 masked crc of the length
constexpr size_t kFooterBytes = 4;   // u32 masked crc of the data

void store_le32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void store_le64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t load_le32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}
uint64_t load_le64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
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

}  // namespace

// ---- writer ----

TFRecordWriter::TFRecordWriter(const std::string& path, TFRecordWriterOptions options)
    : path_(path), options_(options) {
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
  bytes_ += kHeaderBytes + record.size() + kFooterBytes;
  if (buffer_.size() >= kFlushBytes) flush();
}

void TFRecordWriter::flush() {
  if (fd_ < 0 || buffer_.empty()) return;
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

TFRecordReader::TFRecordReader(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "rbe");
  if (!file_) {
    int e = errno;
    if (e == ENOENT) throw NotFoundError("TFRecord file not found: " + path);
    throw FailedPreconditionError("cannot open TFRecord file " + path + ": " + std::strerror(e));
  }
}

TFRecordReader TFRecordReader::from_string(std::string data, std::string name) {
  TFRecordReader r;
  r.path_ = std::move(name);
  r.memory_ = std::move(data);
  r.from_memory_ = true;
  return r;
}

TFRecordReader::TFRecordReader(TFRecordReader&& o) noexcept
    : path_(std::move(o.path_)),
      file_(o.file_),
      memory_(std::move(o.memory_)),
      from_memory_(o.from_memory_),
      offset_(o.offset_),
      pos_(o.pos_) {
  o.file_ = nullptr;
}

TFRecordReader::~TFRecordReader() {
  if (file_) std::fclose(file_);
}

size_t TFRecordReader::read_some(char* dst, size_t n) {
  if (from_memory_) {
    size_t k = pos_ < memory_.size() ? std::min<uint64_t>(n, memory_.size() - pos_) : 0;
    std::memcpy(dst, memory_.data() + pos_, k);
    pos_ += k;
    return k;
  }
  size_t k = std::fread(dst, 1, n, file_);
  pos_ += k;
  if (k < n && std::ferror(file_))
    throw DataLossError("TFRecord file " + path_ + ": read error at offset " + std::to_string(pos_) + ": " +
                        std::strerror(errno));
  return k;
}

uint64_t TFRecordReader::remaining() {
  uint64_t size;
  if (from_memory_) {
    size = memory_.size();
  } else {
    struct stat st;
    if (::fstat(::fileno(file_), &st) != 0)
      throw DataLossError("TFRecord file " + path_ + ": fstat failed: " + std::strerror(errno));
    size = static_cast<uint64_t>(st.st_size);
  }
  return size > pos_ ? size - pos_ : 0;
}

bool TFRecordReader::next(std::string* record) {
  auto fail = [&](const std::string& why) {
    // Stay at this record: a file still being written may complete it later.
    pos_ = offset_;
    if (!from_memory_) {
      std::clearerr(file_);
      std::fseek(file_, static_cast<long>(offset_), SEEK_SET);
    }
    throw DataLossError("TFRecord file " + path_ + ": record at offset " + std::to_string(offset_) + ": " + why);
  };
  char header[kHeaderBytes];
  size_t got = read_some(header, kHeaderBytes);
  if (got == 0) return false;
  if (got < kHeaderBytes)
    fail("truncated header (" + std::to_string(got) + " of " + std::to_string(kHeaderBytes) + " bytes)");
  uint64_t len = load_le64(header);
  uint32_t stored = load_le32(header + 8), computed = crc32c_mask(crc32c(header, 8));
  if (stored != computed) fail("length CRC mismatch (stored " + hex32(stored) + ", computed " + hex32(computed) + ")");
  // Check against the bytes present before allocating: a corrupt length whose CRC
  // happens to match must not allocate terabytes.
  uint64_t rem = remaining();
  if (len > rem || rem - len < kFooterBytes)
    fail("truncated: the record needs " + std::to_string(len) + " data + " + std::to_string(kFooterBytes) +
         " CRC bytes, " + std::to_string(rem) + " remain");
  record->resize(len);
  if (read_some(record->data(), len) < len) fail("truncated data");
  char footer[kFooterBytes];
  if (read_some(footer, kFooterBytes) < kFooterBytes) fail("truncated data CRC");
  stored = load_le32(footer);
  computed = crc32c_mask(crc32c(record->data(), record->size()));
  if (stored != computed) fail("data CRC mismatch (stored " + hex32(stored) + ", computed " + hex32(computed) + ")");
  offset_ = pos_;
  return true;
}

std::vector<std::string> read_tfrecords(const std::string& path) {
  TFRecordReader r(path);
  std::vector<std::string> out;
  std::string rec;
  while (r.next(&rec)) out.push_back(std::move(rec));
  return out;
}

void write_tfrecords(const std::string& path, const std::vector<std::string>& records) {
  TFRecordWriter w(path, {.atomic = true});
  for (const auto& r : records) w.write(r);
  w.close();
}

}  // namespace kiln::data
