#pragma once
// Writes GGUF bytes by hand, field by field, for tests of the reader's checks
// (malformed files the `gguf` package would refuse to write) and for the tiny models of
// tiny_model.h.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kiln::llm::testing {

class GgufBuilder {
 public:
  std::string bytes;
  GgufBuilder& raw(const void* p, size_t n) {
    bytes.append(static_cast<const char*>(p), n);
    return *this;
  }
  template <typename T>
  GgufBuilder& put(T v) {
    return raw(&v, sizeof v);
  }
  GgufBuilder& u32(uint32_t v) { return put(v); }
  GgufBuilder& u64(uint64_t v) { return put(v); }
  GgufBuilder& str(std::string_view s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  GgufBuilder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    raw("GGUF", 4);
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  // Metadata: the key, the value type (4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array),
  // the value; n_kv counts them.
  uint64_t n_kv = 0;
  GgufBuilder& key(std::string_view k, uint32_t type) {
    ++n_kv;
    return str(k).u32(type);
  }
  GgufBuilder& kv_u32(std::string_view k, uint32_t v) { return key(k, 4).u32(v); }
  GgufBuilder& kv_f32(std::string_view k, float v) { return key(k, 6).put(v); }
  GgufBuilder& kv_bool(std::string_view k, bool v) { return key(k, 7).put<uint8_t>(v ? 1 : 0); }
  GgufBuilder& kv_string(std::string_view k, std::string_view v) { return key(k, 8).str(v); }
  // An array of strings (element type 8) or of numbers (5 i32, 6 f32: T must match).
  template <typename T>
  GgufBuilder& kv_array(std::string_view k, uint32_t elem_type, const std::vector<T>& v) {
    key(k, 9).u32(elem_type).u64(v.size());
    for (const T& e : v) {
      if constexpr (std::is_same_v<T, std::string>) str(e);
      else put(e);
    }
    return *this;
  }
  // A tensor info: name, dims (ggml order), type id, data offset.
  GgufBuilder& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  // Zero bytes up to the next multiple of `alignment`, then `n` data bytes.
  GgufBuilder& data(size_t n, size_t alignment = 32, char fill = 0) {
    while (bytes.size() % alignment) bytes.push_back(0);
    bytes.append(n, fill);
    return *this;
  }
};

}  // namespace kiln::llm::testing
