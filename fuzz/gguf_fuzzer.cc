// Fuzzes the GGUF reader: any input must open or throw kiln::Error, never crash or
// read outside the input. Every tensor of an opened file is decoded (when its type is
// decodable and it is small), so the bounds the reader promises are exercised.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/llm/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = kiln::llm::GgufFile::parse(reinterpret_cast<const char*>(data), size, "fuzz.gguf");
    for (const kiln::llm::GgufKv& kv : f->metadata()) {
      const kiln::llm::GgufValue& v = kv.value;
      if (v.type == kiln::llm::GgufType::kArray && v.raw != nullptr && v.count > 0) (void)v.number_at(v.count - 1);
    }
    for (const kiln::llm::GgufTensor& t : f->tensors()) {
      const kiln::llm::GgmlTypeInfo* info = kiln::llm::ggml_type_info(static_cast<uint32_t>(t.type));
      if (info == nullptr) __builtin_trap();  // the reader must have refused it
      if (t.data + t.nbytes > reinterpret_cast<const uint8_t*>(data) + size) __builtin_trap();
      if (info->dequantizable && t.elements() <= (1 << 16)) (void)f->dequantize(t);
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
