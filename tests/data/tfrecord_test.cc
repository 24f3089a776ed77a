#include "kiln/data/tfrecord.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/core/file_io.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using kiln::testing::TempDir;
using kiln::testing::write_bytes;

namespace fs = std::filesystem;

// CRC-32C bit by bit (reflected polynomial 0x82F63B78): a reference independent of
// kiln's table-driven one.
uint32_t crc32c_ref(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}
uint32_t mask_ref(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
std::string le(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}
// One record framed by hand from the spec.
std::string frame_ref(const std::string& data) {
  std::string len = le(data.size(), 8);
  return len + le(mask_ref(crc32c_ref(len)), 4) + data + le(mask_ref(crc32c_ref(data)), 4);
}

std::vector<std::string> sample_records() {
  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  std::string big(300 << 10, 'x');  // larger than the writer's buffer
  for (size_t i = 0; i < big.size(); i += 97) big[i] = static_cast<char>(i);
  return {"hello", "", binary, big, "tail"};
}

TEST(TFRecord, FramingMatchesSpecByteForByte) {
  TempDir dir("tfrecord");
  {
    TFRecordWriter w(dir.file("a.tfrecord"));
    w.write("123456789");
    w.write("");
  }
  std::string got = read_file(dir.file("a.tfrecord"));
  EXPECT_EQ(got, frame_ref("123456789") + frame_ref(""));
  // RFC 3720's check value for "123456789" is 0xe3069283; masked by hand: 0xc78ab0e5.
  EXPECT_EQ(got.substr(12 + 9, 4), le(0xc78ab0e5u, 4));
}

TEST(TFRecord, RoundTrip) {
  TempDir dir("tfrecord");
  std::vector<std::string> recs = sample_records();
  uint64_t framed = 0;
  {
    TFRecordWriter w(dir.file("r.tfrecord"));
    for (const auto& r : recs) {
      w.write(r);
      framed += 16 + r.size();
    }
    EXPECT_EQ(w.records_written(), recs.size());
    EXPECT_EQ(w.bytes_written(), framed);
    w.close();
    w.close();  // idempotent
  }
  EXPECT_EQ(fs::file_size(dir.file("r.tfrecord")), framed);
  TFRecordReader r(dir.file("r.tfrecord"));
  std::string rec;
  uint64_t expect_offset = 0;
  for (const auto& want : recs) {
    EXPECT_EQ(r.offset(), expect_offset);
    ASSERT_TRUE(r.next(&rec));
    EXPECT_EQ(rec, want);
    expect_offset += 16 + want.size();
  }
  EXPECT_FALSE(r.next(&rec));
  EXPECT_FALSE(r.next(&rec));
  EXPECT_EQ(read_tfrecords(dir.file("r.tfrecord")), recs);
}

TEST(TFRecord, EmptyRecordAndEmptyFile) {
  TempDir dir("tfrecord");
  write_tfrecords(dir.file("one_empty"), {""});
  EXPECT_EQ(fs::file_size(dir.file("one_empty")), 16u);
  EXPECT_EQ(read_tfrecords(dir.file("one_empty")), std::vector<std::string>{""});
  write_tfrecords(dir.file("none"), {});
  EXPECT_EQ(fs::file_size(dir.file("none")), 0u);
  EXPECT_TRUE(read_tfrecords(dir.file("none")).empty());
}

TEST(TFRecord, FromString) {
  TFRecordReader r = TFRecordReader::from_string(frame_ref("abc") + frame_ref("de"), "mem");
  std::string rec;
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec, "abc");
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec, "de");
  EXPECT_FALSE(r.next(&rec));
  TFRecordReader bad = TFRecordReader::from_string(frame_ref("abc").substr(0, 14), "mem");
  EXPECT_KILN_ERROR(bad.next(&rec), kDataLoss, "mem: record at offset 0");
}

TEST(TFRecord, CorruptedLengthCrc) {
  TempDir dir("tfrecord");
  std::string f = frame_ref("first") + frame_ref("second");
  size_t second = 16 + 5;
  f[second + 9] ^= 0x01;  // inside the length CRC of the second record
  write_bytes(dir.file("c"), f);
  TFRecordReader r(dir.file("c"));
  std::string rec;
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec, "first");
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "length CRC mismatch");
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "record at offset 21");
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, dir.file("c"));
  // A flipped length byte is caught by the same CRC.
  std::string g = frame_ref("first");
  g[0] ^= 0x04;
  write_bytes(dir.file("l"), g);
  EXPECT_KILN_ERROR(read_tfrecords(dir.file("l")), kDataLoss, "length CRC mismatch");
}

TEST(TFRecord, CorruptedDataCrc) {
  TempDir dir("tfrecord");
  std::string f = frame_ref("first") + frame_ref("second");
  f[16 + 5 + 12 + 2] ^= 0x20;  // a data byte of the second record
  write_bytes(dir.file("d"), f);
  TFRecordReader r(dir.file("d"));
  std::string rec;
  ASSERT_TRUE(r.next(&rec));
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "data CRC mismatch");
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "offset 21");
  std::string g = frame_ref("x");
  g.back() ^= 0x01;  // the stored data CRC itself
  write_bytes(dir.file("e"), g);
  EXPECT_KILN_ERROR(read_tfrecords(dir.file("e")), kDataLoss, "data CRC mismatch");
}

TEST(TFRecord, Truncated) {
  TempDir dir("tfrecord");
  std::string one = frame_ref("abcdef");  // 22 bytes
  struct Case {
    size_t keep;
    const char* msg;
  };
  for (Case c : {Case{5, "truncated header (5 of 12 bytes)"}, Case{12, "truncated"}, Case{15, "truncated"},
                 Case{18, "truncated"}, Case{21, "truncated"}}) {
    write_bytes(dir.file("t"), one + one.substr(0, c.keep));
    TFRecordReader r(dir.file("t"));
    std::string rec;
    ASSERT_TRUE(r.next(&rec));
    EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, c.msg);
    EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "record at offset 22");
  }
}

TEST(TFRecord, HugeLengthWithValidCrcIsTruncationNotAllocation) {
  std::string len = le(uint64_t{1} << 60, 8);
  std::string f = len + le(mask_ref(crc32c_ref(len)), 4) + "abc";
  TFRecordReader r = TFRecordReader::from_string(f, "huge");
  std::string rec;
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "needs 1152921504606846976 data");
}

TEST(TFRecord, ReaderRetriesARecordThatWasStillBeingWritten) {
  TempDir dir("tfrecord");
  std::string f = frame_ref("first") + frame_ref("second");
  write_bytes(dir.file("live"), f.substr(0, 30));
  TFRecordReader r(dir.file("live"));
  std::string rec;
  ASSERT_TRUE(r.next(&rec));
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "truncated");
  write_bytes(dir.file("live"), f);  // the writer finished the record
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec, "second");
  EXPECT_FALSE(r.next(&rec));
}

TEST(TFRecord, FlushMakesRecordsVisible) {
  TempDir dir("tfrecord");
  TFRecordWriter w(dir.file("f"));
  w.write("a");
  EXPECT_EQ(fs::file_size(dir.file("f")), 0u);  // still buffered
  w.flush();
  EXPECT_EQ(read_tfrecords(dir.file("f")), std::vector<std::string>{"a"});
  w.write("b");
  w.sync();
  EXPECT_EQ(read_tfrecords(dir.file("f")), (std::vector<std::string>{"a", "b"}));
}

TEST(TFRecord, AtomicWriterPublishesOnlyOnClose) {
  TempDir dir("tfrecord");
  std::string p = dir.file("atomic");
  write_tfrecords(p, {"old"});
  {
    TFRecordWriter w(p, {.atomic = true});
    w.write("new");
    w.flush();
    EXPECT_EQ(read_tfrecords(p), std::vector<std::string>{"old"});
    // Destroyed without close(): abandoned.
  }
  EXPECT_EQ(read_tfrecords(p), std::vector<std::string>{"old"});
  {
    TFRecordWriter w(p, {.atomic = true});
    w.write("new");
    w.close();
  }
  EXPECT_EQ(read_tfrecords(p), std::vector<std::string>{"new"});
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1) << "a temp file was left behind";
}

TEST(TFRecord, ExclusiveRefusesExistingFile) {
  TempDir dir("tfrecord");
  std::string p = dir.file("x");
  { TFRecordWriter w(p, {.exclusive = true}); }
  EXPECT_KILN_ERROR(TFRecordWriter(p, {.exclusive = true}), kFailedPrecondition, "already exists");
  EXPECT_KILN_ERROR(TFRecordWriter(p, {.atomic = true, .exclusive = true}), kFailedPrecondition, "already exists");
}

TEST(TFRecord, Errors) {
  TempDir dir("tfrecord");
  EXPECT_KILN_ERROR(TFRecordReader(dir.file("missing")), kNotFound, dir.file("missing"));
  EXPECT_KILN_ERROR(TFRecordWriter(dir.file("no/such/dir/f")), kFailedPrecondition, "cannot create");
  TFRecordWriter w(dir.file("closed"));
  w.close();
  EXPECT_KILN_ERROR(w.write("x"), kFailedPrecondition, "closed");
}

}  // namespace
}  // namespace kiln::data
