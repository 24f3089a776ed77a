#pragma once
// GGUF reader: llama.cpp's single-file model format (spec and kiln's checks:
// docs/formats/gguf.md). Versions 2 and 3, little-endian.
//
// The file is memory-mapped; tensor data and metadata strings are views into the
// mapping (zero copy) and stay valid while the GgufFile lives. Everything is checked
// at open: a malformed or truncated file is a DataLossError naming the field and its
// byte offset; a version or byte order kiln does not read is an UnimplementedError.
// Tensors of types kiln cannot decode still open (they are listed and sized); using
// them is the UnimplementedError.
//
// Thread-safety: immutable after open; concurrent reads are safe.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/llm/ggml_type.h"

namespace kiln::llm {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* gguf_type_name(GgufType type);

// One metadata value: a scalar, a string or an array (of scalars, strings or arrays).
struct GgufValue {
  GgufType type = GgufType::kU8;
  // Scalars: integers (signed ones sign-extended) and bool in `u`/`i`, floats in `f`.
  union {
    uint64_t u;
    int64_t i;
    double f;
  } num{0};
  std::string_view str;  // kString
  // kArray: the element type and count; elements of fixed size are read in place from
  // `raw` (little-endian), strings are in `strings`, nested arrays in `arrays`.
  GgufType element_type = GgufType::kU8;
  uint64_t count = 0;
  const char* raw = nullptr;
  std::vector<std::string_view> strings;
  std::vector<GgufValue> arrays;

  bool is_integer() const;  // u8 ... i64 (not bool)
  bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
  // Element i of a numeric array as a double / int64 (bool counts as 0/1).
  double number_at(uint64_t i) const;
  int64_t integer_at(uint64_t i) const;
};

struct GgufKv {
  std::string_view key;
  GgufValue value;
  uint64_t offset;  // of the key in the file (for messages)
};

struct GgufTensor {
  std::string_view name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the row (innermost) length
  GgmlType type;
  uint64_t offset;       // relative to the data section
  const uint8_t* data;   // in the mapping
  size_t nbytes;
  int64_t elements() const;
  int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  int64_t rows() const { return row_length() == 0 ? 0 : elements() / row_length(); }
  // The shape in NumPy/kiln order (outermost first).
  std::vector<int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
};

class GgufFile {
 public:
  // Maps and checks `path`. NotFoundError when it does not exist.
  static std::shared_ptr<const GgufFile> open(const std::string& path);
  // Checks `size` bytes at `data`, which must outlive the result (`owner` keeps them
  // alive; may be null when the caller guarantees it). `name` is used in messages.
  static std::shared_ptr<const GgufFile> parse(const char* data, size_t size, std::string name,
                                               std::shared_ptr<const void> owner = nullptr);

  uint32_t version() const { return version_; }
  const std::string& name() const { return name_; }
  size_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<GgufKv>& metadata() const { return kvs_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed look-ups. The one-argument forms throw NotFoundError for a missing key; all
  // throw InvalidArgumentError naming the key when the value has another type.
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;  // floats and integers
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string_view get_string(std::string_view key) const;
  std::string_view get_string(std::string_view key, std::string_view fallback) const;
  const GgufValue& get_array(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // NotFoundError naming it

  // The tensor decoded to f32, row-major in shape() order. UnimplementedError for a
  // type kiln cannot decode.
  std::vector<float> dequantize(const GgufTensor& t) const;

 private:
  GgufFile() = default;
  const GgufValue& require(std::string_view key) const;
  std::string name_;
  const char* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
  friend class GgufParser;
};

}  // namespace kiln::llm
