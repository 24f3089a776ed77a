// Fuzzes the TFRecord reader: any input must yield records or throw kiln::Error,
// never crash; every record read must re-frame to exactly the bytes it came from.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/core/crc32c.h"
#include "kiln/core/error.h"
#include "kiln/data/tfrecord.h"

namespace {

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  auto reader = kiln::data::TFRecordReader::from_string(input, "fuzz");
  std::string rec;
  try {
    for (;;) {
      uint64_t start = reader.offset();
      if (!reader.next(&rec)) break;
      if (reader.offset() != start + 16 + rec.size() || input.compare(start, 16 + rec.size(), frame(rec)) != 0)
        __builtin_trap();
    }
    if (reader.offset() != size) __builtin_trap();  // a clean end consumed everything
  } catch (const kiln::Error&) {
  }
  return 0;
}
