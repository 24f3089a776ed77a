#pragma once
// Whole-file reads, memory-mapped reads and atomic writes (temp name, fsync, rename),
// with typed errors.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

// Throws NotFoundError when the file does not exist, DataLossError on read errors.
std::string read_file(const std::string& path);
// Writes to "<path>.tmp.<pid>", fsyncs, renames over `path`, fsyncs the directory.
// On failure the old file is untouched and the temp file removed; throws
// FailedPreconditionError / DataLossError.
void write_file_atomic(const std::string& path, std::string_view contents);

// A whole file mapped into memory, read-only (writing through data() crashes). Pages
// are pre-faulted (MAP_POPULATE), so the first reads do not fault one page at a time.
// The file must not be truncated while mapped (readers would get SIGBUS): kiln's
// writers replace files by renaming, which leaves existing mappings intact. An empty file maps to an empty view. Tensors can
// borrow its bytes (Storage's borrowing constructor, with the MappedFile as owner).
// Thread-safety: immutable after open; concurrent reads are safe.
class MappedFile {
 public:
  // Throws NotFoundError when the file does not exist, DataLossError when it cannot be
  // read or mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  char* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace kiln
