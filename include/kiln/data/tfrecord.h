#pragma once
// TFRecord files: a sequence of records, each framed as
//   u64 length (little-endian) | u32 masked CRC-32C of those 8 bytes |
//   length bytes of data       | u32 masked CRC-32C of the data
// (TensorFlow's format, read by tf.data and TensorBoard). Spec: docs/formats/tfrecord.md.
//
// Thread-safety: none; one writer or reader per thread.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

struct TFRecordWriterOptions {
  // Write to "<path>.tmp.<pid>" and rename over `path` on close(), so that readers see
  // the whole file or none of it (data sets, exports). Without it records go straight
  // to `path` (event files, which readers follow while they grow).
  bool atomic = false;
  // Fail with FailedPreconditionError if `path` exists instead of truncating it.
  bool exclusive = false;
};

class TFRecordWriter {
 public:
  // Creates (truncates) the file; throws FailedPreconditionError if it cannot.
  explicit TFRecordWriter(const std::string& path, TFRecordWriterOptions options = {});
  // Closes the file; errors are swallowed (call close() to see them). An atomic
  // writer that was not closed removes its temp file and leaves `path` untouched.
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  // Appends one record (any bytes, empty allowed). Records are buffered; only whole
  // records ever reach the file. Throws DataLossError on a write error,
  // FailedPreconditionError after close().
  void write(std::string_view record);
  // Hands buffered records to the OS.
  void flush();
  // flush() + fsync: the records survive a machine crash.
  void sync();
  // Flushes, fsyncs and closes (atomic: renames over `path`). Idempotent.
  void close();

  const std::string& path() const { return path_; }
  uint64_t records_written() const { return records_; }
  uint64_t bytes_written() const { return bytes_; }  // framed bytes, buffered ones included

 private:
  void write_out(const char* p, size_t n);
  std::string path_;
  std::string file_path_;  // the temp name when atomic
  TFRecordWriterOptions options_;
  int fd_ = -1;
  std::string buffer_;
  uint64_t records_ = 0;
  uint64_t bytes_ = 0;
};

class TFRecordReader {
 public:
  // Opens a file; throws NotFoundError if it does not exist.
  explicit TFRecordReader(const std::string& path);
  // Reads records from memory; `name` stands for the file in error messages.
  static TFRecordReader from_string(std::string data, std::string name = "<memory>");
  ~TFRecordReader();
  TFRecordReader(TFRecordReader&& o) noexcept;
  TFRecordReader& operator=(TFRecordReader&&) = delete;
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;

  // Reads the next record into *record. Returns false at a clean end of the data.
  // Throws DataLossError naming the file and the record's byte offset for a
  // truncated record, a length or data CRC mismatch, or a read error; the reader
  // then stays at that record (a file still being written can be retried).
  bool next(std::string* record);
  // Byte offset of the next record.
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

 private:
  TFRecordReader() = default;
  size_t read_some(char* dst, size_t n);  // up to n bytes; fewer only at the end
  uint64_t remaining();                    // bytes left after offset_ (file: current size)
  std::string path_;
  std::FILE* file_ = nullptr;
  std::string memory_;
  bool from_memory_ = false;
  uint64_t offset_ = 0;  // start of the next record
  uint64_t pos_ = 0;     // read cursor
};

// Every record of a file (a convenience over TFRecordReader).
std::vector<std::string> read_tfrecords(const std::string& path);
// Writes `records` atomically to `path`.
void write_tfrecords(const std::string& path, const std::vector<std::string>& records);

}  // namespace kiln::data
