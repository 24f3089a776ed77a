#pragma once
// kiln dtypes as TensorFlow names and numbers them (tensorflow/core/framework/types.proto):
// what REST metadata prints ("DT_FLOAT"), gRPC TensorProtos carry (1) and SavedModels store.
#include <optional>
#include <string_view>

#include "kiln/core/dtype.h"

namespace kiln::tf {

int tf_dtype_enum(DType t);                 // DT_FLOAT = 1, DT_INT64 = 9, ...
std::string_view tf_dtype_name(DType t);    // "DT_FLOAT"
std::optional<DType> from_tf_dtype(int e);  // nullopt for types kiln has no tensor for

}  // namespace kiln::tf
