#pragma once
// `kiln records`: inspect TFRecord files and convert IDX data sets into sharded
// TFRecord files of tf.train.Example records.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace kiln::tools {

struct RecordsArgs {
  // show
  std::string file;
  int64_t limit = 10;
  bool skip_corrupt = false;
  // from-idx / fashion-mnist
  std::string images, labels, out, data_dir;
  int64_t shards = 1;
  std::string compression = "auto";  // show: auto; writers: none unless given
  // Which subcommand ran (set by run_records).
  CLI::App* show = nullptr;
  CLI::App* from_idx = nullptr;
  CLI::App* fashion_mnist = nullptr;
};

// Adds `records` and its subcommands (bound to `args`) to `app`.
CLI::App* add_records_command(CLI::App& app, RecordsArgs& args);
int run_records(const RecordsArgs& args);

}  // namespace kiln::tools
