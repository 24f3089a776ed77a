// Fuzzes the TensorFlow SavedModel importer's parsers (src/package/tf_*): the first byte
// picks the target, the rest is its input.
//   0: a GraphDef, imported with input "x" f32[-1, 4] and output "y" (every variable
//      handle reads a fixed f32[4, 4]): function calls, input references, the op table,
//      the two-probe shape check;
//   1: a TensorBundle index (variables.index) over a fixed data shard: the LevelDB table,
//      header and entries, then every tensor and string read (ranges, CRC-32C, dtypes).
// Any input must import/read or throw a kiln::Error, never crash, hang or allocate far
// beyond the input's size.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kiln/core/error.h"
#include "package/tf_bundle.h"
#include "package/tf_graph_import.h"

namespace {

// A data shard of 4 KiB of pattern bytes, written once.
const std::string& shard_prefix() {
  static const std::string prefix = [] {
    char dir[] = "/tmp/kiln_tf_fuzz.XXXXXX";
    if (!mkdtemp(dir)) std::abort();
    const std::string p = std::string(dir) + "/variables";
    FILE* f = std::fopen((p + ".data-00000-of-00001").c_str(), "wb");
    if (!f) std::abort();
    for (int i = 0; i < 4096; ++i) std::fputc(i * 7 & 0xff, f);
    std::fclose(f);
    return p;
  }();
  return prefix;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size < 1) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      tensorflow::GraphDef g;
      if (!g.ParseFromString(body)) return 0;
      (void)tf::import_graph(g, {{"x", {{-1, 4}, DType::kF32}}}, {"y"},
                             [](const tensorflow::NodeDef&) { return Tensor::zeros({4, 4}, DType::kF32); });
    } else {
      auto b = tf::TensorBundle::from_index(body, shard_prefix());
      for (const std::string& k : b->keys()) {
        try {
          if (b->entry(k).dtype() == tensorflow::DT_STRING) (void)b->strings(k);
          else (void)b->tensor(k);
        } catch (const Error&) {
        }
      }
    }
  } catch (const Error&) {
  }  // anything else escapes and is reported as a crash
  return 0;
}
