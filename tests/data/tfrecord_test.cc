#include "kiln/data/tfrecord.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/core/file_io.h"
#include "test_util.h"
#include "zlib_ref.h"

using kiln::testing::deflate_ref;

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

// Reads every record of `r`, checking each one's bytes and offset (16 framing bytes
// per record), then that the end stays the end.
void expect_records(TFRecordReader& r, const std::vector<std::string>& recs) {
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
  expect_records(r, recs);
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

// ---- compression ----

// Decompresses with zlib itself (the reference implementation): gzip (members
// concatenated) or zlib.
std::string inflate_ref(const std::string& in, bool gzip) {
  z_stream zs{};
  EXPECT_EQ(inflateInit2(&zs, gzip ? 31 : 15), Z_OK);
  std::string out;
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  char chunk[4096];
  for (;;) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk);
    zs.avail_out = sizeof chunk;
    int rc = inflate(&zs, Z_NO_FLUSH);
    out.append(chunk, sizeof chunk - zs.avail_out);
    if (rc == Z_STREAM_END && zs.avail_in > 0 && gzip) {
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK) {
      ADD_FAILURE() << "zlib inflate: " << rc;
      break;
    }
  }
  inflateEnd(&zs);
  return out;
}

std::string frame_all(const std::vector<std::string>& recs) {
  std::string f;
  for (const auto& r : recs) f += frame_ref(r);
  return f;
}

std::vector<std::string> read_all(TFRecordReader& r) {
  std::vector<std::string> out;
  std::string rec;
  while (r.next(&rec)) out.push_back(rec);
  return out;
}

TEST(TFRecordCompression, ParseAndName) {
  EXPECT_EQ(parse_compression(""), Compression::kNone);
  EXPECT_EQ(parse_compression("GZIP"), Compression::kGzip);  // TF's spelling
  EXPECT_EQ(parse_compression("zlib"), Compression::kZlib);
  EXPECT_EQ(parse_compression("Auto"), Compression::kAuto);
  EXPECT_KILN_ERROR(parse_compression("bz2"), kInvalidArgument, "bz2");
  EXPECT_STREQ(compression_name(Compression::kGzip), "gzip");
}

TEST(TFRecordCompression, WriterOutputIsTheFramedFileCompressed) {
  TempDir dir("tfrecord");
  std::vector<std::string> recs = sample_records();
  for (bool gzip : {true, false}) {
    std::string p = dir.file(gzip ? "g" : "z");
    write_tfrecords(p, recs, {.compression = gzip ? Compression::kGzip : Compression::kZlib});
    std::string got = read_file(p);
    ASSERT_GE(got.size(), 2u);
    if (gzip) {
      EXPECT_EQ(static_cast<unsigned char>(got[0]), 0x1f);
      EXPECT_EQ(static_cast<unsigned char>(got[1]), 0x8b);
    } else {
      EXPECT_EQ(static_cast<unsigned char>(got[0]), 0x78);
    }
    EXPECT_LT(got.size(), frame_all(recs).size() / 2) << "the sample records compress well";
    EXPECT_EQ(inflate_ref(got, gzip), frame_all(recs));
  }
}

TEST(TFRecordCompression, RoundTripAndOffsetsCountDecompressedBytes) {
  TempDir dir("tfrecord");
  std::vector<std::string> recs = sample_records();
  for (Compression c : {Compression::kGzip, Compression::kZlib}) {
    for (size_t buffer : {size_t{256} << 10, size_t{64}, size_t{1000}}) {  // small buffers: grow, compact, refill
      SCOPED_TRACE(std::string(compression_name(c)) + " buffer " + std::to_string(buffer));
      std::string p = dir.file("rt");
      {
        TFRecordWriter w(p, {.compression = c, .compression_level = 9});
        for (const auto& r : recs) w.write(r);
        w.close();
        EXPECT_EQ(w.bytes_written(), frame_all(recs).size());
      }
      TFRecordReader r(p, {.compression = c, .buffer_bytes = buffer});
      expect_records(r, recs);
      EXPECT_EQ(r.records_read(), recs.size());
    }
  }
}

TEST(TFRecordCompression, ReadsWhatZlibItselfCompressed) {
  std::vector<std::string> recs = sample_records();
  std::string framed = frame_all(recs);
  auto gz = TFRecordReader::from_string(deflate_ref(framed, true), "gz", {.compression = Compression::kGzip});
  EXPECT_EQ(read_all(gz), recs);
  auto zl = TFRecordReader::from_string(deflate_ref(framed, false), "zl", {.compression = Compression::kZlib});
  EXPECT_EQ(read_all(zl), recs);
  // `cat a.gz b.gz`: gzip members in sequence.
  auto two = TFRecordReader::from_string(deflate_ref(frame_ref("a"), true) + deflate_ref(frame_ref("b"), true), "cat",
                                         {.compression = Compression::kGzip});
  EXPECT_EQ(read_all(two), (std::vector<std::string>{"a", "b"}));
  // A member holding half a record continues in the next one.
  std::string f = frame_ref("split me");
  auto split = TFRecordReader::from_string(deflate_ref(f.substr(0, 15), true) + deflate_ref(f.substr(15), true),
                                           "split", {.compression = Compression::kGzip});
  EXPECT_EQ(read_all(split), std::vector<std::string>{"split me"});
  // Empty: no bytes at all, or an empty stream.
  for (std::string empty : {std::string(), deflate_ref("", true)}) {
    auto e = TFRecordReader::from_string(empty, "e", {.compression = Compression::kGzip});
    EXPECT_TRUE(read_all(e).empty());
  }
}

TEST(TFRecordCompression, AutoDetect) {
  std::string framed = frame_all({"abc", "de"});
  struct Case {
    std::string data;
    Compression want;
    std::vector<std::string> records;
  };
  // An uncompressed first record of 0x8b1f bytes starts with the gzip magic 1f 8b: the
  // valid length CRC says uncompressed.
  std::string magic_len(0x8b1f, 'm');
  std::vector<std::string> two = {"abc", "de"};
  for (const Case& c : {Case{framed, Compression::kNone, two}, Case{deflate_ref(framed, true), Compression::kGzip, two},
                        Case{deflate_ref(framed, false), Compression::kZlib, two},
                        Case{frame_ref(magic_len), Compression::kNone, {magic_len}}}) {
    auto r = TFRecordReader::from_string(c.data, "auto", {.compression = Compression::kAuto});
    EXPECT_EQ(r.compression(), Compression::kAuto);  // nothing read yet
    EXPECT_TRUE(read_all(r) == c.records);
    EXPECT_EQ(r.compression(), c.want);
  }
  EXPECT_EQ(static_cast<unsigned char>(frame_ref(magic_len)[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>(frame_ref(magic_len)[1]), 0x8b);
  auto empty = TFRecordReader::from_string("", "auto", {.compression = Compression::kAuto});
  std::string rec;
  EXPECT_FALSE(empty.next(&rec));
  // Neither a valid header nor a compression magic: read as uncompressed, which says why it is bad.
  auto junk = TFRecordReader::from_string(std::string(20, 'j'), "junk", {.compression = Compression::kAuto});
  EXPECT_KILN_ERROR(junk.next(&rec), kDataLoss, "length CRC mismatch");
  EXPECT_EQ(junk.compression(), Compression::kNone);
}

TEST(TFRecordCompression, ReadingACompressedFileWithoutSayingSoFails) {
  auto r = TFRecordReader::from_string(deflate_ref(frame_ref("abc"), true), "plain");
  std::string rec;
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "plain: record at offset 0: length CRC mismatch");
  auto z = TFRecordReader::from_string(frame_ref("abc"), "notgz", {.compression = Compression::kGzip});
  EXPECT_KILN_ERROR(z.next(&rec), kDataLoss, "notgz (gzip): record at decompressed offset 0: corrupt gzip stream");
}

TEST(TFRecordCompression, TruncatedStream) {
  std::string framed = frame_all({"first record", "second record", "third"});
  for (bool gzip : {true, false}) {
    std::string z = deflate_ref(framed, gzip);
    Compression c = gzip ? Compression::kGzip : Compression::kZlib;
    // Cut anywhere: never a clean end, never a crash; whole records before the cut are read.
    for (size_t keep = 1; keep < z.size(); ++keep) {
      SCOPED_TRACE("keep " + std::to_string(keep));
      auto r = TFRecordReader::from_string(z.substr(0, keep), "cut", {.compression = c});
      std::string rec;
      size_t n = 0;
      try {
        while (r.next(&rec)) ++n;
        ADD_FAILURE() << "a truncated stream ended cleanly";
      } catch (const DataLossError& e) {
        EXPECT_NE(std::string(e.what()).find("cut (" + std::string(compression_name(c)) + "): record at"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_LE(n, 3u);
      auto s = TFRecordReader::from_string(z.substr(0, keep), "cut", {.compression = c, .skip_corrupt = true});
      size_t m = 0;
      while (s.next(&rec)) ++m;
      EXPECT_EQ(m, n);
      EXPECT_EQ(s.records_skipped(), 1u);
    }
    // Cut after the deflate data but before the trailer: every record is there, the end is not.
    auto r = TFRecordReader::from_string(z.substr(0, z.size() - 2), "trailer", {.compression = c});
    std::string rec;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.next(&rec));
    EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "stream (ends after");
  }
}

TEST(TFRecordCompression, CorruptStreamNamesTheDecompressedOffset) {
  std::string framed = frame_all({std::string(5000, 'a'), std::string(5000, 'b')});
  std::string z = deflate_ref(framed, true);
  z[z.size() - 6] ^= 0x55;  // the gzip trailer's CRC-32
  auto r = TFRecordReader::from_string(z, "crc", {.compression = Compression::kGzip});
  std::string rec;
  ASSERT_TRUE(r.next(&rec));
  ASSERT_TRUE(r.next(&rec));
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss,
                    "crc (gzip): record at decompressed offset 10032: corrupt gzip stream at decompressed offset 10032");
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "incorrect data check");  // stays broken
  // zlib: no second stream.
  auto t = TFRecordReader::from_string(deflate_ref(frame_ref("x"), false) + "junk", "trail",
                                       {.compression = Compression::kZlib});
  ASSERT_TRUE(t.next(&rec));
  EXPECT_KILN_ERROR(t.next(&rec), kDataLoss, "data after the end of the zlib stream");
}

TEST(TFRecordCompression, FlushMakesRecordsReadableFromAGrowingFile) {
  TempDir dir("tfrecord");
  std::string p = dir.file("live.gz");
  TFRecordWriter w(p, {.compression = Compression::kGzip});
  w.write("one");
  w.flush();
  TFRecordReader r(p, {.compression = Compression::kGzip});
  std::string rec;
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec, "one");
  EXPECT_KILN_ERROR(r.next(&rec), kDataLoss, "truncated gzip stream");  // the stream has not ended
  w.write("two");
  w.write("three");
  w.flush();
  ASSERT_TRUE(r.next(&rec));  // retried: continues where it stopped
  EXPECT_EQ(rec, "two");
  ASSERT_TRUE(r.next(&rec));
  EXPECT_EQ(rec, "three");
  w.close();
  EXPECT_FALSE(r.next(&rec));
}

TEST(TFRecordCompression, WriterOptionErrors) {
  TempDir dir("tfrecord");
  EXPECT_KILN_ERROR(TFRecordWriter(dir.file("a"), {.compression = Compression::kAuto}), kInvalidArgument, "auto");
  EXPECT_KILN_ERROR(TFRecordWriter(dir.file("b"), {.compression = Compression::kGzip, .compression_level = 10}),
                    kInvalidArgument, "compression_level 10");
  EXPECT_FALSE(fs::exists(dir.file("a")));
}

// ---- skip_corrupt ----

TEST(TFRecordSkipCorrupt, DataCrcMismatchSkipsTheRecord) {
  std::string f = frame_all({"first", "second", "third"});
  f[16 + 5 + 12 + 2] ^= 0x20;  // a data byte of "second"
  for (bool gzip : {false, true}) {
    std::string data = gzip ? deflate_ref(f, true) : f;
    Compression c = gzip ? Compression::kGzip : Compression::kNone;
    auto strict = TFRecordReader::from_string(data, "mid", {.compression = c});
    std::string rec;
    ASSERT_TRUE(strict.next(&rec));
    EXPECT_KILN_ERROR(strict.next(&rec), kDataLoss, "offset 21: data CRC mismatch");
    std::vector<std::string> skips;
    auto lenient = TFRecordReader::from_string(
        data, "mid", {.compression = c, .skip_corrupt = true, .on_skip = [&](const std::string& m) { skips.push_back(m); }});
    EXPECT_EQ(read_all(lenient), (std::vector<std::string>{"first", "third"}));
    EXPECT_EQ(lenient.records_skipped(), 1u);
    ASSERT_EQ(skips.size(), 1u);
    EXPECT_NE(skips[0].find("offset 21: data CRC mismatch"), std::string::npos) << skips[0];
  }
}

TEST(TFRecordSkipCorrupt, LengthCrcMismatchResyncsAtTheNextValidRecord) {
  std::vector<std::string> recs;
  for (int i = 0; i < 10; ++i) recs.push_back("record number " + std::to_string(i) + std::string(i * 7, 'x'));
  std::string f = frame_all(recs);
  size_t third = 0;
  for (int i = 0; i < 2; ++i) third += 16 + recs[i].size();
  std::string len_flip = f, len_crc_flip = f;
  len_flip[third + 1] ^= 0x10;  // the length of record 2 (its CRC no longer matches)
  len_crc_flip[third + 10] ^= 0x01;
  for (const std::string& bad : {len_flip, len_crc_flip}) {
    auto strict = TFRecordReader::from_string(bad, "len");
    std::string rec;
    ASSERT_TRUE(strict.next(&rec));
    ASSERT_TRUE(strict.next(&rec));
    EXPECT_KILN_ERROR(strict.next(&rec), kDataLoss, "offset " + std::to_string(third) + ": length CRC mismatch");
    auto lenient = TFRecordReader::from_string(bad, "len", {.skip_corrupt = true});
    std::vector<std::string> want = recs;
    want.erase(want.begin() + 2);
    EXPECT_EQ(read_all(lenient), want);
    EXPECT_EQ(lenient.records_skipped(), 1u);
  }
  // Two corrupt regions, the second at the very end (nothing valid follows it).
  std::string two = len_flip;
  two[f.size() - 3] ^= 0x01;  // data CRC of the last record
  size_t last = f.size() - 16 - recs[9].size();
  two[last + 9] ^= 0x01;  // and its length CRC
  auto lenient = TFRecordReader::from_string(deflate_ref(two, false), "two",
                                             {.compression = Compression::kZlib, .skip_corrupt = true});
  std::vector<std::string> want(recs.begin(), recs.begin() + 9);
  want.erase(want.begin() + 2);
  EXPECT_EQ(read_all(lenient), want);
  EXPECT_EQ(lenient.records_skipped(), 2u);
}

TEST(TFRecordSkipCorrupt, TruncatedTailEndsTheFile) {
  TempDir dir("tfrecord");
  std::string one = frame_ref("abcdef");
  for (size_t keep : {5, 12, 18, 21}) {
    write_bytes(dir.file("t"), one + one + one.substr(0, keep));
    TFRecordReader r(dir.file("t"), {.skip_corrupt = true});
    EXPECT_EQ(read_all(r).size(), 2u);
    EXPECT_EQ(r.records_skipped(), 1u);
    std::string rec;
    EXPECT_FALSE(r.next(&rec));
    EXPECT_EQ(r.records_skipped(), 1u);  // counted once
  }
  // A huge length whose CRC matches is a truncated tail, not an allocation.
  std::string len = le(uint64_t{1} << 60, 8);
  auto r = TFRecordReader::from_string(one + len + le(mask_ref(crc32c_ref(len)), 4) + "abc", "huge",
                                       {.skip_corrupt = true});
  EXPECT_EQ(read_all(r), std::vector<std::string>{"abcdef"});
  EXPECT_EQ(r.records_skipped(), 1u);
}

// ---- bulk reading ----

TEST(TFRecord, NextReusesTheRecordsCapacity) {
  std::vector<std::string> recs;
  for (int i = 0; i < 2000; ++i) recs.push_back(std::string(700 + i % 100, static_cast<char>('a' + i % 26)));
  auto r = TFRecordReader::from_string(frame_all(recs), "reuse", {.buffer_bytes = 4096});
  std::string rec;
  rec.reserve(1000);
  const char* storage = rec.data();
  for (const auto& want : recs) {
    ASSERT_TRUE(r.next(&rec));
    ASSERT_EQ(rec, want);
    ASSERT_EQ(rec.data(), storage);
  }
  EXPECT_FALSE(r.next(&rec));
}

}  // namespace
}  // namespace kiln::data
