#pragma once
// `kiln convert`: a model package optimised and lowered to fp32/fp16/bf16/int8, with
// the accuracy and latency change when validation data is given.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace kiln::tools {

struct ConvertArgs {
  std::string dir;
  std::string output_dir;
  std::string precision = "fp32";
  std::string calibration_data;  // FILE.npy (the signature's single input) or fashion-mnist[:N]
  std::string validation_data;   // fashion-mnist[:N]
  std::string signature = "serving_default";
  int64_t batch_size = 64;       // latency comparison batch
  bool overwrite = false;
};

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& args);
int run_convert(const ConvertArgs& args);

}  // namespace kiln::tools
