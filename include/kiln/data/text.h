#pragma once
// Text files as a dataset of lines (tf.data.TextLineDataset).
//
//   auto lines = text_line_dataset({"a.txt", "b.txt.gz"}, {.compression = Compression::kAuto});
//   for (const Element& e : lines.iterator()) use(e[0].strings().item());
//
// Each element is a tuple of one string scalar: a line without its line ending ("\n"
// or "\r\n"; a lone "\r" inside a line is kept). A last line without a final "\n" is a
// line; a final "\n" does not start an empty one. Empty lines are elements (""). Bytes
// are passed through as they are (no UTF-8 check, no BOM stripping).
//
// Files are read in order, one at a time and streaming: memory holds the read buffers
// and the current line, never a whole file.
//
// Errors (all name the file): text_line_dataset() itself throws NotFoundError for a
// file that does not exist (fail fast, like Dataset::list_files) and
// InvalidArgumentError for bad options. A pass opens each file when it reaches it, so
// a file removed in between is a NotFoundError from Iterator::next(), as are
// DataLossError for a read error or a corrupt or truncated compressed stream.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/tfrecord.h"  // Compression

namespace kiln::data {

struct TextLineOptions {
  // Lines dropped at the start of every file (headers).
  int64_t skip_header_lines = 0;
  // kNone; kGzip (concatenated members too); kZlib; kAuto: gzip when a file starts with
  // the gzip magic 1f 8b, else uncompressed (decided per file).
  Compression compression = Compression::kNone;
  // Bytes read (and decompressed) at a time.
  size_t buffer_bytes = 256 << 10;
};

// Elements: (string[]) lines, file by file. Cardinality unknown.
Dataset text_line_dataset(std::vector<std::string> files, TextLineOptions options = {});

// The lines of one file, outside a pipeline. Not thread-safe.
class TextLineReader {
 public:
  // Opens `path`: NotFoundError when it does not exist, FailedPreconditionError when it
  // cannot be read. Skips nothing (options.skip_header_lines is the dataset's).
  explicit TextLineReader(const std::string& path, const TextLineOptions& options = {});
  // Reads lines from memory; `name` stands for the file in error messages.
  static TextLineReader from_string(std::string data, std::string name = "<memory>",
                                    const TextLineOptions& options = {});
  ~TextLineReader();
  TextLineReader(TextLineReader&&) noexcept;
  TextLineReader& operator=(TextLineReader&&) noexcept;

  // The next line into *line (its capacity reused); false at the end. DataLossError
  // naming the file (see above).
  bool next(std::string* line);
  // 1-based number of the line last returned (0 before the first).
  int64_t line_number() const { return line_number_; }

 private:
  struct Impl;
  explicit TextLineReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int64_t line_number_ = 0;
};

}  // namespace kiln::data
