#include "service.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "kiln/core/error.h"

namespace kiln::serving {

Service::Service(ModelManager& manager, Metrics& metrics) : manager_(manager), metrics_(metrics) {
  requests_ = &metrics.counter("kiln_requests_total", "Requests answered, by model, version, API, method and status code",
                               {"model", "version", "api", "method", "code"});
  latency_ = &metrics.histogram("kiln_request_latency_seconds", "Request latency from arrival to answer",
                                {"model", "api", "method"}, latency_buckets());
  queue_ = &metrics.histogram("kiln_batch_queue_seconds", "Time requests waited in the batching queue", {"model"},
                              latency_buckets());
  compute_ = &metrics.histogram("kiln_compute_seconds", "Time the model ran for a request's batch", {"model"},
                                latency_buckets());
  batch_size_ = &metrics.histogram("kiln_batch_size", "Rows of the batches requests ran in (padding included)",
                                   {"model"}, {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024});
}

std::shared_ptr<const Servable> Service::resolve(const ModelSpec& spec) const {
  if (spec.name.empty()) throw InvalidArgumentError("the request names no model");
  if (spec.version && !spec.label.empty())
    throw InvalidArgumentError("a request may name a version or a label, not both");
  return manager_.find(spec.name, spec.version, spec.label);
}

const package::Signature& Service::signature(const Servable& s, const std::string& name, std::string_view method) {
  const std::string want = name.empty() ? package::kDefaultSignature : name;
  const package::Signature* found = nullptr;
  std::string have;
  for (const auto& sig : s.model().signatures()) {
    if (sig.name == want) found = &sig;
    have += (have.empty() ? "" : ", ") + sig.name;
  }
  // TF Serving's codes: FAILED_PRECONDITION from Predict, INVALID_ARGUMENT from
  // Classify/Regress (both HTTP 400). The message names no server path.
  if (!found)
    throw_error(method.empty() ? ErrorCode::kFailedPrecondition : ErrorCode::kInvalidArgument,
                       "Serving signature key \"" + want + "\" not found (model '" + s.model_name() + "' version " +
                           std::to_string(s.version()) + " has: " + have + ")");
  const auto& sig = *found;
  if (!method.empty() && sig.method != method) {
    auto short_name = [](std::string_view m) {
      auto p = m.rfind('/');
      return std::string(p == std::string_view::npos ? m : m.substr(p + 1));
    };
    throw InvalidArgumentError("signature '" + sig.name + "' is a " + short_name(sig.method) + " signature, not a " +
                               short_name(method) + " one (method_name " + sig.method + ")");
  }
  return sig;
}

namespace {

const tensorflow::Feature* find_feature(const tensorflow::Example* ex, const std::string& name) {
  if (!ex || !ex->has_features()) return nullptr;
  auto& m = ex->features().feature();
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace

namespace {

// One example's values written straight into a row of the input's dtype (no detour
// through f64: int64 values above 2^53 stay exact). Integer inputs take int64 values
// that fit and floats that are whole numbers in range; f16/bf16 inputs are filled in f32
// and converted once.
template <typename T>
void store_row(T* row, int64_t per, const tensorflow::Feature& f, DType dtype, const std::string& where) {
  auto reject = [&](const std::string& what) {
    throw InvalidArgumentError(where + ": " + what + " does not fit the input's " + std::string(dtype_name(dtype)));
  };
  switch (f.kind_case()) {
    case tensorflow::Feature::kFloatList:
      for (int64_t k = 0; k < per; ++k) {
        const float v = f.float_list().value(static_cast<int>(k));
        if constexpr (std::is_integral_v<T>) {
          if (v != std::trunc(v))
            throw InvalidArgumentError(where + ": float value " + kiln::detail::str_cat(v) + " for the integer input (" +
                                       std::string(dtype_name(dtype)) + ")");
          // Exactly representable bounds: [min, max + 1) as doubles.
          const double lo = static_cast<double>(std::numeric_limits<T>::min());
          const double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
          if (!(v >= lo && v < hi)) reject("value " + kiln::detail::str_cat(v));
        }
        row[k] = static_cast<T>(v);
      }
      break;
    case tensorflow::Feature::kInt64List:
      for (int64_t k = 0; k < per; ++k) {
        const int64_t v = f.int64_list().value(static_cast<int>(k));
        if constexpr (std::is_integral_v<T>)
          if (!std::in_range<T>(v)) reject("value " + std::to_string(v));
        row[k] = static_cast<T>(v);
      }
      break;
    case tensorflow::Feature::kBytesList: {
      const std::string& b = f.bytes_list().value(0);
      for (int64_t k = 0; k < per; ++k) row[k] = static_cast<T>(b[static_cast<size_t>(k)]);
      break;
    }
    default:
      break;
  }
}

}  // namespace

TensorMap Service::examples_to_inputs(const package::Signature& sig,
                                      const std::vector<const tensorflow::Example*>& examples,
                                      const tensorflow::Example* context) {
  if (examples.empty()) throw InvalidArgumentError("Input is empty: the request has no examples");
  const int64_t n = static_cast<int64_t>(examples.size());
  TensorMap out;
  for (const auto& in : sig.inputs) {
    const auto& shape = in.spec.shape;
    if (shape.empty() || shape[0] != -1)
      throw InvalidArgumentError("signature '" + sig.name + "' input '" + in.name + "' (" + package::spec_str(in.spec) +
                                 ") has no batch dimension: it cannot take examples");
    int64_t per = 1;
    std::vector<int64_t> dims{n};
    for (size_t d = 1; d < shape.size(); ++d) {
      if (shape[d] < 0)
        throw InvalidArgumentError("signature '" + sig.name + "' input '" + in.name + "' (" +
                                   package::spec_str(in.spec) + ") has an open non-batch dimension: examples cannot fill it");
      per *= shape[d];
      dims.push_back(shape[d]);
    }
    const DType dtype = in.spec.dtype;
    // f16/bf16 inputs are filled in f32, bool ones in i64 (nonzero: true), then converted.
    const DType fill = dtype == DType::kF16 || dtype == DType::kBF16 ? DType::kF32
                       : dtype == DType::kBool                      ? DType::kI64
                                                                    : dtype;
    Tensor t = Tensor::empty(Shape(dims), fill);
    const bool bytes_ok = dtype == DType::kU8 || dtype == DType::kI8;
    for (int64_t i = 0; i < n; ++i) {
      const tensorflow::Feature* f = find_feature(examples[i], in.name);
      if (!f) f = find_feature(context, in.name);
      const std::string where = "examples[" + std::to_string(i) + "] feature '" + in.name + "'";
      if (!f) throw InvalidArgumentError(where + ": missing (signature '" + sig.name + "' needs it: " +
                                         package::spec_str(in.spec) + ")");
      int64_t got = 0;
      switch (f->kind_case()) {
        case tensorflow::Feature::kFloatList: got = f->float_list().value_size(); break;
        case tensorflow::Feature::kInt64List: got = f->int64_list().value_size(); break;
        case tensorflow::Feature::kBytesList:
          if (!bytes_ok || f->bytes_list().value_size() != 1)
            throw InvalidArgumentError(where + ": bytes values fill only u8/i8 inputs, one string per example; the input is " +
                                       package::spec_str(in.spec));
          got = static_cast<int64_t>(f->bytes_list().value(0).size());
          break;
        default:
          throw InvalidArgumentError(where + ": the feature has no values");
      }
      if (got != per)
        throw InvalidArgumentError(where + ": expected " + std::to_string(per) + " values (" +
                                   package::spec_str(in.spec) + "), got " + std::to_string(got));
      switch (t.dtype()) {
        case DType::kF32: store_row(t.data<float>() + i * per, per, *f, dtype, where); break;
        case DType::kF64: store_row(t.data<double>() + i * per, per, *f, dtype, where); break;
        case DType::kI64: store_row(t.data<int64_t>() + i * per, per, *f, dtype, where); break;
        case DType::kI32: store_row(t.data<int32_t>() + i * per, per, *f, dtype, where); break;
        case DType::kU8: store_row(t.data<uint8_t>() + i * per, per, *f, dtype, where); break;
        case DType::kI8: store_row(t.data<int8_t>() + i * per, per, *f, dtype, where); break;
        default:
          KILN_CHECK_INTERNAL(false, "examples_to_inputs: no fill for ", dtype_name(fill));
      }
    }
    out.emplace(in.name, fill != dtype ? t.to(dtype) : std::move(t));
  }
  return out;
}

namespace {

const Tensor& pick_output(const package::Signature& sig, const TensorMap& outputs, const char* preferred,
                          const char* what) {
  auto it = outputs.find(preferred);
  if (it != outputs.end()) return it->second;
  const Tensor* only = nullptr;
  int floats = 0;
  for (auto& [name, t] : outputs)
    if (t.dtype() == DType::kF32 || t.dtype() == DType::kF64 || t.dtype() == DType::kF16 || t.dtype() == DType::kBF16) {
      only = &t;
      ++floats;
    }
  if (floats != 1)
    throw InvalidArgumentError("signature '" + sig.name + "' has no '" + preferred + "' output and not exactly one " +
                               "floating-point output to use as the " + what);
  return *only;
}

}  // namespace

std::vector<ClassList> Service::to_classes(const package::Signature& sig, const TensorMap& outputs) {
  Tensor scores = pick_output(sig, outputs, "scores", "scores").to(DType::kF32);
  if (scores.rank() == 1) scores = scores.reshape(Shape{scores.dim(0), 1});
  if (scores.rank() != 2)
    throw InvalidArgumentError("classify: scores must be [examples, classes], got " + scores.desc());
  const int64_t n = scores.dim(0), k = scores.dim(1);
  // Labels: a `classes` output of the same [N, K] shape (integer class ids); else the index.
  const Tensor* labels = nullptr;
  auto c = outputs.find("classes");
  if (c != outputs.end() && c->second.rank() == 2 && c->second.dim(0) == n && c->second.dim(1) == k) labels = &c->second;
  std::vector<ClassList> out(static_cast<size_t>(n));
  const float* s = scores.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    out[i].reserve(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) {
      std::string label = labels ? std::to_string(static_cast<int64_t>(labels->get_double(i * k + j))) : std::to_string(j);
      out[i].emplace_back(std::move(label), s[i * k + j]);
    }
  }
  return out;
}

std::vector<float> Service::to_regressions(const package::Signature& sig, const TensorMap& outputs) {
  Tensor v = pick_output(sig, outputs, "outputs", "regression value").to(DType::kF32);
  if (!(v.rank() == 1 || (v.rank() == 2 && v.dim(1) == 1)))
    throw InvalidArgumentError("regress: the output must be [examples] or [examples, 1], got " + v.desc());
  return v.to_vector<float>();
}

void Service::record(const std::string& model, int64_t version, std::string_view api, std::string_view method,
                     Code code, double seconds, const BatchInfo* batch) const {
  requests_->at({model, version > 0 ? std::to_string(version) : "", std::string(api), std::string(method),
                 std::string(code_name(code))}).inc();
  latency_->at({model, std::string(api), std::string(method)}).observe(seconds);
  if (batch && batch->batch_size > 0) {
    queue_->at({model}).observe(batch->queue_seconds);
    compute_->at({model}).observe(batch->compute_seconds);
    batch_size_->at({model}).observe(static_cast<double>(batch->batch_size));
  }
}

}  // namespace kiln::serving
