#pragma once
// `kiln show` and `kiln run`: inspect a model package and run one of its signatures
// on NPY files (saved_model_cli show / run).
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace kiln::tools {

struct ShowArgs {
  std::string dir;
  std::string model;  // a GGUF language model instead of a package (llm_cmds.cc)
  bool all = false;
  std::string signature;
};
CLI::App* add_show_command(CLI::App& app, ShowArgs& args);
int run_show(const ShowArgs& args);

struct RunArgs {
  std::string dir;
  std::string signature = "serving_default";
  std::vector<std::string> inputs;  // name=file.npy
  std::string output_dir;
};
CLI::App* add_run_command(CLI::App& app, RunArgs& args);
int run_run(const RunArgs& args);

}  // namespace kiln::tools
