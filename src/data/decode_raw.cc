#include "kiln/data/decode_raw.h"

#include <cstring>

#include "kiln/core/error.h"

namespace kiln::data {

Tensor decode_raw(const StringTensor& bytes, DType dtype, const std::vector<int64_t>& item_shape) {
  KILN_CHECK_ARG(dtype != DType::kBool, "decode_raw: bool is not a raw type");
  const size_t item = dtype_size(dtype);
  int64_t per = 1;
  for (int64_t d : item_shape) {
    KILN_CHECK_ARG(d >= 0, "decode_raw: item_shape dimensions must be >= 0");
    per *= d;
  }
  if (item_shape.empty()) {
    size_t first = bytes.values.empty() ? 0 : bytes.values[0].size();
    KILN_CHECK_ARG(first % item == 0, "decode_raw: value 0 has ", first, " bytes, not a multiple of ", item, " (",
                   dtype_name(dtype), ")");
    per = static_cast<int64_t>(first / item);
  }
  const size_t want = static_cast<size_t>(per) * item;
  std::vector<int64_t> dims = bytes.shape.vec();
  if (item_shape.empty())
    dims.push_back(per);
  else
    dims.insert(dims.end(), item_shape.begin(), item_shape.end());
  Tensor out = Tensor::empty(Shape(dims), dtype);
  char* dst = static_cast<char*>(out.raw_data());
  for (size_t i = 0; i < bytes.values.size(); ++i) {
    const std::string& s = bytes.values[i];
    if (s.size() != want)
      throw InvalidArgumentError(detail::str_cat("decode_raw: value ", i, " has ", s.size(), " bytes, expected ", want,
                                                 " (", per, " x ", dtype_name(dtype), ")"));
    std::memcpy(dst + i * want, s.data(), want);  // x86-64 is little-endian, as TF's default
  }
  return out;
}

}  // namespace kiln::data
