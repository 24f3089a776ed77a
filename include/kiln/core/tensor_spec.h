#pragma once
// Tensor metadata without data.
//
// TensorMeta: a concrete dtype and shape (what shape inference computes).
// TensorSpec: a signature's expectation: a dtype and sizes where -1 leaves a size open
// (the batch), as tf.TensorSpec; used by traced functions' input signatures and by model
// package signatures.
#include <cstdint>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"

namespace kiln {

struct TensorMeta {
  Shape shape;
  DType dtype;
};

struct TensorSpec {
  std::vector<int64_t> shape;  // -1: any size
  DType dtype = DType::kF32;
};

}  // namespace kiln
