#include "kiln/data/tfrecord_dataset.h"

#include <algorithm>

#include "kiln/core/file_io.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using kiln::testing::TempDir;

std::vector<std::string> records(const Dataset& ds) {
  std::vector<std::string> v;
  for (const Element& e : ds.iterator()) v.push_back(e[0].strings().item());
  return v;
}

// Files f0..f{n-1}, file i holding "i:0", "i:1", ... (k records each).
void write_files(const TempDir& dir, int n, int k, Compression c = Compression::kNone) {
  for (int i = 0; i < n; ++i) {
    TFRecordWriter w(dir.file("f" + std::to_string(i) + ".tfrecord"), {.compression = c});
    for (int j = 0; j < k; ++j) w.write(std::to_string(i) + ":" + std::to_string(j));
    w.close();
  }
}

TEST(TFRecordDataset, ReadsFilesInOrderOrInterleaved) {
  TempDir dir("tfrds");
  write_files(dir, 3, 2);
  auto seq = records(tfrecord_dataset({dir.file("f*.tfrecord")}));
  EXPECT_EQ(seq, (std::vector<std::string>{"0:0", "0:1", "1:0", "1:1", "2:0", "2:1"}));
  auto stats = std::make_shared<TFRecordStats>();
  auto par = records(tfrecord_dataset({dir.file("f*.tfrecord")}, {.num_parallel_reads = 3, .stats = stats}));
  EXPECT_EQ(par, (std::vector<std::string>{"0:0", "1:0", "2:0", "0:1", "1:1", "2:1"}))
      << "deterministic interleave, one record per file in turn";
  EXPECT_EQ(stats->records.load(), 6u);
  EXPECT_EQ(stats->bytes.load(), 18u);
  EXPECT_EQ(tfrecord_dataset({dir.file("f*.tfrecord")}).element_spec().str(), "(string[])");
}

TEST(TFRecordDataset, CompressedFiles) {
  TempDir dir("tfrdsz");
  write_files(dir, 2, 3, Compression::kGzip);
  auto got = records(tfrecord_dataset({dir.file("f*.tfrecord")}, {.compression = Compression::kGzip}));
  EXPECT_EQ(got.size(), 6u);
  EXPECT_EQ(got.front(), "0:0");
  EXPECT_EQ(records(tfrecord_dataset({dir.file("f*.tfrecord")}, {.compression = Compression::kAuto})), got);
}

TEST(TFRecordDataset, CorruptRecordFailsOrIsSkipped) {
  TempDir dir("tfrdsc");
  write_files(dir, 1, 3);
  std::string path = dir.file("f0.tfrecord");
  std::string bytes = read_file(path);
  // Record 1 starts at 12 + 3 + 4 = 19; flip a byte of its data (at 19 + 12).
  bytes[19 + 12] ^= 1;
  kiln::testing::write_bytes(path, bytes);
  auto it = tfrecord_dataset({path}).iterator();
  EXPECT_TRUE(it.next());
  EXPECT_KILN_ERROR(it.next(), kDataLoss, "f0.tfrecord");
  auto stats = std::make_shared<TFRecordStats>();
  auto kept = records(tfrecord_dataset({path}, {.skip_corrupt = true, .stats = stats}));
  EXPECT_EQ(kept, (std::vector<std::string>{"0:0", "0:2"}));
  EXPECT_EQ(stats->skipped.load(), 1u);
}

TEST(TFRecordDataset, ReadsCompressedFilesWrittenByTensorFlow) {
  // scripts/make_example_fixtures.py: tf.io.TFRecordWriter with compression_type
  // GZIP (.gz) and ZLIB (.zz) over the same Examples as examples.tfrecord.
  auto plain = records(tfrecord_dataset({kiln::testing::fixture("example/examples.tfrecord")}));
  ASSERT_EQ(plain.size(), 7u);
  EXPECT_EQ(records(tfrecord_dataset({kiln::testing::fixture("example/examples.tfrecord.gz")},
                                     {.compression = Compression::kGzip})),
            plain);
  EXPECT_EQ(records(tfrecord_dataset({kiln::testing::fixture("example/examples.tfrecord.zz")},
                                     {.compression = Compression::kZlib})),
            plain);
  for (const char* f : {"example/examples.tfrecord.gz", "example/examples.tfrecord.zz"})
    EXPECT_EQ(records(tfrecord_dataset({kiln::testing::fixture(f)}, {.compression = Compression::kAuto})), plain) << f;
  // Read as uncompressed, a compressed file is a clear framing error.
  EXPECT_KILN_ERROR(records(tfrecord_dataset({kiln::testing::fixture("example/examples.tfrecord.gz")})), kDataLoss,
                    "examples.tfrecord.gz");
}

TEST(TFRecordDataset, MissingFiles) {
  EXPECT_KILN_ERROR(tfrecord_dataset({"/nonexistent/*.tfrecord"}), kNotFound, "no file matches");
  EXPECT_KILN_ERROR(tfrecord_dataset({"/x"}, {.num_parallel_reads = 0}), kInvalidArgument, "num_parallel_reads");
}

}  // namespace
}  // namespace kiln::data
