#pragma once
// Device configuration flags shared by the commands that run models (kiln train,
// kiln devices): memory limit, memory growth, logical CPU devices, visible devices.
// They override the KILN_* environment variables (docs/devices.md).
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

namespace kiln::tools {

struct DeviceArgs {
  std::string memory_limit;           // "2G", "0.7", "70%", or per type "cpu=2G,cuda=0.7"
  std::optional<bool> memory_growth;  // --memory-growth / --no-memory-growth
  std::string logical_devices;        // limits of the CPU's logical devices: "1G,1G" ("0" = no limit)
  std::string visible_devices;        // "cpu:0,cuda:1", "cpu" (hide every GPU)
};

// Adds --memory-limit, --memory-growth/--no-memory-growth, --logical-devices and
// --visible-devices to `cmd`, bound to `args`.
void add_device_options(CLI::App* cmd, DeviceArgs& args);
// Applies the flags that were given through kiln::config (before any tensor exists).
// Throws InvalidArgumentError naming the flag for a bad value.
void apply_device_options(const DeviceArgs& args);

}  // namespace kiln::tools
