#pragma once
// CSV files as a dataset of records (tf.data.experimental.CsvDataset, or
// make_csv_dataset without batching and type inference). The dialect (RFC 4180 with
// a few allowances) is docs/formats/csv.md.
//
//   auto ds = csv_dataset({"train.csv"}, {.columns = {{"sepal_length", CsvType::kF32},
//                                                      {"species", CsvType::kI64}}});
//   for (const Element& e : ds.iterator()) e.tensor("sepal_length").item<float>();
//
// Each element is a named tuple of scalars, one per selected column, in the order of
// `columns`: f32/f64/i32/i64 tensors or string scalars.
//
// Files are read in order, one at a time and streaming: memory holds the read buffers
// and the current record, never a whole file.
//
// Errors: csv_dataset() itself throws NotFoundError for a missing file,
// InvalidArgumentError for bad options (a default that does not parse as its column's
// type, duplicate names, a delimiter that cannot work), and reads the header of the
// first file when it needs names from it (or to check that named columns exist).
// A pass then throws from Iterator::next(), always naming the file and the line where
// the record starts (1-based, counting the header and every newline, those inside
// quotes too):
//   InvalidArgumentError  a field that does not parse as its column's type (naming the
//                         column and quoting the text), a missing value in a column
//                         without a default, a record whose number of fields differs
//                         from the file's first record (the header), a named column
//                         missing from a file's header, a character after a closing
//                         quote other than the delimiter or a line end.
//   DataLossError         a quote still open at the end of the file, a read error, a
//                         corrupt or truncated compressed stream.
//   NotFoundError         a file removed after csv_dataset() checked it.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/tfrecord.h"  // Compression

namespace kiln::data {

enum class CsvType { kF32, kF64, kI32, kI64, kString };
const char* csv_type_name(CsvType t);  // "f32", ..., "string"

struct CsvColumn {
  // The output name. With a header and no index it also selects the column of that
  // name in each file's header. Empty: the header's name for the selected column, or
  // "column<i>" (i: 0-based index in the file) without a header.
  std::string name;
  CsvType type = CsvType::kString;
  // Used for a missing value: an empty field or one equal to CsvOptions::na_value
  // (for numbers also one of only spaces/tabs). Without a default, a missing value is
  // an InvalidArgumentError. Parsed as `type` when the dataset is built.
  std::optional<std::string> default_value = std::nullopt;
  // >= 0: selects the file's column at this 0-based index. -1: by name (with a header
  // and a name) or else by position (the i-th column given selects the file's i-th).
  int64_t index = -1;
};

struct CsvOptions {
  // The columns to produce. Empty: every column of the first file's first record (its
  // header, or "column<i>" names without one), as strings that default to "".
  std::vector<CsvColumn> columns;
  // The first record of every file names the columns and is not data.
  bool header = true;
  char delimiter = ',';
  // RFC 4180 quotes: a field that starts with '"' runs to the next lone '"', taking
  // delimiters, newlines and doubled quotes ("") as text. false: '"' is an ordinary
  // character.
  bool quoting = true;
  // A field equal to this (quoted or not) is missing; empty fields always are.
  std::string na_value = "";
  // As for text_line_dataset: kNone, kGzip, kZlib, kAuto (gzip magic, per file).
  Compression compression = Compression::kNone;
  size_t buffer_bytes = 256 << 10;
};

// Elements: {name: scalar, ...}. Cardinality unknown.
Dataset csv_dataset(std::vector<std::string> files, CsvOptions options = {});

// The fields of one CSV record given as text (a line, or several when quoted fields
// hold newlines), with the dialect above; a trailing "\n" or "\r\n" is ignored.
// InvalidArgumentError for a quote left open or text after a closing quote. An empty
// line gives one empty field.
std::vector<std::string> parse_csv_line(std::string_view line, char delimiter = ',', bool quoting = true);

}  // namespace kiln::data
