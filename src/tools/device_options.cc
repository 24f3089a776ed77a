#include "device_options.h"

#include <vector>

#include "kiln/core/device_config.h"
#include "kiln/core/error.h"

namespace kiln::tools {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

// Runs a config call, prefixing an InvalidArgumentError with the flag it came from.
template <typename F>
void with_flag(const char* flag, F&& f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(std::string(flag) + ": " + e.message());
  }
}

void apply_limit(const config::PhysicalDevice& d, const config::MemoryAmount& m) {
  with_flag("--memory-limit", [&] {
    if (m.fraction > 0)
      config::set_memory_fraction(d.device, m.fraction);
    else
      config::set_memory_limit(d.device, m.bytes);
  });
}

}  // namespace

void add_device_options(CLI::App* cmd, DeviceArgs& a) {
  const char* group = "Devices (docs/devices.md)";
  cmd->add_option("--memory-limit", a.memory_limit,
                  "Memory cap of each device: bytes (512M, 2G) or a fraction of its memory (0.7, 70%); "
                  "per type: cpu=2G,cuda=0.7 (default: KILN_<TYPE>_MEMORY_LIMIT, else none)")
      ->group(group);
  auto* on = cmd->add_flag_callback("--memory-growth", [&a] { a.memory_growth = true; },
                                    "Reserve memory in growing regions on demand (the default)");
  auto* off = cmd->add_flag_callback("--no-memory-growth", [&a] { a.memory_growth = false; },
                                     "Reserve each device's whole limit at its first use");
  on->group(group)->excludes(off);
  off->group(group);
  cmd->add_option("--logical-devices", a.logical_devices,
                  "Split the CPU into logical devices cpu:0, cpu:1, ... with these limits, e.g. 1G,1G (0: no limit)")
      ->group(group);
  cmd->add_option("--visible-devices", a.visible_devices,
                  "Devices kiln may use, e.g. cpu:0,cuda:1 or cpu (hides every GPU); the CPU is always visible")
      ->group(group);
}

void apply_device_options(const DeviceArgs& a) {
  if (!a.visible_devices.empty()) config::set_visible_devices(a.visible_devices, "--visible-devices");
  if (!a.memory_limit.empty()) {
    std::vector<config::PhysicalDevice> devices = config::list_physical_devices();
    if (a.memory_limit.find('=') == std::string::npos) {
      config::MemoryAmount m = config::parse_memory_amount(a.memory_limit, "--memory-limit");
      for (const auto& d : devices) apply_limit(d, m);
    } else {
      for (const std::string& item : split(a.memory_limit, ',')) {
        size_t eq = item.find('=');
        if (eq == std::string::npos)
          throw InvalidArgumentError("--memory-limit: '" + item + "' in '" + a.memory_limit +
                                     "' is not TYPE=AMOUNT (e.g. cpu=2G,cuda=0.7)");
        std::string type = item.substr(0, eq);
        if (type != "cpu" && type != "cuda" && type != "gpu")
          throw InvalidArgumentError("--memory-limit: unknown device type '" + type + "'; expected cpu or cuda");
        DeviceType t = type == "cpu" ? DeviceType::kCPU : DeviceType::kCUDA;
        config::MemoryAmount m = config::parse_memory_amount(item.substr(eq + 1), "--memory-limit");
        for (const auto& d : devices)
          if (d.device.type == t) apply_limit(d, m);
      }
    }
  }
  if (a.memory_growth)
    for (const auto& d : config::list_physical_devices()) config::set_memory_growth(d.device, *a.memory_growth);
  if (!a.logical_devices.empty()) {
    const Device cpu = Device::cpu();
    const int64_t mem = config::list_physical_devices(DeviceType::kCPU).at(0).properties.memory_bytes;
    std::vector<config::LogicalDeviceConfig> configs;
    for (const std::string& item : split(a.logical_devices, ','))
      configs.push_back({config::parse_memory_amount(item, "--logical-devices").resolve(mem)});
    with_flag("--logical-devices", [&] { config::set_logical_device_configuration(cpu, configs); });
  }
}

}  // namespace kiln::tools
