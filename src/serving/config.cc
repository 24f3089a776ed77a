#include "config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "kiln/core/error.h"
#include "kiln/core/file_io.h"
#include "tensorflow_serving/config/monitoring_config.pb.h"
#include "tensorflow_serving/servables/tensorflow/session_bundle_config.pb.h"

namespace kiln::serving {

namespace {

class Collector : public google::protobuf::io::ErrorCollector {
 public:
  explicit Collector(std::string path) : path_(std::move(path)) {}
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty())
      first_ = path_ + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string path_;
  std::string first_;
};

void read_text_proto(const std::string& path, google::protobuf::Message* msg, const char* what) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const NotFoundError&) {
    throw NotFoundError(std::string(what) + " " + path + ": no such file");
  }
  Collector errors(path);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, msg))
    throw InvalidArgumentError(std::string(what) + " " + (errors.first().empty() ? path : errors.first()));
}

}  // namespace

tensorflow::serving::ModelServerConfig read_model_server_config(const std::string& path) {
  tensorflow::serving::ModelServerConfig c;
  read_text_proto(path, &c, "model config file");
  return c;
}

std::vector<ModelConfig> models_from_proto(const tensorflow::serving::ModelServerConfig& config) {
  if (config.config_case() == tensorflow::serving::ModelServerConfig::kCustomModelConfig)
    throw FailedPreconditionError("model config: custom_model_config is not supported; use model_config_list");
  std::vector<ModelConfig> out;
  for (const auto& c : config.model_config_list().config()) {
    ModelConfig m;
    m.name = c.name();
    m.base_path = c.base_path();
    if (!c.model_platform().empty() && c.model_platform() != "tensorflow" && c.model_platform() != "kiln")
      throw InvalidArgumentError("model config: model '" + c.name() + "': model_platform '" + c.model_platform() +
                                 "' is not served by kiln (use \"kiln\" or \"tensorflow\")");
    const auto& p = c.model_version_policy();
    using P = tensorflow::serving::FileSystemStoragePathSourceConfig::ServableVersionPolicy;
    switch (p.policy_choice_case()) {
      case P::kAll: m.policy.kind = VersionPolicy::Kind::kAll; break;
      case P::kSpecific:
        m.policy.kind = VersionPolicy::Kind::kSpecific;
        m.policy.versions.assign(p.specific().versions().begin(), p.specific().versions().end());
        break;
      case P::kLatest:
        m.policy.num_versions = std::max<int64_t>(1, p.latest().num_versions());
        break;
      default: break;
    }
    for (auto& [label, v] : c.version_labels()) m.labels[label] = v;
    for (auto& [target, w] : c.traffic_split()) m.traffic_split[target] = w;
    out.push_back(std::move(m));
  }
  return out;
}

BatchingOptions read_batching_parameters(const std::string& path) {
  tensorflow::serving::BatchingParameters p;
  read_text_proto(path, &p, "batching parameters file");
  BatchingOptions o;
  if (p.has_max_batch_size()) o.max_batch_size = p.max_batch_size().value();
  if (p.has_batch_timeout_micros()) o.batch_timeout_micros = p.batch_timeout_micros().value();
  if (p.has_max_enqueued_batches()) o.max_enqueued_batches = p.max_enqueued_batches().value();
  if (p.has_num_batch_threads()) o.num_batch_threads = static_cast<int>(p.num_batch_threads().value());
  o.allowed_batch_sizes.assign(p.allowed_batch_sizes().begin(), p.allowed_batch_sizes().end());
  o.pad_variable_length_inputs = p.pad_variable_length_inputs();
  try {
    o.validate();
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError("batching parameters file " + path + ": " + e.message());
  }
  return o;
}

MonitoringOptions read_monitoring_config(const std::string& path) {
  tensorflow::serving::MonitoringConfig c;
  read_text_proto(path, &c, "monitoring config file");
  MonitoringOptions o;
  o.enabled = c.prometheus_config().enable();
  if (!c.prometheus_config().path().empty()) o.path = c.prometheus_config().path();
  if (o.path.empty() || o.path[0] != '/')
    throw InvalidArgumentError("monitoring config file " + path + ": prometheus_config.path must start with '/'");
  return o;
}

}  // namespace kiln::serving
