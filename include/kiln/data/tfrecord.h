#pragma once
// TFRecord files: a sequence of records, each framed as
//   u64 length (little-endian) | u32 masked CRC-32C of those 8 bytes |
//   length bytes of data       | u32 masked CRC-32C of the data
// (TensorFlow's format, read by tf.data and TensorBoard), optionally as one gzip or zlib
// stream over the whole framed file (TF's compression_type "GZIP" / "ZLIB").
// Spec: docs/formats/tfrecord.md.
//
// Thread-safety: none; one writer or reader per thread.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

enum class Compression {
  kNone,  // TF's ""
  kGzip,  // TF's "GZIP": one gzip stream (concatenated gzip members are read too)
  kZlib,  // TF's "ZLIB": one zlib (RFC 1950) stream
  kAuto,  // readers only: detect from the first bytes (see docs/formats/tfrecord.md)
};
// "", "none", "gzip", "zlib", "auto" in any case; InvalidArgumentError otherwise.
Compression parse_compression(std::string_view name);
const char* compression_name(Compression c);  // "none", "gzip", "zlib", "auto"

struct TFRecordWriterOptions {
  // Write to "<path>.tmp.<pid>" and rename over `path` on close(), so that readers see
  // the whole file or none of it (data sets, exports). Without it records go straight
  // to `path` (event files, which readers follow while they grow).
  bool atomic = false;
  // Fail with FailedPreconditionError if `path` exists instead of truncating it.
  bool exclusive = false;
  // kAuto is an InvalidArgumentError.
  Compression compression = Compression::kNone;
  // zlib level: 0 (store) .. 9 (smallest); -1 is zlib's default (6), as in TF.
  int compression_level = -1;
};

class TFRecordWriter {
 public:
  // Creates (truncates) the file; throws FailedPreconditionError if it cannot,
  // InvalidArgumentError for bad options.
  explicit TFRecordWriter(const std::string& path, TFRecordWriterOptions options = {});
  // Closes the file; errors are swallowed (call close() to see them). An atomic
  // writer that was not closed removes its temp file and leaves `path` untouched.
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  // Appends one record (any bytes, empty allowed). Records are buffered; uncompressed,
  // only whole records ever reach the file. Throws DataLossError on a write error,
  // FailedPreconditionError after close().
  void write(std::string_view record);
  // Hands buffered records to the OS (compressed: as a zlib sync flush, so that a
  // reader of the growing file can decompress every record written so far).
  void flush();
  // flush() + fsync: the records survive a machine crash.
  void sync();
  // Flushes, ends the compressed stream, fsyncs and closes (atomic: renames over
  // `path`). Idempotent.
  void close();

  const std::string& path() const { return path_; }
  uint64_t records_written() const { return records_; }
  // Framed bytes (before compression), buffered ones included.
  uint64_t bytes_written() const { return bytes_; }

 private:
  struct Deflater;
  void write_out(const char* p, size_t n);
  void deflate_buffer(int flush_mode);
  std::string path_;
  std::string file_path_;  // the temp name when atomic
  TFRecordWriterOptions options_;
  int fd_ = -1;
  std::string buffer_;
  std::unique_ptr<Deflater> deflater_;  // when compressed
  uint64_t records_ = 0;
  uint64_t bytes_ = 0;
};

struct TFRecordReaderOptions {
  Compression compression = Compression::kNone;
  // false: a corrupt or truncated record throws DataLossError. true: a record whose
  // data CRC does not match is skipped; after a length CRC mismatch the reader scans
  // forward byte by byte to the next position that holds a whole valid record (length
  // and data CRCs both match) and resumes there; a truncated tail, or a corrupt or
  // truncated compressed stream, ends the file. Each of these counts once in
  // records_skipped() (a corrupt length may hide several records: they count as one).
  bool skip_corrupt = false;
  // Called with a description (file, offset, reason) of each skip.
  std::function<void(const std::string&)> on_skip = nullptr;
  // Bytes read from the file per read(2) (and decompressed per chunk).
  size_t buffer_bytes = 256 << 10;
};

class TFRecordReader {
 public:
  // Opens a file; throws NotFoundError if it does not exist.
  explicit TFRecordReader(const std::string& path, TFRecordReaderOptions options = {});
  // Reads records from memory; `name` stands for the file in error messages.
  static TFRecordReader from_string(std::string data, std::string name = "<memory>",
                                    TFRecordReaderOptions options = {});
  ~TFRecordReader();
  TFRecordReader(TFRecordReader&& o) noexcept;
  TFRecordReader& operator=(TFRecordReader&& o) noexcept;
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;

  // Reads the next record into *record (reusing its capacity). Returns false at a
  // clean end of the data. Without skip_corrupt, throws DataLossError naming the file
  // and the record's byte offset (compressed: in the decompressed stream) for a
  // truncated record, a length or data CRC mismatch, a corrupt or truncated compressed
  // stream, or a read error; the reader then stays at that record (a file still being
  // written can be retried), except after a corrupt compressed stream, which stays
  // broken. Reads go through a buffer of options.buffer_bytes: no syscall per record.
  bool next(std::string* record);
  // Byte offset of the next record (compressed: in the decompressed stream).
  uint64_t offset() const;
  uint64_t records_read() const;
  // Corrupt records or regions skipped (skip_corrupt).
  uint64_t records_skipped() const;
  // The compression in use; kAuto until the first bytes have been seen.
  Compression compression() const;
  const std::string& path() const;

 private:
  struct Impl;
  TFRecordReader() = default;
  std::unique_ptr<Impl> impl_;
};

// Every record of a file (a convenience over TFRecordReader).
std::vector<std::string> read_tfrecords(const std::string& path, TFRecordReaderOptions options = {});
// Writes `records` to `path` (atomically unless options say otherwise).
void write_tfrecords(const std::string& path, const std::vector<std::string>& records,
                     TFRecordWriterOptions options = {.atomic = true});

}  // namespace kiln::data
