// tf.train.Example's feature model and examples -> dense tensors (kiln/core/example.h).
// The wire codec is in the data layer (src/data/example.cc).
#include "kiln/core/example.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "kiln/core/error.h"

namespace kiln {

Feature Feature::of_bytes(std::vector<std::string> v) {
  Feature f;
  f.kind = kBytes;
  f.bytes = std::move(v);
  return f;
}
Feature Feature::of_floats(std::vector<float> v) {
  Feature f;
  f.kind = kFloat;
  f.floats = std::move(v);
  return f;
}
Feature Feature::of_ints(std::vector<int64_t> v) {
  Feature f;
  f.kind = kInt64;
  f.ints = std::move(v);
  return f;
}

size_t Feature::size() const {
  switch (kind) {
    case kBytes: return bytes.size();
    case kFloat: return floats.size();
    case kInt64: return ints.size();
    case kNone: return 0;
  }
  return 0;
}

bool Feature::operator==(const Feature& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case kBytes: return bytes == o.bytes;
    case kFloat:
      return floats.size() == o.floats.size() &&
             (floats.empty() || std::memcmp(floats.data(), o.floats.data(), 4 * floats.size()) == 0);
    case kInt64: return ints == o.ints;
    case kNone: return true;
  }
  return false;
}

std::string_view feature_kind_name(Feature::Kind kind) {
  switch (kind) {
    case Feature::kBytes: return "bytes_list";
    case Feature::kFloat: return "float_list";
    case Feature::kInt64: return "int64_list";
    case Feature::kNone: return "no list";
  }
  return "?";
}

namespace {

const Feature* find_feature(const Features* ex, const std::string& name) {
  if (!ex) return nullptr;
  auto it = ex->find(name);
  return it == ex->end() ? nullptr : &it->second;
}

// One example's values written straight into a row of T (the fill dtype); `dtype` is the
// input's, for messages.
template <typename T>
void store_row(T* row, int64_t per, const Feature& f, DType dtype, const std::string& where) {
  auto reject = [&](const std::string& what) {
    throw InvalidArgumentError(where + ": " + what + " does not fit the input's " + std::string(dtype_name(dtype)));
  };
  switch (f.kind) {
    case Feature::kFloat:
      for (int64_t k = 0; k < per; ++k) {
        const float v = f.floats[static_cast<size_t>(k)];
        if constexpr (std::is_integral_v<T>) {
          if (v != std::trunc(v))
            throw InvalidArgumentError(where + ": float value " + detail::str_cat(v) + " for the integer input (" +
                                       std::string(dtype_name(dtype)) + ")");
          // Exactly representable bounds: [min, max + 1) as doubles.
          const double lo = static_cast<double>(std::numeric_limits<T>::min());
          const double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
          if (!(v >= lo && v < hi)) reject("value " + detail::str_cat(v));
        }
        row[k] = static_cast<T>(v);
      }
      break;
    case Feature::kInt64:
      for (int64_t k = 0; k < per; ++k) {
        const int64_t v = f.ints[static_cast<size_t>(k)];
        if constexpr (std::is_integral_v<T>)
          if (!std::in_range<T>(v)) reject("value " + std::to_string(v));
        row[k] = static_cast<T>(v);
      }
      break;
    case Feature::kBytes: {
      const std::string& b = f.bytes[0];
      for (int64_t k = 0; k < per; ++k) row[k] = static_cast<T>(b[static_cast<size_t>(k)]);
      break;
    }
    case Feature::kNone:
      break;
  }
}

std::string row_desc(std::span<const int64_t> row_dims, DType dtype) {
  std::string s = std::string(dtype_name(dtype)) + "[N";
  for (int64_t d : row_dims) s += ", " + std::to_string(d);
  return s + "]";
}

}  // namespace

Tensor dense_from_examples(std::span<const Features> examples, const Features* context,
                           const std::string& name, std::span<const int64_t> row_dims, DType dtype) {
  if (examples.empty()) throw InvalidArgumentError("Input is empty: the request has no examples");
  const int64_t n = static_cast<int64_t>(examples.size());
  int64_t per = 1;
  std::vector<int64_t> dims{n};
  for (int64_t d : row_dims) {
    KILN_CHECK_INTERNAL(d >= 0, "dense_from_examples: negative row dimension ", d);
    per *= d;
    dims.push_back(d);
  }
  // f16/bf16 inputs are filled in f32, bool ones in i64 (nonzero: true), then converted.
  const DType fill = dtype == DType::kF16 || dtype == DType::kBF16 ? DType::kF32
                     : dtype == DType::kBool                      ? DType::kI64
                                                                  : dtype;
  Tensor t = Tensor::empty(Shape(dims), fill);
  const bool bytes_ok = dtype == DType::kU8 || dtype == DType::kI8;
  for (int64_t i = 0; i < n; ++i) {
    const Feature* f = find_feature(&examples[static_cast<size_t>(i)], name);
    if (!f) f = find_feature(context, name);
    const std::string where = "examples[" + std::to_string(i) + "] feature '" + name + "'";
    if (!f) throw InvalidArgumentError(where + ": missing (the input is " + row_desc(row_dims, dtype) + ")");
    if (f->kind == Feature::kNone) throw InvalidArgumentError(where + ": the feature has no values");
    if (f->kind == Feature::kBytes && (!bytes_ok || f->bytes.size() != 1))
      throw InvalidArgumentError(where + ": bytes values fill only u8/i8 inputs, one string per example; the input is " +
                                 row_desc(row_dims, dtype));
    const int64_t got = static_cast<int64_t>(f->kind == Feature::kBytes ? f->bytes[0].size() : f->size());
    if (got != per)
      throw InvalidArgumentError(where + ": expected " + std::to_string(per) + " values (" +
                                 row_desc(row_dims, dtype) + "), got " + std::to_string(got));
    switch (fill) {
      case DType::kF32: store_row(t.data<float>() + i * per, per, *f, dtype, where); break;
      case DType::kF64: store_row(t.data<double>() + i * per, per, *f, dtype, where); break;
      case DType::kI64: store_row(t.data<int64_t>() + i * per, per, *f, dtype, where); break;
      case DType::kI32: store_row(t.data<int32_t>() + i * per, per, *f, dtype, where); break;
      case DType::kU8: store_row(t.data<uint8_t>() + i * per, per, *f, dtype, where); break;
      case DType::kI8: store_row(t.data<int8_t>() + i * per, per, *f, dtype, where); break;
      default: KILN_CHECK_INTERNAL(false, "dense_from_examples: no fill for ", dtype_name(fill));
    }
  }
  return fill != dtype ? t.to(dtype) : t;
}

}  // namespace kiln
