#include "kiln/core/dtype.h"
#include "kiln/data/csv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "data/csv_internal.h"
#include "test_util.h"
#include "zlib_ref.h"

using kiln::testing::deflate_ref;

namespace kiln::data {
namespace {

using kiln::testing::TempDir;
using kiln::testing::write_bytes;
using Fields = std::vector<std::string>;

std::vector<Element> all(const Dataset& ds) {
  std::vector<Element> out;
  for (const Element& e : ds.iterator()) out.push_back(e);
  return out;
}
std::string str(const Element& e, const char* name) { return e[name].strings().item(); }

TEST(ParseCsvLine, Rfc4180) {
  EXPECT_EQ(parse_csv_line("a,b,c"), (Fields{"a", "b", "c"}));
  EXPECT_EQ(parse_csv_line("a,,c,"), (Fields{"a", "", "c", ""}));
  EXPECT_EQ(parse_csv_line(""), (Fields{""}));
  EXPECT_EQ(parse_csv_line("\"x,y\",\"say \"\"hi\"\"\",\"\""), (Fields{"x,y", "say \"hi\"", ""}));
  EXPECT_EQ(parse_csv_line("\"two\nlines\",\"crlf\r\nkept\"\r\n"), (Fields{"two\nlines", "crlf\r\nkept"}));
  EXPECT_EQ(parse_csv_line("5'11\",b\"c"), (Fields{"5'11\"", "b\"c"})) << "quotes inside unquoted fields are text";
  EXPECT_EQ(parse_csv_line(" \"a\" ,b"), (Fields{" \"a\" ", "b"})) << "a quote after a space does not open";
  EXPECT_EQ(parse_csv_line("a;\"b;c\"", ';'), (Fields{"a", "b;c"}));
  EXPECT_EQ(parse_csv_line("a\tb", '\t'), (Fields{"a", "b"}));
  EXPECT_EQ(parse_csv_line("\"a,b\"", ',', false), (Fields{"\"a", "b\""}));
  EXPECT_EQ(parse_csv_line("a\rb,c\n"), (Fields{"a\rb", "c"})) << "a lone \\r is text";
  EXPECT_KILN_ERROR(parse_csv_line("a,\"open"), kInvalidArgument, "not closed");
  EXPECT_KILN_ERROR(parse_csv_line("\"ab\"c,d"), kInvalidArgument, "'c' after a closing quote");
  EXPECT_KILN_ERROR(parse_csv_line("a\nb"), kInvalidArgument, "more than one record");
  EXPECT_KILN_ERROR(parse_csv_line("a", '\n'), kInvalidArgument, "delimiter");
  EXPECT_KILN_ERROR(parse_csv_line("a", '"'), kInvalidArgument, "delimiter");
}

TEST(CsvDataset, TypedColumnsByName) {
  TempDir dir("csv");
  write_bytes(dir.file("d.csv"),
              "id,name,score,weight,count\n"
              "1,ann,0.5,2.25,7\n"
              "2,\"bob, jr\",-1.5e3,1e-300,-9223372036854775808\n"
              " 3 , \"q\"\"q\" ,+4,nan,9223372036854775807\n");
  CsvOptions opt;
  opt.columns = {{"count", CsvType::kI64}, {"id", CsvType::kI32}, {"name"}, {"score", CsvType::kF32},
                 {"weight", CsvType::kF64}};
  opt.columns[2].default_value = "";
  auto ds = csv_dataset({dir.file("d.csv")}, opt);
  EXPECT_EQ(ds.element_spec().names, (Fields{"count", "id", "name", "score", "weight"}));
  EXPECT_EQ(ds.element_spec().components,
            (std::vector<TypeSpec>{TypeSpec::tensor(DType::kI64), TypeSpec::tensor(DType::kI32), TypeSpec::string(),
                                   TypeSpec::tensor(DType::kF32), TypeSpec::tensor(DType::kF64)}));
  auto rows = all(ds);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].tensor("count").dtype(), DType::kI64);
  EXPECT_EQ(rows[0].tensor("count").data<int64_t>()[0], 7);
  EXPECT_EQ(rows[0].tensor("id").data<int32_t>()[0], 1);
  EXPECT_EQ(str(rows[0], "name"), "ann");
  EXPECT_EQ(rows[0].tensor("score").data<float>()[0], 0.5f);
  EXPECT_EQ(rows[0].tensor("weight").data<double>()[0], 2.25);
  EXPECT_EQ(str(rows[1], "name"), "bob, jr");
  EXPECT_EQ(rows[1].tensor("score").data<float>()[0], -1500.0f);
  EXPECT_EQ(rows[1].tensor("weight").data<double>()[0], 1e-300);
  EXPECT_EQ(rows[1].tensor("count").data<int64_t>()[0], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(rows[2].tensor("id").data<int32_t>()[0], 3) << "numbers may have spaces around them";
  EXPECT_EQ(str(rows[2], "name"), " \"q\"\"q\" ") << "strings are kept as they are";
  EXPECT_EQ(rows[2].tensor("score").data<float>()[0], 4.0f);
  EXPECT_TRUE(std::isnan(rows[2].tensor("weight").data<double>()[0]));
  EXPECT_EQ(rows[2].tensor("count").data<int64_t>()[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(rows[2].tensor("id").shape().rank(), 0);
}

TEST(CsvDataset, FloatUnderflowReadsAsZeroOverflowFails) {
  auto rows = internal::read_csv_string("x\n1e-50\n", {.columns = {{"x", CsvType::kF32}}});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].tensor("x").data<float>()[0], 0.0f);
  EXPECT_KILN_ERROR(internal::read_csv_string("x\n1e39\n", {.columns = {{"x", CsvType::kF32}}}), kInvalidArgument,
                    "'1e39' is out of range for f32");
  EXPECT_KILN_ERROR(internal::read_csv_string("x\n2147483648\n", {.columns = {{"x", CsvType::kI32}}}),
                    kInvalidArgument, "'2147483648' is out of range for i32");
  EXPECT_KILN_ERROR(internal::read_csv_string("x\n1.0\n", {.columns = {{"x", CsvType::kI64}}}), kInvalidArgument,
                    "'1.0' is not a valid i64");
  EXPECT_KILN_ERROR(internal::read_csv_string("x\n0x10\n", {.columns = {{"x", CsvType::kF64}}}), kInvalidArgument,
                    "'0x10' is not a valid f64");
}

TEST(CsvDataset, DefaultsAndNaValues) {
  CsvOptions opt;
  opt.columns = {{"a", CsvType::kF32, "-1"}, {"b", CsvType::kString, "none"}, {"c", CsvType::kI32}};
  opt.na_value = "NA";
  auto rows = internal::read_csv_string("a,b,c\n,x,1\nNA,,2\n  ,\"NA\",3\n2.5,\"\",4\n", opt);
  ASSERT_EQ(rows.size(), 4u);
  std::vector<float> a;
  Fields b;
  for (const auto& r : rows) {
    a.push_back(r.tensor("a").data<float>()[0]);
    b.push_back(str(r, "b"));
  }
  EXPECT_EQ(a, (std::vector<float>{-1, -1, -1, 2.5f}));
  EXPECT_EQ(b, (Fields{"x", "none", "none", "none"}));
  EXPECT_KILN_ERROR(internal::read_csv_string("a,b,c\n1,x,\n", opt, "m.csv"), kInvalidArgument,
                    "CSV file 'm.csv' line 2, column 'c': missing value '' and the column has no default");
  EXPECT_KILN_ERROR(internal::read_csv_string("a,b,c\n", {.columns = {{"a", CsvType::kI32, "x1"}}}), kInvalidArgument,
                    "column 'a': the default 'x1' is not a valid i32");
}

TEST(CsvDataset, ColumnSelection) {
  const std::string text = "a,b,c\n1,2,3\n4,5,6\n";
  // By index, named from the header or explicitly.
  auto rows = internal::read_csv_string(text, {.columns = {{"", CsvType::kI32, {}, 2}, {"first", CsvType::kI32, {}, 0}}});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].names(), (Fields{"c", "first"}));
  EXPECT_EQ(rows[1].tensor("c").data<int32_t>()[0], 6);
  EXPECT_EQ(rows[1].tensor("first").data<int32_t>()[0], 4);
  // By position, named from the header.
  rows = internal::read_csv_string(text, {.columns = {{"", CsvType::kI64}, {"", CsvType::kI64}}});
  EXPECT_EQ(rows[0].names(), (Fields{"a", "b"}));
  EXPECT_EQ(rows[0].tensor("b").data<int64_t>()[0], 2);
  // No columns given: all of them, as strings.
  rows = internal::read_csv_string(text, {});
  EXPECT_EQ(rows[0].names(), (Fields{"a", "b", "c"}));
  EXPECT_EQ(str(rows[0], "c"), "3");
  // No header: every record is data, names are column<i> unless given.
  rows = internal::read_csv_string(text, {.columns = {}, .header = false});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].names(), (Fields{"column0", "column1", "column2"}));
  EXPECT_EQ(str(rows[0], "column0"), "a");
  rows = internal::read_csv_string(text, {.columns = {{"x", CsvType::kString, {}, 1}, {"", CsvType::kString, {}, 2}},
                                          .header = false});
  EXPECT_EQ(rows[2].names(), (Fields{"x", "column2"}));
  EXPECT_EQ(str(rows[2], "x"), "5");
  // Column names come from the first file; a later file may order its columns differently.
  TempDir dir("csv");
  write_bytes(dir.file("1.csv"), "x,y\n1,2\n");
  write_bytes(dir.file("2.csv"), "y,x,z\n20,10,0\n");
  auto ds = csv_dataset({dir.file("1.csv"), dir.file("2.csv")},
                        {.columns = {{"x", CsvType::kI32}, {"y", CsvType::kI32}}});
  std::vector<int32_t> xs, ys;
  for (const Element& e : ds.iterator()) {
    xs.push_back(e.tensor("x").data<int32_t>()[0]);
    ys.push_back(e.tensor("y").data<int32_t>()[0]);
  }
  EXPECT_EQ(xs, (std::vector<int32_t>{1, 10}));
  EXPECT_EQ(ys, (std::vector<int32_t>{2, 20}));
}

TEST(CsvDataset, DialectDetails) {
  // BOM, CRLF, blank lines (skipped, still counted), quoted newlines, a last record without
  // a line end, ';' as delimiter.
  std::string text =
      "\xEF\xBB\xBFk;v\r\n"
      "\r\n"
      "1;\"multi\r\nline; \"\"text\"\"\"\r\n"
      "\n"
      "2;\"\"\r\n"
      "3;plain";
  auto rows = internal::read_csv_string(text, {.columns = {{"k", CsvType::kI32}, {"v", CsvType::kString, ""}},
                                               .delimiter = ';'});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(str(rows[0], "v"), "multi\r\nline; \"text\"");
  EXPECT_EQ(str(rows[1], "v"), "");
  EXPECT_EQ(str(rows[2], "v"), "plain");
  EXPECT_EQ(rows[2].tensor("k").data<int32_t>()[0], 3);
  for (size_t buffer : {1, 2, 3, 4, 64}) {  // a BOM split between reads, plain and gzip
    for (auto comp : {Compression::kNone, Compression::kGzip}) {
      CsvOptions o{.columns = {{"k", CsvType::kI32}}, .delimiter = ';', .compression = comp, .buffer_bytes = buffer};
      auto r = internal::read_csv_string(comp == Compression::kGzip ? deflate_ref(text, true) : text, o);
      ASSERT_EQ(r.size(), 3u) << buffer;
      EXPECT_EQ(r[0].names(), Fields{"k"});
    }
  }
  EXPECT_EQ(internal::read_csv_string("\xEF\xBB\xBF", {.columns = {{"k"}}, .header = false}).size(), 0u);
  EXPECT_KILN_ERROR(internal::read_csv_string("\xEF\xBB\xBF", {}, "bom"), kInvalidArgument, "has no records");
  // Line numbers count the header, blank lines and newlines inside quotes.
  EXPECT_KILN_ERROR(internal::read_csv_string(text + "\n\nx;y\n", {.columns = {{"k", CsvType::kI32}}, .delimiter = ';'},
                                              "t.csv"),
                    kInvalidArgument, "CSV file 't.csv' line 9, column 'k': 'x' is not a valid i32");
}

TEST(CsvDataset, SmallBuffersAndGzipGiveTheSameRecords) {
  std::string text = "n,s\n";
  for (int i = 0; i < 300; ++i) {
    std::string s(static_cast<size_t>(i % 37), static_cast<char>('a' + i % 26));
    if (i % 3 == 0) s = "\"" + s + "\"\"," + "\n" + s + "\"";  // quotes, a delimiter and a newline in the field
    text += std::to_string(i) + "," + s + (i % 2 ? "\r\n" : "\n");
  }
  CsvOptions opt{.columns = {{"n", CsvType::kI64}, {"s", CsvType::kString, ""}}};
  auto want = internal::read_csv_string(text, opt);
  ASSERT_EQ(want.size(), 300u);
  EXPECT_EQ(str(want[3], "s"), std::string(3, 'd') + "\",\n" + std::string(3, 'd'));
  opt.buffer_bytes = 1;  // every boundary between reads
  auto small = internal::read_csv_string(text, opt);
  opt.buffer_bytes = 16;
  opt.compression = Compression::kAuto;
  auto gz = internal::read_csv_string(deflate_ref(text, true), opt);
  ASSERT_EQ(small.size(), want.size());
  ASSERT_EQ(gz.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(small[i].tensor("n").data<int64_t>()[0], static_cast<int64_t>(i));
    EXPECT_EQ(str(small[i], "s"), str(want[i], "s"));
    EXPECT_EQ(str(gz[i], "s"), str(want[i], "s"));
  }
  // Through files and the pipeline.
  TempDir dir("csv");
  write_bytes(dir.file("t.csv.gz"), deflate_ref(text, true));
  auto ds = csv_dataset({dir.file("t.csv.gz")}, {.columns = {{"n", CsvType::kI64}}, .compression = Compression::kGzip})
                .batch(100);
  int64_t batches = 0, sum = 0;
  for (const Element& e : ds.iterator()) {
    ++batches;
    for (int64_t v : e.tensor("n").to_vector<int64_t>()) sum += v;
  }
  EXPECT_EQ(batches, 3);
  EXPECT_EQ(sum, 299 * 300 / 2);
}

TEST(CsvDataset, RecordErrorsNameFileLineAndColumn) {
  TempDir dir("csv");
  const std::string f = dir.file("e.csv");
  auto first_error = [&](const std::string& text, CsvOptions opt) {
    write_bytes(f, text);
    return all(csv_dataset({f}, opt));
  };
  CsvOptions num{.columns = {{"a", CsvType::kF32}, {"b", CsvType::kI32}}};
  EXPECT_KILN_ERROR(first_error("a,b\n1,2\n1.5,2x\n", num), kInvalidArgument,
                    "CSV file '" + f + "' line 3, column 'b': '2x' is not a valid i32");
  EXPECT_KILN_ERROR(first_error("a,b\n1,2\n1,2,3\n", num), kInvalidArgument,
                    "CSV file '" + f + "' line 3: expected 2 fields (as in the header), got 3");
  EXPECT_KILN_ERROR(first_error("a,b\n1\n", num), kInvalidArgument, "line 2: expected 2 fields (as in the header), got 1");
  EXPECT_KILN_ERROR(first_error("1,2\n3\n", {.columns = {}, .header = false}), kInvalidArgument,
                    "line 2: expected 2 fields (as in the first record), got 1");
  EXPECT_KILN_ERROR(first_error("a,b\n1,2\n3,\"4\n5,6\n", num), kDataLoss,
                    "CSV file '" + f + "' line 3: field 2: the quoted field that starts there is not closed");
  EXPECT_KILN_ERROR(first_error("a,b\n1,\"2\"x\n", num), kInvalidArgument,
                    "line 2: field 2: 'x' after a closing quote");
  EXPECT_KILN_ERROR(first_error("a,b\n1,\"2\"\rx\n", num), kInvalidArgument, "after a closing quote");
  EXPECT_KILN_ERROR(first_error("a,b\n1,2\n", {.columns = {{"x", CsvType::kI32, {}, 5}}}), kInvalidArgument,
                    "column 'x' is field 6 but the header has 2 fields");
  // A named column missing from a later file's header.
  write_bytes(dir.file("ok.csv"), "a,b\n1,2\n");
  write_bytes(dir.file("other.csv"), "a,c\n1,2\n");
  auto ds = csv_dataset({dir.file("ok.csv"), dir.file("other.csv")}, num);
  auto it = ds.iterator();
  EXPECT_TRUE(it.next().has_value());
  EXPECT_KILN_ERROR(it.next(), kInvalidArgument, "other.csv' line 1: the header has no column named 'b' (it has 'a', 'c')");
  EXPECT_FALSE(it.next().has_value());
}

TEST(CsvDataset, BuildErrors) {
  TempDir dir("csv");
  write_bytes(dir.file("a.csv"), "a,b\n1,2\n");
  write_bytes(dir.file("empty.csv"), "");
  EXPECT_KILN_ERROR(csv_dataset({dir.file("a.csv"), dir.file("nope.csv")}), kNotFound, "CSV file '" + dir.file("nope.csv"));
  EXPECT_KILN_ERROR(csv_dataset({}), kInvalidArgument, "at least one file");
  EXPECT_KILN_ERROR(csv_dataset({dir.file("a.csv")}, {.columns = {{"zz", CsvType::kF32}}}), kInvalidArgument,
                    "line 1: the header has no column named 'zz' (it has 'a', 'b')");
  EXPECT_KILN_ERROR(csv_dataset({dir.file("empty.csv")}), kInvalidArgument, "has no records");
  EXPECT_KILN_ERROR(csv_dataset({dir.file("a.csv")}, {.columns = {{"x", CsvType::kF32, {}, 0}, {"x", CsvType::kF32, {}, 1}}}),
                    kInvalidArgument, "two columns are named 'x'");
  EXPECT_KILN_ERROR(csv_dataset({dir.file("a.csv")}, {.columns = {}, .delimiter = '\n'}), kInvalidArgument, "line end");
  EXPECT_KILN_ERROR(csv_dataset({dir.file("a.csv")}, {.columns = {}, .delimiter = '"'}), kInvalidArgument, "quoting");
  EXPECT_KILN_ERROR(csv_dataset({dir.file("a.csv")}, {.columns = {{"x", CsvType::kF32, {}, -2}}}), kInvalidArgument,
                    "index must be");
  // An empty file after the first one has no records: nothing, not an error.
  auto rows = all(csv_dataset({dir.file("a.csv"), dir.file("empty.csv")}));
  EXPECT_EQ(rows.size(), 1u);
  // A quoted header name with a delimiter in it.
  write_bytes(dir.file("q.csv"), "\"x,y\",z\n1,2\n");
  rows = all(csv_dataset({dir.file("q.csv")}, {.columns = {{"x,y", CsvType::kI32}}}));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].tensor("x,y").data<int32_t>()[0], 1);
}

}  // namespace
}  // namespace kiln::data
