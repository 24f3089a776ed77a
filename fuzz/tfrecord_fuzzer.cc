// Fuzzes the TFRecord reader: any input must yield records or throw kiln::Error,
// never crash; every record read must re-frame to exactly the bytes it came from.
//
// Byte 0 of the input picks how the rest (the data) is read:
//   bits 0-2 (mode % 6): 0 uncompressed, 1 gzip, 2 zlib, 3 auto-detect: the data as is;
//     4 gzip, 5 zlib: the fuzzer compresses the data itself (gzip: split into two
//     members), reads it back compressed and checks that the result (records, error
//     or not, offset, records skipped) is exactly that of reading the data uncompressed
//   bit 3: skip_corrupt
//   bit 4: a 64-byte buffer (refills, growth, compaction) instead of the default
// Seeds: fuzz/corpus/tfrecord.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/crc32c.h"
#include "kiln/core/error.h"
#include "kiln/data/tfrecord.h"
#include "../tests/zlib_ref.h"  // the reference compressor

using kiln::testing::deflate_ref;

namespace {

using kiln::data::Compression;
using kiln::data::TFRecordReader;
using kiln::data::TFRecordReaderOptions;

void put_le(std::string* s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}

std::string frame(const std::string& rec) {
  std::string f;
  put_le(&f, rec.size(), 8);
  put_le(&f, kiln::crc32c_mask(kiln::crc32c(f.data(), 8)), 4);
  f += rec;
  put_le(&f, kiln::crc32c_mask(kiln::crc32c(rec.data(), rec.size())), 4);
  return f;
}

struct Result {
  std::vector<std::string> records;
  bool threw = false;
  uint64_t offset = 0, skipped = 0;
  bool operator==(const Result&) const = default;
};

// Reads everything; `plain` (when known) is the decompressed stream, which every
// record must re-frame into at the offset where it ends.
Result read(const std::string& data, TFRecordReaderOptions opt, const std::string* plain) {
  Result res;
  auto reader = TFRecordReader::from_string(data, "fuzz", opt);
  std::string rec;
  try {
    for (;;) {
      uint64_t start = reader.offset();
      if (!reader.next(&rec)) break;
      uint64_t end = reader.offset();
      if (end < 16 + rec.size() || end - 16 - rec.size() < start) __builtin_trap();
      if (!opt.skip_corrupt && end != start + 16 + rec.size()) __builtin_trap();
      if (plain && plain->compare(end - 16 - rec.size(), 16 + rec.size(), frame(rec)) != 0) __builtin_trap();
      res.records.push_back(rec);
    }
    // A clean end without skipping consumed everything.
    if (plain && !opt.skip_corrupt && reader.offset() != plain->size()) __builtin_trap();
  } catch (const kiln::Error&) {
    if (opt.skip_corrupt) __builtin_trap();  // skip_corrupt ends instead of throwing
    res.threw = true;
  }
  res.offset = reader.offset();
  res.skipped = reader.records_skipped();
  if (!opt.skip_corrupt && res.skipped != 0) __builtin_trap();
  return res;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size == 0) return 0;
  const unsigned mode = bytes[0];
  std::string data(reinterpret_cast<const char*>(bytes) + 1, size - 1);
  TFRecordReaderOptions opt;
  opt.skip_corrupt = (mode & 8) != 0;
  if (mode & 16) opt.buffer_bytes = 64;
  switch (mode % 8 % 6) {
    case 0:
      read(data, opt, &data);
      break;
    case 1:
      opt.compression = Compression::kGzip;
      read(data, opt, nullptr);
      break;
    case 2:
      opt.compression = Compression::kZlib;
      read(data, opt, nullptr);
      break;
    case 3:
      opt.compression = Compression::kAuto;
      read(data, opt, nullptr);
      break;
    default: {
      bool gzip = mode % 8 % 6 == 4;
      // gzip: two concatenated members (readers must continue across them).
      std::string z = gzip ? deflate_ref(data.substr(0, data.size() / 2), true, 1) +
                                 deflate_ref(data.substr(data.size() / 2), true, 1)
                           : deflate_ref(data, false, 1);
      TFRecordReaderOptions plain_opt;
      plain_opt.skip_corrupt = opt.skip_corrupt;
      Result want = read(data, plain_opt, &data);
      opt.compression = gzip ? Compression::kGzip : Compression::kZlib;
      if (!(read(z, opt, &data) == want)) __builtin_trap();
      opt.compression = Compression::kAuto;
      if (!(read(z, opt, &data) == want)) __builtin_trap();
    }
  }
  return 0;
}
