#pragma once
// What the REST and gRPC front ends share: resolving a request's model spec to a
// servable and signature, turning tf.Examples into a signature's inputs (classify,
// regress), turning outputs into classes/scores or regression values, and request
// accounting (metrics + the access log).
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/example.h"
#include "kiln/core/metrics.h"
#include "kiln/serving/model_manager.h"
#include "tensorflow_serving/apis/input.pb.h"

namespace kiln::serving {

struct ModelSpec {
  std::string name;
  std::optional<int64_t> version;
  std::string label;
  std::string signature;  // empty: serving_default
};

// One class of one example: label (the class index as text) and score.
using ClassList = std::vector<std::pair<std::string, float>>;

class Service {
 public:
  Service(ModelManager& manager, Metrics& metrics);
  ModelManager& manager() const { return manager_; }
  Metrics& metrics() const { return metrics_; }

  // NOT_FOUND (unknown model/version/label), UNAVAILABLE (nothing loaded yet), thrown.
  std::shared_ptr<const Servable> resolve(const ModelSpec& spec) const;
  // The named signature (empty: serving_default); an unknown one is FAILED_PRECONDITION
  // (no method given: Predict) or INVALID_ARGUMENT (classify/regress), as TF Serving.
  // `method`, when given, must match (INVALID_ARGUMENT: "signature 's' is a predict
  // signature, not a classify one").
  static const package::Signature& signature(const Servable& s, const std::string& name,
                                             std::string_view method = {});

  // Examples -> one tensor per signature input: the feature named like the input
  // (looked up in each example, then in the context) filling the input's non-batch shape
  // by kiln::dense_from_examples' rules (kiln/core/example.h). INVALID_ARGUMENT naming
  // the example, feature and sizes otherwise, or for an input without a batch dimension.
  static TensorMap examples_to_inputs(const package::Signature& sig, std::span<const Features> examples,
                                      const Features* context);
  // A classify/regress request's examples (gRPC, warm-up records) in kiln's feature
  // model; INVALID_ARGUMENT when it holds none.
  struct Examples {
    std::vector<Features> examples;
    std::optional<Features> context;
  };
  static Examples examples_of(const tensorflow::serving::Input& input);
  // Classify outputs -> per example, (label, score) for every class: the `scores`
  // output (f32 [N, K]; or the only float output), labels from a string-free `classes`
  // output of shape [N, K] when there is one, else the class index.
  static std::vector<ClassList> to_classes(const package::Signature& sig, const TensorMap& outputs);
  // Regress outputs -> one value per example: `outputs` (or the only output), [N] or [N, 1].
  static std::vector<float> to_regressions(const package::Signature& sig, const TensorMap& outputs);

  // Counts a finished request: kiln_requests_total{model,version,api,method,code} and
  // the latency / queue / compute / batch-size histograms.
  void record(const std::string& model, int64_t version, std::string_view api, std::string_view method,
              Code code, double seconds, const BatchInfo* batch = nullptr) const;

 private:
  ModelManager& manager_;
  Metrics& metrics_;
  Family<Counter>* requests_;
  Family<Histogram>* latency_;
  Family<Histogram>* queue_;
  Family<Histogram>* compute_;
  Family<Histogram>* batch_size_;
};

}  // namespace kiln::serving
