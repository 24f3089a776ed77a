#include "kiln/data/text.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "zlib_ref.h"

using kiln::testing::deflate_ref;

namespace kiln::data {
namespace {

using kiln::testing::TempDir;
using kiln::testing::write_bytes;

std::vector<std::string> lines_of(const Dataset& ds) {
  std::vector<std::string> out;
  for (const Element& e : ds.iterator()) {
    EXPECT_EQ(e.size(), 1u);
    out.push_back(e[0].strings().item());
  }
  return out;
}

std::vector<std::string> read_all(TextLineReader r) {
  std::vector<std::string> out;
  std::string line;
  while (r.next(&line)) out.push_back(line);
  return out;
}

using Lines = std::vector<std::string>;

TEST(TextLine, LineEndings) {
  EXPECT_EQ(read_all(TextLineReader::from_string("a\nb\r\n\nlast")), (Lines{"a", "b", "", "last"}));
  EXPECT_EQ(read_all(TextLineReader::from_string("x\n")), (Lines{"x"})) << "a final \\n starts no empty line";
  EXPECT_EQ(read_all(TextLineReader::from_string("\n\n")), (Lines{"", ""}));
  EXPECT_EQ(read_all(TextLineReader::from_string("")), Lines{});
  EXPECT_EQ(read_all(TextLineReader::from_string("a\rb\r\nc\r")), (Lines{"a\rb", "c"})) << "a lone \\r is text";
  EXPECT_EQ(read_all(TextLineReader::from_string(std::string("n\0ul\n", 5))), (Lines{std::string("n\0ul", 4)}));
}

TEST(TextLine, LineNumbers) {
  auto r = TextLineReader::from_string("a\nb\nc");
  std::string line;
  EXPECT_EQ(r.line_number(), 0);
  ASSERT_TRUE(r.next(&line));
  ASSERT_TRUE(r.next(&line));
  EXPECT_EQ(line, "b");
  EXPECT_EQ(r.line_number(), 2);
}

TEST(TextLine, LongLinesAndCrlfAcrossSmallBuffers) {
  // Lines of every length 0..40 with CRLF endings through tiny buffers: every split
  // of a line and of a "\r\n" across reads occurs.
  std::string text;
  Lines want;
  for (int n = 0; n <= 40; ++n) {
    std::string l;
    for (int i = 0; i < n; ++i) l.push_back(static_cast<char>('a' + (n + i) % 26));
    want.push_back(l);
    text += l + (n % 2 ? "\r\n" : "\n");
  }
  want.push_back(std::string(5000, 'z'));
  text += want.back();
  TextLineOptions opt;
  for (size_t b : {1, 2, 16}) {
    opt.buffer_bytes = b;
    EXPECT_EQ(read_all(TextLineReader::from_string(text, "m", opt)), want) << b;
  }
  opt.buffer_bytes = 16;
  opt.compression = Compression::kGzip;
  EXPECT_EQ(read_all(TextLineReader::from_string(deflate_ref(text, true), "m", opt)), want);
}

TEST(TextLine, DatasetReadsFilesInOrderAndSkipsHeaders) {
  TempDir dir("text");
  write_bytes(dir.file("a.txt"), "h1\nh2\na1\na2\n");
  write_bytes(dir.file("b.txt"), "h1\r\nh2\r\nb1");
  write_bytes(dir.file("c.txt"), "h1\n");  // only a header
  auto ds = text_line_dataset({dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")});
  EXPECT_EQ(lines_of(ds), (Lines{"h1", "h2", "a1", "a2", "h1", "h2", "b1", "h1"}));
  EXPECT_EQ(ds.element_spec(), (ElementSpec{{}, {TypeSpec::string()}}));
  EXPECT_EQ(ds.cardinality(), kUnknownCardinality);
  auto skipped = text_line_dataset({dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")},
                                   {.skip_header_lines = 2});
  EXPECT_EQ(lines_of(skipped), (Lines{"a1", "a2", "b1"}));
  EXPECT_EQ(lines_of(skipped), (Lines{"a1", "a2", "b1"})) << "a second pass reads the files again";
  // Composes with the pipeline (here: files from list_files through interleave).
  auto files = Dataset::list_files({dir.file("*.txt")});
  auto inter = files.interleave(
      [](const Element& f) { return text_line_dataset({f[0].strings().item()}, {.skip_header_lines = 2}); },
      {.cycle_length = 1});
  EXPECT_EQ(lines_of(inter), (Lines{"a1", "a2", "b1"}));
}

TEST(TextLine, Compression) {
  TempDir dir("text");
  std::string text = "one\ntwo\r\nthree\n";
  write_bytes(dir.file("p.txt"), text);
  write_bytes(dir.file("g.txt.gz"), deflate_ref(text, true));
  write_bytes(dir.file("two.gz"), deflate_ref("one\ntw", true) + deflate_ref("o\r\nthree\n", true));
  write_bytes(dir.file("z.zlib"), deflate_ref(text, false));
  write_bytes(dir.file("empty.gz"), "");
  Lines want{"one", "two", "three"};
  EXPECT_EQ(lines_of(text_line_dataset({dir.file("g.txt.gz")}, {.compression = Compression::kGzip})), want);
  EXPECT_EQ(lines_of(text_line_dataset({dir.file("two.gz")}, {.compression = Compression::kGzip})), want)
      << "concatenated gzip members";
  EXPECT_EQ(lines_of(text_line_dataset({dir.file("z.zlib")}, {.compression = Compression::kZlib})), want);
  EXPECT_EQ(lines_of(text_line_dataset({dir.file("empty.gz")}, {.compression = Compression::kGzip})), Lines{});
  // kAuto decides per file.
  auto ds = text_line_dataset({dir.file("p.txt"), dir.file("g.txt.gz")}, {.compression = Compression::kAuto});
  EXPECT_EQ(lines_of(ds), (Lines{"one", "two", "three", "one", "two", "three"}));
  // A zlib header is plain text to kAuto ("x^" is one).
  write_bytes(dir.file("x.txt"), "x^2\n");
  EXPECT_EQ(lines_of(text_line_dataset({dir.file("x.txt")}, {.compression = Compression::kAuto})), Lines{"x^2"});
}

TEST(TextLine, CorruptAndTruncatedCompressedFiles) {
  TempDir dir("text");
  std::string gz = deflate_ref(std::string(1000, 'q') + "\nend\n", true);
  write_bytes(dir.file("trunc.gz"), gz.substr(0, gz.size() - 6));
  // (Lines before the cut come out first.)
  EXPECT_KILN_ERROR(lines_of(text_line_dataset({dir.file("trunc.gz")}, {.compression = Compression::kGzip})), kDataLoss,
                    "trunc.gz': truncated gzip stream");
  write_bytes(dir.file("trunc2.gz"), gz.substr(0, 15));
  auto it = text_line_dataset({dir.file("trunc2.gz")}, {.compression = Compression::kGzip}).iterator();
  EXPECT_KILN_ERROR(it.next(), kDataLoss, "truncated gzip stream (ends at compressed offset 15)");
  std::string bad = gz;
  bad[12] ^= 0x55;  // inside the deflate data
  write_bytes(dir.file("bad.gz"), bad);
  EXPECT_KILN_ERROR(lines_of(text_line_dataset({dir.file("bad.gz")}, {.compression = Compression::kGzip})), kDataLoss,
                    "bad.gz'");
  write_bytes(dir.file("plain.txt"), "not gzip\n");
  EXPECT_KILN_ERROR(lines_of(text_line_dataset({dir.file("plain.txt")}, {.compression = Compression::kGzip})),
                    kDataLoss, "corrupt gzip stream at compressed offset");
  write_bytes(dir.file("trail.z"), deflate_ref("a\n", false) + "junk");
  EXPECT_KILN_ERROR(lines_of(text_line_dataset({dir.file("trail.z")}, {.compression = Compression::kZlib})), kDataLoss,
                    "trailing bytes after the zlib stream");
}

TEST(TextLine, Errors) {
  TempDir dir("text");
  write_bytes(dir.file("a.txt"), "a\n");
  // A missing file fails when the dataset is built.
  EXPECT_KILN_ERROR(text_line_dataset({dir.file("a.txt"), dir.file("missing.txt")}), kNotFound, "missing.txt");
  EXPECT_KILN_ERROR(TextLineReader(dir.file("missing.txt")), kNotFound, "text file '" + dir.file("missing.txt"));
  // ... or when a pass reaches it, if it went in between.
  write_bytes(dir.file("gone.txt"), "g\n");
  auto ds = text_line_dataset({dir.file("a.txt"), dir.file("gone.txt")});
  std::filesystem::remove(dir.file("gone.txt"));
  auto it = ds.iterator();
  ASSERT_TRUE(it.next().has_value());
  EXPECT_KILN_ERROR(it.next(), kNotFound, "gone.txt");
  EXPECT_FALSE(it.next().has_value()) << "the pass ends after an error";
  EXPECT_KILN_ERROR(text_line_dataset({dir.path()}).iterator().next(), kFailedPrecondition, "is a directory");
  EXPECT_KILN_ERROR(text_line_dataset({}), kInvalidArgument, "at least one file");
  EXPECT_KILN_ERROR(text_line_dataset({dir.file("a.txt")}, {.skip_header_lines = -1}), kInvalidArgument,
                    "skip_header_lines");
}

}  // namespace
}  // namespace kiln::data
