// The `kiln` command-line tool.
#include "kiln/serving/server.h"
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <map>

#include "kiln/core/error.h"
#include "kiln/core/op_def.h"
#include "kiln/core/parallel.h"
#include "kiln/core/version.h"
#include "demo.h"
#include "convert_cmd.h"
#include "devices_cmd.h"
#include "llm_cmds.h"
#include "package_cmds.h"
#include "records_cmd.h"
#include "train_cmd.h"

namespace {

int cmd_ops(bool verbose) {
  auto ops = kiln::OpRegistry::global().all();
  std::printf("%-28s %-6s %s\n", "op", "device", "dtypes");
  for (const kiln::OpDef* d : ops) {
    for (int dev = 0; dev < kiln::kNumDeviceTypes; ++dev) {
      std::string dts;
      for (int t = 0; t < kiln::kNumDTypes; ++t)
        if (d->kernel(static_cast<kiln::DeviceType>(dev), static_cast<kiln::DType>(t))) {
          if (!dts.empty()) dts += ' ';
          dts += kiln::dtype_name(static_cast<kiln::DType>(t));
        }
      if (dts.empty()) continue;
      std::printf("%-28s %-6s %s\n", d->name.c_str(), kiln::device_type_name(static_cast<kiln::DeviceType>(dev)),
                  dts.c_str());
    }
    if (verbose && !d->doc.empty()) std::printf("    %s\n", d->doc.c_str());
  }
  std::printf("%zu ops\n", ops.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `kiln serve` is the model server (the same entry point as kiln_model_server, which
  // links no training code); its flags are TensorFlow Serving's.
  if (argc > 1 && std::string_view(argv[1]) == "serve") return kiln::serving::serve_main(argc - 1, argv + 1);
  CLI::App app{"kiln: train, compile, package and serve deep-learning models"};
  // A repeated option takes its last value (as argparse does), so wrappers can pass
  // defaults before the user's own flags (scripts/run.sh --model cnn --epochs 3).
  // Subcommands inherit this.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION_STRING);
  app.require_subcommand(0, 1);
  bool verbose = false;
  auto* ops = app.add_subcommand("ops", "List every registered op with its dtypes per backend");
  ops->add_flag("-v,--verbose", verbose, "Also print each op's description");
  kiln::tools::DevicesArgs devices_args;
  auto* devices = kiln::tools::add_devices_command(app, devices_args);
  int64_t demo_n = 1024;
  auto* demo = app.add_subcommand("demo", "Numerical self-check of the op library and a matmul timing");
  demo->add_option("-n,--size", demo_n, "matmul size")->check(CLI::Range(int64_t{16}, int64_t{8192}));
  kiln::tools::TrainArgs train_args;
  auto* train = kiln::tools::add_train_command(app, train_args);
  kiln::tools::RecordsArgs records_args;
  auto* records = kiln::tools::add_records_command(app, records_args);
  kiln::tools::ShowArgs show_args;
  auto* show = kiln::tools::add_show_command(app, show_args);
  kiln::tools::RunArgs run_args;
  auto* run = kiln::tools::add_run_command(app, run_args);
  kiln::tools::ConvertArgs convert_args;
  auto* convert = kiln::tools::add_convert_command(app, convert_args);
  kiln::tools::GenerateArgs generate_args;
  auto* generate = kiln::tools::add_generate_command(app, generate_args);
  kiln::tools::ChatArgs chat_args;
  auto* chat = kiln::tools::add_chat_command(app, chat_args);
  kiln::tools::PerplexityArgs perplexity_args;
  auto* perplexity = kiln::tools::add_perplexity_command(app, perplexity_args);
  // Listed for --help; main() hands `kiln serve ...` to serve_main before parsing.
  app.add_subcommand("serve", "Serve model packages over REST and gRPC, TensorFlow Serving's flags (kiln serve --help)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*ops) return cmd_ops(verbose);
    if (*devices) return kiln::tools::run_devices(devices_args);
    if (*demo) return kiln::tools::run_demo(demo_n);
    if (*train) return kiln::tools::run_train(train_args);
    if (*records) return kiln::tools::run_records(records_args);
    if (*show) return kiln::tools::run_show(show_args);
    if (*run) return kiln::tools::run_run(run_args);
    if (*convert) return kiln::tools::run_convert(convert_args);
    if (*generate) return kiln::tools::run_generate(generate_args);
    if (*chat) return kiln::tools::run_chat(chat_args);
    if (*perplexity) return kiln::tools::run_perplexity(perplexity_args);
    std::cout << app.help();
    return 0;
  } catch (const kiln::ResourceExhaustedError& e) {
    std::fprintf(stderr, "kiln: %s\nkiln: resource exhausted: raise the limit (--memory-limit, KILN_CPU_MEMORY_LIMIT) "
                 "or use less memory (e.g. a smaller --batch-size); see docs/devices.md\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: %s\n", e.what());
    return 1;
  }
}
