#include "byte_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kiln/core/error.h"

namespace kiln::data::internal {

ByteStream::ByteStream(std::string where, Compression compression, size_t buffer_bytes)
    : where_(std::move(where)), compression_(compression), buffer_bytes_(buffer_bytes < 1 ? 1 : buffer_bytes) {}

std::unique_ptr<ByteStream> ByteStream::open(const std::string& path, const char* kind, Compression compression,
                                             size_t buffer_bytes) {
  std::unique_ptr<ByteStream> s(new ByteStream(std::string(kind) + " '" + path + "'", compression, buffer_bytes));
  s->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s->fd_ < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) throw NotFoundError(s->where_ + " not found");
    throw FailedPreconditionError(s->where_ + ": cannot open: " + std::strerror(err));
  }
  struct stat st{};
  if (::fstat(s->fd_, &st) == 0 && S_ISDIR(st.st_mode)) throw FailedPreconditionError(s->where_ + " is a directory");
  return s;
}

std::unique_ptr<ByteStream> ByteStream::from_string(std::string data, std::string name, const char* kind,
                                                    Compression compression, size_t buffer_bytes) {
  std::unique_ptr<ByteStream> s(new ByteStream(std::string(kind) + " '" + name + "'", compression, buffer_bytes));
  s->memory_ = std::move(data);
  return s;
}

ByteStream::~ByteStream() {
  if (fd_ >= 0) ::close(fd_);
  if (inflating_) inflateEnd(&zs_);
}

void ByteStream::fail(const std::string& why) const { throw DataLossError(where_ + ": " + why); }

size_t ByteStream::raw_read(char* dst, size_t n) {
  if (raw_eof_ || n == 0) return 0;
  if (fd_ < 0) {
    size_t k = std::min(n, memory_.size() - memory_pos_);
    std::memcpy(dst, memory_.data() + memory_pos_, k);
    memory_pos_ += k;
    if (k == 0) raw_eof_ = true;
    return k;
  }
  for (;;) {
    ssize_t k = ::read(fd_, dst, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) fail(std::string("read error: ") + std::strerror(errno));
    if (k == 0) raw_eof_ = true;
    return static_cast<size_t>(k);
  }
}

std::string_view ByteStream::read() {
  if (!started_) {
    started_ = true;
    in_.resize(std::max<size_t>(buffer_bytes_, 2));
    // Read at least two bytes (when there are) to look for the gzip magic.
    in_len_ = 0;
    while (in_len_ < 2) {
      size_t k = raw_read(in_.data() + in_len_, in_.size() - in_len_);
      if (k == 0) break;
      in_len_ += k;
    }
    if (compression_ == Compression::kAuto) {
      bool gz = in_len_ >= 2 && static_cast<unsigned char>(in_[0]) == 0x1f && static_cast<unsigned char>(in_[1]) == 0x8b;
      compression_ = gz ? Compression::kGzip : Compression::kNone;
    }
    if (compression_ != Compression::kNone) {
      if (inflateInit2(&zs_, compression_ == Compression::kGzip ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK)
        throw ResourceExhaustedError(where_ + ": cannot initialise zlib");
      inflating_ = true;
      out_.resize(buffer_bytes_);
      zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
      zs_.avail_in = static_cast<uInt>(in_len_);
      any_input_ = in_len_ > 0;
    }
  }
  if (compression_ == Compression::kNone) {
    if (in_pos_ < in_len_) {
      std::string_view v(in_.data() + in_pos_, in_len_ - in_pos_);
      in_pos_ = in_len_;
      return v;
    }
    in_pos_ = 0;
    in_len_ = raw_read(in_.data(), in_.size());
    in_pos_ = in_len_;
    return std::string_view(in_.data(), in_len_);
  }
  const char* kind = compression_ == Compression::kGzip ? "gzip" : "zlib";
  for (;;) {
    if (zs_.avail_in == 0 && !raw_eof_) {
      size_t k = raw_read(in_.data(), in_.size());
      zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
      zs_.avail_in = static_cast<uInt>(k);
      if (k > 0) any_input_ = true;
    }
    if (!any_input_) return {};  // an empty file: empty content
    if (stream_end_) {
      if (zs_.avail_in == 0) {
        if (raw_eof_) return {};
        continue;
      }
      if (compression_ == Compression::kZlib)
        fail("trailing bytes after the zlib stream at compressed offset " + std::to_string(raw_consumed_));
      inflateReset(&zs_);  // another gzip member
      stream_end_ = false;
    }
    if (zs_.avail_in == 0 && raw_eof_)
      fail(std::string("truncated ") + kind + " stream (ends at compressed offset " + std::to_string(raw_consumed_) +
           ")");
    zs_.next_out = reinterpret_cast<Bytef*>(out_.data());
    zs_.avail_out = static_cast<uInt>(out_.size());
    uInt before = zs_.avail_in;
    int rc = inflate(&zs_, Z_NO_FLUSH);
    raw_consumed_ += before - zs_.avail_in;
    size_t produced = out_.size() - zs_.avail_out;
    if (rc == Z_STREAM_END) {
      stream_end_ = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      fail(std::string("corrupt ") + kind + " stream at compressed offset " + std::to_string(raw_consumed_) + ": " +
           (zs_.msg ? zs_.msg : "inflate error " + std::to_string(rc)));
    }
    if (produced > 0) return std::string_view(out_.data(), produced);
  }
}

}  // namespace kiln::data::internal
