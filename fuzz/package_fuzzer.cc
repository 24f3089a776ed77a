// Fuzzes the model-package loader past its checksums: the input is a model.pb image
// (graph, signatures, metadata), loaded against a small fixed weights file, and the
// manifest parser on the same bytes. Any input must load or throw a kiln::Error, never
// crash, hang or allocate far beyond the input's size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "package/package_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)package::internal::parse_manifest(bytes, "<fuzz manifest>");
  } catch (const DataLossError&) {
  }
  static const TensorFile weights = [] {
    TensorFile w;
    w.tensors.emplace_back("w", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
    w.tensors.emplace_back("b", Tensor::from_vector<float>({1, 2, 3}, {3}));
    w.tensors.emplace_back("i", Tensor::from_vector<int64_t>({0, 1}, {2}));
    return w;
  }();
  package::ModelPackageProto pkg;
  if (!pkg.ParseFromArray(data, static_cast<int>(size))) return 0;
  try {
    (void)package::internal::load_signatures(pkg, weights, "<fuzz>", graph::PassOptions{});
  } catch (const Error&) {
  }  // anything else escapes and is reported as a crash
  return 0;
}
