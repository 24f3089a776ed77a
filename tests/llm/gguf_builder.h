#pragma once
// Writes GGUF bytes by hand, field by field, for tests of the reader's checks
// (malformed files the `gguf` package would refuse to write).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
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
  GgufBuilder& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  GgufBuilder& kv_string(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
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
