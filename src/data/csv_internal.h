#pragma once
// Internal: the CSV record reader and the per-file element reader behind csv_dataset,
// exposed for tests and fuzz/csv_fuzzer.cc.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "byte_stream.h"
#include "kiln/data/csv.h"

namespace kiln::data::internal {

// Splits a byte stream into CSV records (docs/formats/csv.md).
class CsvRecordReader {
 public:
  // skip_blank: lines with nothing on them are not records (csv_dataset); otherwise
  // they are records of one empty field (parse_csv_line).
  CsvRecordReader(std::unique_ptr<ByteStream> in, char delimiter, bool quoting, bool skip_blank = true);
  // The next record; false at the end. Errors as documented in kiln/data/csv.h.
  bool next();
  size_t size() const { return ends_.size(); }
  std::string_view field(size_t i) const {
    size_t begin = i == 0 ? 0 : ends_[i - 1];
    return std::string_view(buf_).substr(begin, ends_[i] - begin);
  }
  std::vector<std::string> fields() const;
  // 1-based line where the record last returned starts.
  int64_t line() const { return record_line_; }
  const std::string& where() const { return in_->where(); }

 private:
  void end_field() {
    ends_.push_back(buf_.size());
    field_quoted_ = false;
  }
  std::unique_ptr<ByteStream> in_;
  char delimiter_;
  bool quoting_, skip_blank_;
  std::string_view chunk_;
  std::string head_;  // the first bytes, when the first read gave fewer than 3
  size_t pos_ = 0;
  bool first_chunk_ = true;
  std::string buf_;           // the record's fields, back to back
  std::vector<size_t> ends_;  // end offset of each field in buf_
  bool field_quoted_ = false;
  int64_t line_ = 1, record_line_ = 0, quote_line_ = 0;
};

// csv_dataset's options resolved against the first file: what to produce.
struct CsvPlan {
  enum class By { kIndex, kName, kPosition };
  struct Column {
    std::string name;  // output name
    CsvType type = CsvType::kString;
    std::optional<Value> default_value;
    By by = By::kIndex;
    int64_t index = 0;  // kIndex: file column; kPosition: position in `columns`
    std::string header_name;  // kName: the header name to look up
  };
  CsvOptions options;
  std::vector<Column> columns;
  ElementSpec spec;
  Element names;  // an element with the output names (values undefined)
};

// Resolves `options`. `first_record` returns the first record (header) of the first
// file, or nullopt when it has none, and is called only when names or the column
// count must come from it; `first_where` names that file in errors.
std::shared_ptr<const CsvPlan> make_csv_plan(const CsvOptions& options,
                                             const std::function<std::optional<std::vector<std::string>>()>& first_record,
                                             const std::string& first_where);

// The elements of one file.
class CsvFileReader {
 public:
  CsvFileReader(std::shared_ptr<const CsvPlan> plan, std::unique_ptr<ByteStream> in);
  bool next(Element* out);

 private:
  bool start();  // reads the header (or the first record) and resolves the columns
  std::shared_ptr<const CsvPlan> plan_;
  CsvRecordReader records_;
  bool started_ = false, pending_ = false;  // pending_: the first record (no header) is data
  size_t expected_fields_ = 0;
  std::vector<size_t> index_;  // file column of each plan column
};

// The elements of CSV text in memory, as csv_dataset reads a file; `name` stands for
// the file in errors. For tests and fuzzing.
std::vector<Element> read_csv_string(std::string data, const CsvOptions& options, const std::string& name = "<memory>");

}  // namespace kiln::data::internal
