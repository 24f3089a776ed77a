#pragma once
// tf.io.decode_raw: reinterprets the bytes of each string as little-endian values.
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/data/value.h"

namespace kiln::data {

// For a string tensor of shape S whose every value holds exactly
// numel(item_shape) * itemsize bytes, returns a `dtype` tensor of shape S + item_shape
// (item_shape empty: one dimension, the value count, which must then be the same for
// every string). InvalidArgumentError naming the index and both sizes otherwise, or for
// a bool dtype.
Tensor decode_raw(const StringTensor& bytes, DType dtype, const std::vector<int64_t>& item_shape = {});

}  // namespace kiln::data
