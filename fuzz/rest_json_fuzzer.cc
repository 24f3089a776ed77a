// Fuzzes the model server's REST JSON codec (src/serving/json_codec.h): any body must
// decode or throw kiln::Error, never crash (anything else thrown aborts the fuzzer).
// A decoded predict request fits its signature, and written back as a response
// (encode_predict, columnar and row format) it reads back as the same tensors, bit for
// bit. Decoded classify/regress examples fill a signature's inputs or throw kiln::Error.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kiln/core/error.h"
#include "serving/json_codec.h"
#include "serving/service.h"

namespace {

using kiln::DType;
using kiln::Tensor;
using kiln::package::Signature;
using kiln::package::TensorInfo;
namespace json = kiln::serving::json;

TensorInfo info(const char* name, std::vector<int64_t> shape, DType dt) {
  TensorInfo t;
  t.name = name;
  t.spec.shape = std::move(shape);
  t.spec.dtype = dt;
  return t;
}

// x: f32[-1, 3], y: u8[-1, 4] (named objects / b64 bytes) and x alone (plain lists).
const Signature& two_inputs() {
  static const Signature s = [] {
    Signature s;
    s.name = "serving_default";
    s.inputs = {info("x", {-1, 3}, DType::kF32), info("y", {-1, 4}, DType::kU8)};
    s.outputs = s.inputs;
    return s;
  }();
  return s;
}
const Signature& one_input() {
  static const Signature s = [] {
    Signature s;
    s.name = "serving_default";
    s.inputs = {info("x", {-1, 3}, DType::kF32)};
    s.outputs = s.inputs;
    return s;
  }();
  return s;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

json::PredictRequest decode(std::string_view body, const Signature& sig) {
  return json::decode_predict(body, [&](const std::string&) -> const Signature& { return sig; });
}

// `encoded` ({"outputs": ...} or {"predictions": ...}) as a request body.
std::string as_request(const std::string& encoded, bool row_format) {
  const std::string_view from = row_format ? "{\"predictions\":" : "{\"outputs\":";
  if (encoded.compare(0, from.size(), from) != 0) __builtin_trap();
  return std::string(row_format ? "{\"instances\":" : "{\"inputs\":") + encoded.substr(from.size());
}

void check_round_trip(const json::PredictRequest& r, const Signature& sig, bool row_format) {
  const std::string body = as_request(json::encode_predict(sig, r.inputs, row_format), row_format);
  json::PredictRequest back;
  try {
    back = decode(body, sig);
  } catch (const kiln::Error&) {
    __builtin_trap();  // what the codec wrote must read back
  }
  if (back.row_format != row_format || back.inputs.size() != r.inputs.size()) __builtin_trap();
  for (const auto& [name, t] : r.inputs) {
    auto it = back.inputs.find(name);
    if (it == back.inputs.end() || !same(it->second, t)) __builtin_trap();
  }
}

void check_predict(std::string_view body, const Signature& sig) {
  json::PredictRequest r;
  try {
    r = decode(body, sig);
  } catch (const kiln::Error&) {
    return;
  }
  // Every input, with the spec's dtype and a shape that fits the spec.
  if (r.inputs.size() != sig.inputs.size()) __builtin_trap();
  int64_t rows = -1;
  for (const auto& in : sig.inputs) {
    auto it = r.inputs.find(in.name);
    if (it == r.inputs.end()) __builtin_trap();
    const Tensor& t = it->second;
    if (t.dtype() != in.spec.dtype || t.rank() != static_cast<int>(in.spec.shape.size())) __builtin_trap();
    for (int k = 0; k < t.rank(); ++k) {
      if (in.spec.shape[k] >= 0 && t.dim(k) != in.spec.shape[k]) __builtin_trap();
    }
    if (r.row_format) {
      if (t.dim(0) < 1 || (rows >= 0 && t.dim(0) != rows)) __builtin_trap();
      rows = t.dim(0);
    }
  }
  check_round_trip(r, sig, false);
  if (r.row_format) check_round_trip(r, sig, true);
}

void check_examples(std::string_view body) {
  try {
    json::ExamplesRequest r = json::decode_examples(body);
    if (r.examples.empty()) __builtin_trap();
    // The decoded examples through the classify/regress fill rules
    // (kiln::dense_from_examples): a tensor of the signature's shape, or kiln::Error.
    static const Signature sig = [] {
      Signature s;
      s.name = "classify";
      s.inputs = {info("x", {-1, 3}, DType::kI32), info("y", {-1, 4}, DType::kU8)};
      return s;
    }();
    const kiln::serving::TensorMap in =
        kiln::serving::Service::examples_to_inputs(sig, r.examples, r.has_context ? &r.context : nullptr);
    for (const auto& i : sig.inputs)
      if (in.at(i.name).shape() != kiln::Shape({static_cast<int64_t>(r.examples.size()), i.spec.shape[1]}))
        __builtin_trap();
  } catch (const kiln::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  check_predict(in, two_inputs());
  check_predict(in, one_input());
  check_examples(in);
  // Errors always make valid response bodies.
  (void)json::encode_error(in);
  return 0;
}
