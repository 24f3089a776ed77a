#pragma once
// kiln tensors <-> TensorFlow's TensorProto: what the server's gRPC API (serving/grpc_server.h) and
// warm-up replay (PredictionLog records) carry, and the Const nodes of an imported
// SavedModel (tf_saved_model.cc).
//
// Decoding accepts what TensorFlow writes: the raw bytes in tensor_content (its size
// must be numel * itemsize), or the typed value list of the dtype (float_val,
// double_val, int_val for int32/int8/uint8, int64_val, bool_val, half_val for the bit
// patterns of half and bfloat16) holding numel values, or a single value that fills
// the whole shape. Anything else, string tensors (kiln has none) and dtypes kiln has
// no tensors for are InvalidArgumentError naming the tensor.
#include <string_view>
#include <vector>

#include "kiln/core/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"

namespace kiln::tf {

// Throws InvalidArgumentError; `what` names the tensor in messages ("input 'x'").
Tensor tensor_from_proto(const tensorflow::TensorProto& proto, std::string_view what = "tensor");

// dtype, tensor_shape, and the elements in tensor_content (the fast path) or, with
// typed_values, in the dtype's typed list (what TensorFlow's make_tensor_proto writes
// for small tensors; mainly for tests and readable text protos).
void tensor_to_proto(const Tensor& t, tensorflow::TensorProto* proto, bool typed_values = false);

// Dims (-1: open) -> TensorShapeProto.
void shape_to_proto(const std::vector<int64_t>& dims, tensorflow::TensorShapeProto* proto);

}  // namespace kiln::tf
