#pragma once
// TensorFlow Serving's configuration files, read as text protos with their line and
// column in every error: --model_config_file (ModelServerConfig),
// --batching_parameters_file (BatchingParameters), --monitoring_config_file
// (MonitoringConfig); and ModelServerConfig -> the manager's ModelConfigs (the file and
// gRPC's HandleReloadConfigRequest share it).
#include <string>
#include <vector>

#include "kiln/serving/batching.h"
#include "kiln/serving/model_manager.h"
#include "tensorflow_serving/config/model_server_config.pb.h"

namespace kiln::serving {

// InvalidArgumentError: "FILE:LINE:COL: message"; NotFoundError for a missing file.
tensorflow::serving::ModelServerConfig read_model_server_config(const std::string& path);
std::vector<ModelConfig> models_from_proto(const tensorflow::serving::ModelServerConfig& config);
BatchingOptions read_batching_parameters(const std::string& path);

struct MonitoringOptions {
  bool enabled = true;
  std::string path = "/monitoring/prometheus/metrics";
};
MonitoringOptions read_monitoring_config(const std::string& path);

}  // namespace kiln::serving
