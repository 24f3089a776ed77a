#include "tf_tensor_proto.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kiln/core/error.h"
#include "tf_types.h"

namespace kiln::tf {

namespace {

// One value repeated over a shape may not ask for more than this (a few bytes of
// request must not make the server allocate without bound).
constexpr uint64_t kMaxFilledBytes = uint64_t{2} << 30;

std::string tf_type_label(int e) {
  const auto* v = tensorflow::DataType_descriptor()->FindValueByNumber(e);
  return v ? v->name() : "dtype " + std::to_string(e);
}

// The typed list of a dtype and the element conversion TensorFlow uses for it.
template <typename Dst, typename Src, typename Conv>
void fill(const google::protobuf::RepeatedField<Src>& vals, int64_t n, void* out, Conv conv) {
  Dst* d = static_cast<Dst*>(out);
  if (static_cast<int64_t>(vals.size()) == n) {
    for (int64_t i = 0; i < n; ++i) d[i] = conv(vals.Get(static_cast<int>(i)));
  } else {  // one value fills the shape (checked by the caller)
    std::fill_n(d, n, conv(vals.Get(0)));
  }
}

template <typename Dst>
Dst cast_to(int32_t v) {
  return static_cast<Dst>(v);
}

}  // namespace

void shape_to_proto(const std::vector<int64_t>& dims, tensorflow::TensorShapeProto* proto) {
  proto->Clear();
  for (int64_t d : dims) proto->add_dim()->set_size(d);
}

Tensor tensor_from_proto(const tensorflow::TensorProto& proto, std::string_view what) {
  const std::string name(what);
  if (proto.dtype() == tensorflow::DT_STRING)
    throw InvalidArgumentError(name + ": DT_STRING tensors are not supported (kiln has no string tensors)");
  const std::optional<DType> dtype = from_tf_dtype(proto.dtype());
  if (!dtype)
    throw InvalidArgumentError(name + ": unsupported dtype " + tf_type_label(proto.dtype()) +
                               " (kiln serves DT_FLOAT, DT_DOUBLE, DT_HALF, DT_BFLOAT16, DT_INT64, DT_INT32, "
                               "DT_INT8, DT_UINT8 and DT_BOOL)");
  const std::string type_name(tf_dtype_name(*dtype));

  const auto& sp = proto.tensor_shape();
  if (sp.unknown_rank()) throw InvalidArgumentError(name + ": tensor_shape has unknown rank");
  if (sp.dim_size() > Shape::kMaxRank)
    throw InvalidArgumentError(detail::str_cat(name, ": rank ", sp.dim_size(), " exceeds kiln's maximum rank ",
                                               Shape::kMaxRank));
  std::vector<int64_t> dims;
  dims.reserve(sp.dim_size());
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : sp.dim()) {
    if (d.size() < 0)
      throw InvalidArgumentError(detail::str_cat(name, ": dimension ", dims.size(), " has size ", d.size(),
                                                 " (a tensor's sizes must be known)"));
    dims.push_back(d.size());
    if (!overflow && __builtin_mul_overflow(numel, static_cast<uint64_t>(d.size()), &numel)) overflow = true;
  }
  const Shape shape(dims);
  const size_t item = dtype_size(*dtype);
  uint64_t bytes = 0;
  if (overflow || numel > (uint64_t{1} << 62) / item)
    throw InvalidArgumentError(name + ": " + type_name + " tensor of shape " + shape.str() + " is too large");
  bytes = numel * item;
  const auto n = static_cast<int64_t>(numel);

  // The fast path: raw little-endian bytes.
  if (!proto.tensor_content().empty()) {
    const std::string& content = proto.tensor_content();
    if (content.size() != bytes)
      throw InvalidArgumentError(detail::str_cat(name, ": tensor_content has ", content.size(), " bytes, a ",
                                                 type_name, " tensor of shape ", shape.str(), " needs ", bytes));
    Tensor t = Tensor::from_bytes(content.data(), content.size(), shape, *dtype);
    if (*dtype == DType::kBool) {  // any non-zero byte is true
      auto* p = static_cast<uint8_t*>(t.raw_data());
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] != 0;
    }
    return t;
  }

  // The typed value list of the dtype.
  int count = 0;
  const char* field = "";
  switch (*dtype) {
    case DType::kF32: count = proto.float_val_size(); field = "float_val"; break;
    case DType::kF64: count = proto.double_val_size(); field = "double_val"; break;
    case DType::kI32:
    case DType::kU8:
    case DType::kI8: count = proto.int_val_size(); field = "int_val"; break;
    case DType::kI64: count = proto.int64_val_size(); field = "int64_val"; break;
    case DType::kBool: count = proto.bool_val_size(); field = "bool_val"; break;
    case DType::kF16:
    case DType::kBF16: count = proto.half_val_size(); field = "half_val"; break;
  }
  if (n == 0 && count == 0) return Tensor::empty(shape, *dtype);
  const bool fills = count == 1 && n > 1;
  if (count != n && !fills)
    throw InvalidArgumentError(detail::str_cat(name, ": a ", type_name, " tensor of shape ", shape.str(), " needs ", n,
                                               " values in ", field, " (or one to fill it, or tensor_content), got ",
                                               count));
  if (fills && bytes > kMaxFilledBytes)
    throw InvalidArgumentError(detail::str_cat(name, ": filling shape ", shape.str(), " with one value needs ", bytes,
                                               " bytes, more than the ", kMaxFilledBytes, " allowed"));

  Tensor t = Tensor::empty(shape, *dtype);
  void* out = t.raw_data();
  auto same = [](auto v) { return v; };
  switch (*dtype) {
    case DType::kF32: fill<float>(proto.float_val(), n, out, same); break;
    case DType::kF64: fill<double>(proto.double_val(), n, out, same); break;
    case DType::kI32: fill<int32_t>(proto.int_val(), n, out, same); break;
    case DType::kU8: fill<uint8_t>(proto.int_val(), n, out, cast_to<uint8_t>); break;
    case DType::kI8: fill<int8_t>(proto.int_val(), n, out, cast_to<int8_t>); break;
    case DType::kI64: fill<int64_t>(proto.int64_val(), n, out, same); break;
    case DType::kBool: fill<bool>(proto.bool_val(), n, out, same); break;
    case DType::kF16:
    case DType::kBF16:  // bit patterns in the low 16 bits
      fill<uint16_t>(proto.half_val(), n, out, cast_to<uint16_t>);
      break;
  }
  return t;
}

void tensor_to_proto(const Tensor& t0, tensorflow::TensorProto* proto, bool typed_values) {
  KILN_CHECK_ARG(t0.defined(), "tensor_to_proto: undefined tensor");
  const Tensor t = t0.device() == Device::cpu() ? t0 : t0.to(Device::cpu());
  proto->Clear();
  proto->set_dtype(static_cast<tensorflow::DataType>(tf_dtype_enum(t.dtype())));
  shape_to_proto(t.shape().vec(), proto->mutable_tensor_shape());
  const int64_t n = t.numel();
  const void* data = t.raw_data();
  if (!typed_values) {
    proto->set_tensor_content(static_cast<const char*>(data), t.nbytes());
    return;
  }
  auto put = [&](auto* field, const auto* src) {
    field->Reserve(static_cast<int>(n));
    for (int64_t i = 0; i < n; ++i) field->Add(src[i]);
  };
  switch (t.dtype()) {
    case DType::kF32: put(proto->mutable_float_val(), static_cast<const float*>(data)); break;
    case DType::kF64: put(proto->mutable_double_val(), static_cast<const double*>(data)); break;
    case DType::kI32: put(proto->mutable_int_val(), static_cast<const int32_t*>(data)); break;
    case DType::kU8: put(proto->mutable_int_val(), static_cast<const uint8_t*>(data)); break;
    case DType::kI8: put(proto->mutable_int_val(), static_cast<const int8_t*>(data)); break;
    case DType::kI64: put(proto->mutable_int64_val(), static_cast<const int64_t*>(data)); break;
    case DType::kBool: put(proto->mutable_bool_val(), static_cast<const bool*>(data)); break;
    case DType::kF16:
    case DType::kBF16: put(proto->mutable_half_val(), static_cast<const uint16_t*>(data)); break;
  }
}

}  // namespace kiln::tf
