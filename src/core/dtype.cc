#include "kiln/core/dtype.h"

#include <string>

#include "kiln/core/error.h"

namespace kiln {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBool: return "bool";
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
  }
  return "?";
}

DType dtype_from_name(std::string_view n) {
  if (n == "bool") return DType::kBool;
  if (n == "u8" || n == "uint8") return DType::kU8;
  if (n == "i8" || n == "int8") return DType::kI8;
  if (n == "i32" || n == "int32") return DType::kI32;
  if (n == "i64" || n == "int64") return DType::kI64;
  if (n == "f16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "f32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "f64" || n == "float64" || n == "double") return DType::kF64;
  throw InvalidArgumentError("unknown dtype '" + std::string(n) +
                             "'; expected one of bool u8 i8 i32 i64 f16 bf16 f32 f64");
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBool:
    case DType::kU8:
    case DType::kI8: return 1;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kI32:
    case DType::kF32: return 4;
    case DType::kI64:
    case DType::kF64: return 8;
  }
  return 0;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (is_floating(a) || is_floating(b)) {
    if (!is_floating(a)) return b;
    if (!is_floating(b)) return a;
    if ((a == DType::kF16 && b == DType::kBF16) || (a == DType::kBF16 && b == DType::kF16)) return DType::kF32;
    return dtype_size(a) >= dtype_size(b) ? a : b;
  }
  if (a == DType::kBool) return b;
  if (b == DType::kBool) return a;
  // both integral, different
  if ((a == DType::kU8 && b == DType::kI8) || (a == DType::kI8 && b == DType::kU8)) return DType::kI32;
  if (a == DType::kU8) return b;  // b is a wider signed type
  if (b == DType::kU8) return a;
  return dtype_size(a) >= dtype_size(b) ? a : b;
}

}  // namespace kiln
