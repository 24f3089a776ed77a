#pragma once
// `kiln devices`: physical devices with their properties and visibility, logical
// devices with their limits, growth mode and allocator statistics (text or JSON).
#include <CLI/CLI.hpp>

#include "device_options.h"

namespace kiln::tools {

struct DevicesArgs {
  bool json = false;
  DeviceArgs devices;  // the same flags as `kiln train`, to see their effect
};

CLI::App* add_devices_command(CLI::App& app, DevicesArgs& args);
int run_devices(const DevicesArgs& args);

}  // namespace kiln::tools
