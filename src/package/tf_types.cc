#include "tf_types.h"

namespace kiln::tf {

// Numbers of tensorflow/core/framework/types.proto (proto/tensorflow/core/framework/).
namespace {
constexpr int kDtFloat = 1, kDtDouble = 2, kDtInt32 = 3, kDtUint8 = 4, kDtInt8 = 6, kDtInt64 = 9,
              kDtBool = 10, kDtBfloat16 = 14, kDtHalf = 19;
}  // namespace

int tf_dtype_enum(DType t) {
  switch (t) {
    case DType::kBool: return kDtBool;
    case DType::kU8: return kDtUint8;
    case DType::kI8: return kDtInt8;
    case DType::kI32: return kDtInt32;
    case DType::kI64: return kDtInt64;
    case DType::kF16: return kDtHalf;
    case DType::kBF16: return kDtBfloat16;
    case DType::kF32: return kDtFloat;
    case DType::kF64: return kDtDouble;
  }
  return 0;  // DT_INVALID
}

std::string_view tf_dtype_name(DType t) {
  switch (t) {
    case DType::kBool: return "DT_BOOL";
    case DType::kU8: return "DT_UINT8";
    case DType::kI8: return "DT_INT8";
    case DType::kI32: return "DT_INT32";
    case DType::kI64: return "DT_INT64";
    case DType::kF16: return "DT_HALF";
    case DType::kBF16: return "DT_BFLOAT16";
    case DType::kF32: return "DT_FLOAT";
    case DType::kF64: return "DT_DOUBLE";
  }
  return "DT_INVALID";
}

std::optional<DType> from_tf_dtype(int e) {
  switch (e) {
    case kDtFloat: return DType::kF32;
    case kDtDouble: return DType::kF64;
    case kDtInt32: return DType::kI32;
    case kDtUint8: return DType::kU8;
    case kDtInt8: return DType::kI8;
    case kDtInt64: return DType::kI64;
    case kDtBool: return DType::kBool;
    case kDtBfloat16: return DType::kBF16;
    case kDtHalf: return DType::kF16;
    default: return std::nullopt;
  }
}

}  // namespace kiln::tf
