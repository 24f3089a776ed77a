#pragma once
// Internal: the bytes of one file (or string), read in chunks and optionally
// decompressed, for the streaming text sources (text lines, CSV). Never holds more than
// two buffers of `buffer_bytes` whatever the file size.
#include <zlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/data/tfrecord.h"  // Compression

namespace kiln::data::internal {

class ByteStream {
 public:
  // Opens `path`. `kind` names the file in errors ("text file", "CSV file"):
  // NotFoundError when it does not exist, FailedPreconditionError when it cannot be
  // opened or is a directory.
  // Compression: kNone; kGzip (concatenated members too); kZlib; kAuto: gzip when the
  // content starts with the gzip magic 1f 8b, else uncompressed (a zlib header is not
  // sniffed: "x^" and other plain text can start with one).
  static std::unique_ptr<ByteStream> open(const std::string& path, const char* kind, Compression compression,
                                          size_t buffer_bytes = 256 << 10);
  // The same over bytes in memory; `name` stands for the file in errors.
  static std::unique_ptr<ByteStream> from_string(std::string data, std::string name, const char* kind,
                                                 Compression compression, size_t buffer_bytes = 256 << 10);
  ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // The next bytes of the (decompressed) content, valid until the next call; empty at
  // the end. Throws DataLossError naming the file on a read error or a corrupt or
  // truncated compressed stream (with the compressed offset). An empty compressed
  // file reads as empty content.
  std::string_view read();
  // "<kind> '<path>'" for error messages.
  const std::string& where() const { return where_; }

 private:
  ByteStream(std::string where, Compression compression, size_t buffer_bytes);
  size_t raw_read(char* dst, size_t n);  // 0 at the end
  [[noreturn]] void fail(const std::string& why) const;

  std::string where_;
  Compression compression_;
  size_t buffer_bytes_;
  int fd_ = -1;
  std::string memory_;  // from_string: the data
  size_t memory_pos_ = 0;
  bool raw_eof_ = false;
  bool started_ = false;  // the first raw bytes were looked at (compression detected)
  std::string in_, out_;
  size_t in_pos_ = 0, in_len_ = 0;  // uncompressed: pending bytes of in_
  uint64_t raw_consumed_ = 0;       // compressed bytes handed to inflate
  z_stream zs_{};
  bool inflating_ = false;  // inflateInit2 done
  bool stream_end_ = false;
  bool any_input_ = false;
};

}  // namespace kiln::data::internal
