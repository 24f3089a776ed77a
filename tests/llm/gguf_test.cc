// The GGUF reader against files the `gguf` Python package wrote (fixtures made by
// scripts/fixtures/gen_gguf.py), hand-made malformed files, and the real SmolLM2 file.
#include "kiln/llm/gguf.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "llm/gguf_builder.h"
#include "llm/llm_test_util.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

using testing::GgufBuilder;

std::shared_ptr<const GgufFile> fixture_file() { return GgufFile::open(kiln::testing::fixture("gguf/quant_blocks.gguf")); }

std::shared_ptr<const GgufFile> parse(const std::string& bytes) {
  return GgufFile::parse(bytes.data(), bytes.size(), "test.gguf");
}

// Expects `f` to throw E with every piece of `parts` in its message.
template <typename E, typename F>
void expect_error(F&& f, std::initializer_list<std::string_view> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const E& e) {
    for (std::string_view p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
  }
}

TEST(Gguf, ReadsEveryMetadataType) {
  auto f = fixture_file();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("test.u8"), 200);
  EXPECT_EQ(f->get_int("test.i8"), -100);
  EXPECT_EQ(f->get_int("test.u16"), 60000);
  EXPECT_EQ(f->get_int("test.i16"), -30000);
  EXPECT_EQ(f->get_int("test.u32"), 4000000000LL);
  EXPECT_EQ(f->get_int("test.i32"), -2000000000LL);
  EXPECT_EQ(f->get_float("test.f32"), 0.25);
  EXPECT_EQ(f->find("test.u64")->num.u, (1ULL << 63) + 5);
  EXPECT_THROW(f->get_int("test.u64"), OutOfRangeError);  // does not fit in int64
  EXPECT_EQ(f->get_int("test.i64"), -(1LL << 62));
  EXPECT_EQ(f->get_float("test.f64"), 1e-300);
  EXPECT_TRUE(f->get_bool("test.bool", false));
  EXPECT_EQ(f->get_string("test.string"), "h\xc3\xa9llo, \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8c\x8d");

  const GgufValue& strings = f->get_array("test.strings");
  EXPECT_EQ(strings.element_type, GgufType::kString);
  ASSERT_EQ(strings.strings.size(), 4u);
  EXPECT_EQ(strings.strings[1], "");
  EXPECT_EQ(strings.strings[3], "<|im_start|>");
  const GgufValue& floats = f->get_array("test.floats");
  ASSERT_EQ(floats.count, 3u);
  EXPECT_EQ(floats.number_at(1), -1.5);
  EXPECT_THROW(floats.integer_at(0), InvalidArgumentError);
  const GgufValue& ints = f->get_array("test.ints");
  EXPECT_EQ(ints.element_type, GgufType::kI32);
  EXPECT_EQ(ints.integer_at(2), -3);
  EXPECT_THROW(ints.integer_at(3), OutOfRangeError);
  EXPECT_EQ(f->get_array("test.bools").integer_at(1), 0);
  const GgufValue& nested = f->get_array("test.nested");
  ASSERT_EQ(nested.arrays.size(), 2u);
  EXPECT_EQ(nested.arrays[0].integer_at(1), 2);
  EXPECT_EQ(nested.arrays[1].count, 1u);

  // Typed look-ups name the key and what it is.
  expect_error<InvalidArgumentError>([&] { f->get_int("test.string"); }, {"'test.string'", "is string", "expected an integer"});
  expect_error<InvalidArgumentError>([&] { f->get_string("test.ints"); }, {"array of i32"});
  expect_error<NotFoundError>([&] { f->get_int("llama.block_count"); }, {"'llama.block_count' is missing"});
  EXPECT_EQ(f->get_int("llama.block_count", 7), 7);
  expect_error<NotFoundError>([&] { f->tensor("output.weight"); }, {"tensor 'output.weight' is missing"});
}

TEST(Gguf, TypeTableMatchesTheGgufPackage) {
  auto f = fixture_file();
  const GgufValue& sizes = f->get_array("test.type_sizes");
  ASSERT_EQ(sizes.count % 3, 0u);
  ASSERT_GT(sizes.count, 30u);
  for (uint64_t i = 0; i < sizes.count; i += 3) {
    const auto id = static_cast<uint32_t>(sizes.integer_at(i));
    const GgmlTypeInfo* info = ggml_type_info(id);
    ASSERT_NE(info, nullptr) << "type id " << id;
    EXPECT_EQ(info->block_elements, sizes.integer_at(i + 1)) << info->name;
    EXPECT_EQ(static_cast<int64_t>(info->block_bytes), sizes.integer_at(i + 2)) << info->name;
  }
  EXPECT_EQ(ggml_type_info(4), nullptr);  // q4_2: removed from ggml
  EXPECT_EQ(ggml_type_name(4), "type 4");
  EXPECT_EQ(ggml_row_bytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_THROW(ggml_row_bytes(GgmlType::kQ4_K, 100), InvalidArgumentError);
}

// Every decodable type against the gguf package's numpy dequantisers on random blocks.
TEST(Gguf, DequantizeMatchesTheGgufPackage) {
  auto f = fixture_file();
  int checked = 0;
  for (const char* type : {"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K"}) {
    SCOPED_TRACE(type);
    const GgufTensor& q = f->tensor(std::string("q.") + type);
    const GgufTensor& ref = f->tensor(std::string("ref.") + type);
    EXPECT_EQ(ggml_type_name(static_cast<uint32_t>(q.type)), type);
    EXPECT_EQ(q.shape(), (std::vector<int64_t>{3, 512}));
    EXPECT_EQ(q.rows(), 3);
    ASSERT_EQ(ref.type, GgmlType::kF32);
    const std::vector<float> got = f->dequantize(q);
    const std::vector<float> want = f->dequantize(ref);
    ASSERT_EQ(got.size(), want.size());
    float max_abs = 0;
    for (float v : want) max_abs = std::max(max_abs, std::fabs(v));
    ASSERT_GT(max_abs, 0.0f);
    // Layout mistakes give O(1) errors; the tolerance only absorbs fused multiply-adds.
    const float tol = 2e-6f * max_abs;
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 5) ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
    EXPECT_EQ(bad, 0);
    // Row by row gives the same as the whole tensor.
    std::vector<float> row(512);
    const size_t row_bytes = ggml_row_bytes(q.type, 512);
    dequantize_row(q.type, q.data + 2 * row_bytes, row.data(), 512);
    EXPECT_EQ(0, std::memcmp(row.data(), got.data() + 1024, 512 * sizeof(float)));
    ++checked;
  }
  EXPECT_EQ(checked, 11);
  std::vector<float> out(32);
  const std::vector<uint8_t> block(84, 0);
  expect_error<UnimplementedError>([&] { dequantize_row(GgmlType::kQ2_K, block.data(), out.data(), 256); }, {"q2_K"});
  expect_error<InvalidArgumentError>([&] { dequantize_row(GgmlType::kQ4_0, block.data(), out.data(), 31); }, {"not whole blocks"});
}

TEST(Gguf, ZeroCopyViewsIntoTheMapping) {
  const std::string path = kiln::testing::fixture("gguf/quant_blocks.gguf");
  auto f = GgufFile::open(path);
  const std::string bytes = read_file(path);
  const GgufTensor& t = f->tensor("q.q4_K");
  EXPECT_EQ(t.nbytes, 3 * 288u);
  EXPECT_EQ(0u, (f->data_offset() + t.offset) % 32);
  EXPECT_EQ(0, std::memcmp(t.data, bytes.data() + f->data_offset() + t.offset, t.nbytes));
  // The views outlive every other handle to the file.
  std::string_view arch = f->get_string("general.architecture");
  auto keep = f;
  f.reset();
  EXPECT_EQ(arch, "llama");
  EXPECT_EQ(keep->file_size(), bytes.size());
}

// Every prefix of a valid file that cuts a header field or a tensor is a DataLossError
// naming a byte offset; none crashes (AddressSanitizer runs this too).
TEST(Gguf, EveryTruncationIsDataLoss) {
  const std::string bytes = read_file(kiln::testing::fixture("gguf/quant_blocks.gguf"));
  auto f = parse(bytes);
  uint64_t data_end = 0;
  for (const GgufTensor& t : f->tensors()) data_end = std::max(data_end, f->data_offset() + t.offset + t.nbytes);
  ASSERT_LE(data_end, bytes.size());
  int checked = 0;
  for (size_t n = 0; n < data_end; n += n < f->data_offset() + 64 ? 1 : 997) {
    // A heap copy of exactly n bytes, so that AddressSanitizer sees any read past it.
    std::unique_ptr<char[]> copy(new char[n ? n : 1]);
    std::memcpy(copy.get(), bytes.data(), n);
    try {
      GgufFile::parse(copy.get(), n, "cut.gguf");
      ADD_FAILURE() << "a file cut at " << n << " bytes opened";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find("byte offset"), std::string::npos) << e.what();
    }
    ++checked;
  }
  EXPECT_GT(checked, 2000);
}

TEST(Gguf, VersionsAndByteOrder) {
  GgufBuilder v2;
  v2.header(0, 1, 2).kv_u32("general.alignment", 64);
  auto f = parse(v2.bytes);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);

  GgufBuilder v1;
  v1.header(0, 0, 1);
  expect_error<UnimplementedError>([&] { parse(v1.bytes); }, {"GGUF version 1 is not supported"});
  GgufBuilder big;
  big.header(0, 0, 0x03000000);
  expect_error<UnimplementedError>([&] { parse(big.bytes); }, {"big-endian"});
  GgufBuilder v9;
  v9.header(0, 0, 9);
  expect_error<DataLossError>([&] { parse(v9.bytes); }, {"version is 9, expected 2 or 3", "byte offset 4"});
  expect_error<DataLossError>([&] { parse("GGML\x03\0\0\0"); }, {"magic is not 'GGUF'", "byte offset 0"});
  expect_error<NotFoundError>([&] { GgufFile::open("/nonexistent/model.gguf"); }, {"/nonexistent/model.gguf"});
}

TEST(Gguf, EmptyStringsAndArrays) {
  GgufBuilder b;
  b.header(0, 2).kv_string("a.empty", "");
  b.str("a.none").u32(9).u32(4).u64(0);  // array of 0 u32
  auto f = parse(b.bytes);
  EXPECT_EQ(f->get_string("a.empty"), "");
  EXPECT_EQ(f->get_array("a.none").count, 0u);
  EXPECT_TRUE(f->tensors().empty());
}

TEST(Gguf, MalformedFilesNameFieldAndOffset) {
  {  // a value type that does not exist
    GgufBuilder b;
    b.header(0, 1).str("k").u32(13).u32(0);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"metadata 'k' has value type 13", "byte offset 33"});
  }
  {  // an array element type that does not exist
    GgufBuilder b;
    b.header(0, 1).str("k").u32(9).u32(77).u64(1);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"array of type 77"});
  }
  {  // an array longer than the file
    GgufBuilder b;
    b.header(0, 1).str("tokens").u32(9).u32(8).u64(1ULL << 40);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"'tokens' has 1099511627776 elements", "truncated"});
  }
  {  // a string longer than the file
    GgufBuilder b;
    b.header(0, 1).str("k").u32(8).u64(~0ULL);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"value of metadata 'k' is 18446744073709551615 bytes long"});
  }
  {  // counts that cannot fit
    GgufBuilder b;
    b.header(1ULL << 60, 0);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"tensor count 1152921504606846976 cannot fit"});
  }
  {  // arrays nested without end
    GgufBuilder b;
    b.header(0, 1).str("deep");
    b.u32(9);
    for (int i = 0; i < 20; ++i) b.u32(9).u64(1);
    b.u32(4).u64(0);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"nests arrays deeper than 8"});
  }
  {  // the same key twice
    GgufBuilder b;
    b.header(0, 2).kv_u32("k", 1).kv_u32("k", 2);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"metadata key 'k' appears twice"});
  }
  {  // alignment not a power of two, or not a u32
    GgufBuilder b;
    b.header(0, 1).kv_u32("general.alignment", 24);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"general.alignment must be a u32 power of two, it is 24"});
    GgufBuilder c;
    c.header(0, 1).kv_string("general.alignment", "32");
    expect_error<DataLossError>([&] { parse(c.bytes); }, {"it is a string"});
  }
  {  // an unknown tensor type
    GgufBuilder b;
    b.header(1, 0).tensor("w", {32}, 4, 0).data(32);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"tensor 'w' has type id 4, which is not a ggml type"});
  }
  {  // dimensions: none, too many, overflowing
    GgufBuilder b;
    b.header(1, 0).tensor("w", {}, 0, 0);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"tensor 'w' has 0 dimensions, expected 1 to 4"});
    GgufBuilder c;
    c.header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0);
    expect_error<DataLossError>([&] { parse(c.bytes); }, {"has 5 dimensions"});
    GgufBuilder d;
    d.header(1, 0).tensor("w", {1ULL << 32, 1ULL << 32}, 0, 0);
    expect_error<DataLossError>([&] { parse(d.bytes); }, {"dimension 1 = 4294967296 overflows"});
  }
  {  // rows that are not whole blocks
    GgufBuilder b;
    b.header(1, 0).tensor("blk.0.attn_q.weight", {576, 2}, 12, 0).data(4096);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"rows have 576 elements, not a multiple of the q4_K block (256)"});
  }
  {  // a misaligned data offset
    GgufBuilder b;
    b.header(1, 0).tensor("w", {8}, 0, 4).data(64);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"data offset 4 is not a multiple of the alignment 32"});
  }
  {  // tensor data past the end of the file
    GgufBuilder b;
    b.header(1, 0).tensor("w", {64}, 0, 0).data(100);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"tensor 'w' (256 bytes at data offset 0) runs past the end", "has 100 bytes"});
  }
  {  // overlapping tensors
    GgufBuilder b;
    b.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).data(128);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"tensor 'b' at data offset 32 overlaps tensor 'a'"});
  }
  {  // the same tensor name twice
    GgufBuilder b;
    b.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).data(64);
    expect_error<DataLossError>([&] { parse(b.bytes); }, {"tensor name 'a' appears twice"});
  }
  {  // a type kiln does not decode opens; decoding it names the type
    GgufBuilder b;
    b.header(1, 0).tensor("w", {256}, 10, 0).data(84);
    auto f = parse(b.bytes);
    const GgufTensor& w = f->tensor("w");
    EXPECT_EQ(w.nbytes, 84u);
    expect_error<UnimplementedError>([&] { f->dequantize(w); }, {"q2_K"});
  }
}

TEST(Gguf, RealSmolLM2File) {
  auto f = GgufFile::open(testing::smollm2_path());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f->get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_array("tokenizer.ggml.tokens").strings.size(), 49152u);
  EXPECT_EQ(f->get_array("tokenizer.ggml.merges").strings.size(), 48900u);
  EXPECT_NE(f->get_string("tokenizer.chat_template").find("<|im_start|>"), std::string_view::npos);
  int64_t params = 0;
  int q4_1 = 0, f32 = 0;
  for (const GgufTensor& t : f->tensors()) {
    params += t.elements();
    q4_1 += t.type == GgmlType::kQ4_1;
    f32 += t.type == GgmlType::kF32;
  }
  EXPECT_EQ(params, 134515008);
  EXPECT_EQ(q4_1, 210);
  EXPECT_EQ(f32, 61);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied embeddings
  const GgufTensor& emb = f->tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::kQ8_0);
  EXPECT_EQ(emb.shape(), (std::vector<int64_t>{49152, 576}));
  // Decoded norm weights and embeddings are finite and not all zero.
  for (const char* name : {"blk.0.attn_norm.weight", "blk.29.ffn_down.weight", "token_embd.weight"}) {
    const std::vector<float> v = f->dequantize(f->tensor(name));
    double sum = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << name;
      sum += std::fabs(x);
    }
    EXPECT_GT(sum, 0) << name;
  }
}

}  // namespace
}  // namespace kiln::llm
