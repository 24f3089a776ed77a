// Fuzzes the CSV reader (kiln/data/csv.h, docs/formats/csv.md): any input must yield
// elements or throw kiln::Error, never crash. Reading through a 7-byte buffer, and
// reading the data gzip-compressed, must give exactly the same elements or the same
// error message as reading it in one buffer.
//
// Byte 0 of the input picks the configuration, the rest is the CSV text:
//   bits 0-1  delimiter: ',' ';' '\t' '|'
//   bit 2     header
//   bit 3     quoting
//   bits 4-5  columns: none given (all, as strings); typed by index (f32, i64 with a
//             default, string, i32); by header name "a" (f64) and position; one i64
//             column without a default
//   bit 6     na_value "NA" (else "")
// Seeds: fuzz/corpus/csv.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/csv_internal.h"
#include "kiln/core/error.h"
#include "kiln/data/csv.h"
#include "../tests/zlib_ref.h"  // the reference compressor

using kiln::testing::deflate_ref;

namespace {

using namespace kiln::data;  // NOLINT

// Elements (names, types and values) or the error, as text.
std::string read(const std::string& data, const CsvOptions& opt) {
  std::string out;
  try {
    for (const Element& e : internal::read_csv_string(data, opt, "fuzz")) {
      if (!e.named() || e.size() == 0) __builtin_trap();
      for (size_t i = 0; i < e.size(); ++i) {
        const Value& v = e[i];
        if (v.rank() != 0) __builtin_trap();
        out += e.names()[i] + "=" + v.type_name() + ":";
        if (v.is_string()) {
          out += v.strings().item();
        } else {
          const kiln::Tensor& t = v.tensor();
          double d = t.get_double(0);
          out += d == d ? std::to_string(d) : "nan";
        }
        out += '\x1f';
      }
      out += '\x1e';
    }
  } catch (const kiln::Error& err) {
    out += "error: " + std::string(err.what());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size == 0) return 0;
  const unsigned mode = bytes[0];
  const std::string data(reinterpret_cast<const char*>(bytes) + 1, size - 1);
  static const char kDelims[] = {',', ';', '\t', '|'};
  CsvOptions opt;
  opt.delimiter = kDelims[mode & 3];
  opt.header = (mode & 4) != 0;
  opt.quoting = (mode & 8) != 0;
  if (mode & 64) opt.na_value = "NA";
  switch ((mode >> 4) & 3) {
    case 0: break;
    case 1:
      opt.columns = {{"x", CsvType::kF32, {}, 0}, {"y", CsvType::kI64, "-1", 1}, {"s", CsvType::kString, "", 2},
                     {"z", CsvType::kI32, "7", 3}};
      break;
    case 2: opt.columns = {{"a", CsvType::kF64, "0.5"}, {"", CsvType::kString, ""}}; break;
    case 3: opt.columns = {{"n", CsvType::kI64}}; break;
  }
  const std::string want = read(data, opt);
  CsvOptions small = opt;
  small.buffer_bytes = 7;
  if (read(data, small) != want) __builtin_trap();
  CsvOptions gz = small;
  gz.compression = Compression::kGzip;
  if (read(deflate_ref(data, true, 1), gz) != want) __builtin_trap();

  try {
    std::vector<std::string> fields = parse_csv_line(data, opt.delimiter, opt.quoting);
    if (fields.empty()) __builtin_trap();
  } catch (const kiln::Error&) {
  }
  return 0;
}
