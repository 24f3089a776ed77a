#include "service.h"

#include <algorithm>
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

TensorMap Service::examples_to_inputs(const package::Signature& sig, std::span<const Features> examples,
                                      const Features* context) {
  if (examples.empty()) throw InvalidArgumentError("Input is empty: the request has no examples");
  TensorMap out;
  for (const auto& in : sig.inputs) {
    const auto& shape = in.spec.shape;
    if (shape.empty() || shape[0] != -1)
      throw InvalidArgumentError("signature '" + sig.name + "' input '" + in.name + "' (" + package::spec_str(in.spec) +
                                 ") has no batch dimension: it cannot take examples");
    const std::span<const int64_t> row(shape.data() + 1, shape.size() - 1);
    if (std::any_of(row.begin(), row.end(), [](int64_t d) { return d < 0; }))
      throw InvalidArgumentError("signature '" + sig.name + "' input '" + in.name + "' (" +
                                 package::spec_str(in.spec) + ") has an open non-batch dimension: examples cannot fill it");
    out.emplace(in.name, dense_from_examples(examples, context, in.name, row, in.spec.dtype));
  }
  return out;
}

namespace {

// A tensorflow.Example proto in kiln's feature model.
Features features_of(const tensorflow::Example& example) {
  Features out;
  if (!example.has_features()) return out;
  for (const auto& [name, f] : example.features().feature()) {
    Feature& g = out[name];
    switch (f.kind_case()) {
      case tensorflow::Feature::kFloatList:
        g.kind = Feature::kFloat;
        g.floats.assign(f.float_list().value().begin(), f.float_list().value().end());
        break;
      case tensorflow::Feature::kInt64List:
        g.kind = Feature::kInt64;
        g.ints.assign(f.int64_list().value().begin(), f.int64_list().value().end());
        break;
      case tensorflow::Feature::kBytesList:
        g.kind = Feature::kBytes;
        g.bytes.assign(f.bytes_list().value().begin(), f.bytes_list().value().end());
        break;
      case tensorflow::Feature::KIND_NOT_SET:
        break;
    }
  }
  return out;
}

}  // namespace

Service::Examples Service::examples_of(const tensorflow::serving::Input& input) {
  Examples ex;
  switch (input.kind_case()) {
    case tensorflow::serving::Input::kExampleList:
      for (const auto& e : input.example_list().examples()) ex.examples.push_back(features_of(e));
      break;
    case tensorflow::serving::Input::kExampleListWithContext:
      for (const auto& e : input.example_list_with_context().examples()) ex.examples.push_back(features_of(e));
      if (input.example_list_with_context().has_context())
        ex.context = features_of(input.example_list_with_context().context());
      break;
    case tensorflow::serving::Input::KIND_NOT_SET:
      break;
  }
  if (ex.examples.empty()) throw InvalidArgumentError("Input is empty: it holds no examples");
  return ex;
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
