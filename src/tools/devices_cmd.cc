#include "devices_cmd.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/device_config.h"
#include "kiln/core/flags.h"

namespace kiln::tools {
namespace {

nlohmann::json stats_json(const AllocatorStats& s) {
  return {{"bytes_in_use", s.bytes_in_use},
          {"peak_bytes_in_use", s.peak_bytes_in_use},
          {"bytes_reserved", s.bytes_reserved},
          {"bytes_limit", s.bytes_limit},
          {"largest_free_block", s.largest_free_block},
          {"largest_alloc_size", s.largest_alloc_size},
          {"num_allocs", s.num_allocs},
          {"num_regions", s.num_regions}};
}

// Why no GPU is listed ("" when some is): no CUDA backend, or one that sees no device.
std::string cuda_reason(const std::vector<config::PhysicalDevice>& phys) {
  for (const auto& p : phys)
    if (p.device.type == DeviceType::kCUDA) return "";
  Backend* b = find_backend(DeviceType::kCUDA);
  return b ? b->no_device_reason() : backend_unavailable_reason(DeviceType::kCUDA);
}

// Live readings (NVML for GPUs) of the logical device's backend.
std::vector<DeviceReading> readings_of(const Device& logical) {
  Backend* b = find_backend(logical.type);
  return b ? b->readings(logical.index) : std::vector<DeviceReading>{};
}

}  // namespace

CLI::App* add_devices_command(CLI::App& app, DevicesArgs& a) {
  auto* c = app.add_subcommand("devices",
                               "List physical devices (properties, visibility) and logical devices (limits, memory "
                               "growth, allocator statistics)");
  c->add_flag("--json", a.json, "Print JSON instead of text");
  add_device_options(c, a.devices);
  return c;
}

int run_devices(const DevicesArgs& a) {
  apply_device_options(a.devices);
  // Create every logical device's allocator, so that the statistics show what the
  // configuration reserves (the whole limit when memory growth is off).
  config::initialize_devices();
  std::vector<config::PhysicalDevice> phys = config::list_physical_devices();
  std::vector<config::LogicalDevice> logical = config::list_logical_devices();

  if (a.json) {
    nlohmann::json j;
    j["physical_devices"] = nlohmann::json::array();
    for (const auto& p : phys)
      j["physical_devices"].push_back({{"device", p.device.str()},
                                       {"name", p.properties.name},
                                       {"memory_bytes", p.properties.memory_bytes},
                                       {"compute_units", p.properties.compute_units},
                                       {"features", p.properties.features},
                                       {"visible", p.visible},
                                       {"memory_growth", config::get_memory_growth(p.device)},
                                       {"memory_limit", config::get_memory_limit(p.device)}});
    j["logical_devices"] = nlohmann::json::array();
    for (const auto& l : logical)
      j["logical_devices"].push_back({{"device", l.device.str()},
                                      {"physical_device", l.physical.str()},
                                      {"memory_limit", l.memory_limit},
                                      {"memory_growth", l.memory_growth},
                                      {"initialized", l.initialized},
                                      {"stats", stats_json(config::memory_stats(l.device))}});
    if (std::string why = cuda_reason(phys); !why.empty()) j["cuda_unavailable"] = why;
    for (size_t i = 0; i < logical.size(); ++i)
      for (const DeviceReading& r : readings_of(logical[i].device)) j["logical_devices"][i]["readings"][r.name] = r.value;
    j["cpu_isa"] = {{"detected", cpu_isa_name(detected_cpu_isa())}, {"used", cpu_isa_name(cpu_isa())}};
    j["environment"] = nlohmann::json::object();
    for (const auto& [name, value] : kiln_environment()) j["environment"][name] = value;
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::printf("Physical devices\n");
  for (const auto& p : phys) {
    std::string feats;
    for (const auto& f : p.properties.features) feats += (feats.empty() ? "" : " ") + f;
    int64_t limit = config::get_memory_limit(p.device);
    std::printf("  %-7s %-8s %s\n          memory %s  limit %s  memory growth %s  features: %s\n",
                p.device.str().c_str(), p.visible ? "visible" : "hidden", p.properties.name.c_str(),
                config::format_bytes(p.properties.memory_bytes).c_str(),
                limit ? config::format_bytes(limit).c_str() : "none",
                config::get_memory_growth(p.device) ? "on" : "off",
                feats.empty() ? "-" : feats.c_str());
  }
  if (std::string why = cuda_reason(phys); !why.empty()) std::printf("  (no GPU: %s)\n", why.c_str());
  // kiln's own CPU kernels (runtime dispatch, kiln/core/cpu_isa.h).
  std::printf("  cpu instruction set: %s (the CPU has %s; KILN_CPU_ISA caps it)\n", cpu_isa_name(cpu_isa()),
              cpu_isa_name(detected_cpu_isa()));
  std::printf("Logical devices\n");
  for (const auto& l : logical) {
    AllocatorStats s = config::memory_stats(l.device);
    std::printf("  %-7s on %-7s limit %-10s memory growth %-3s  in use %s  peak %s  reserved %s (%lld region%s)  "
                "largest free block %s\n",
                l.device.str().c_str(), l.physical.str().c_str(),
                l.memory_limit ? config::format_bytes(l.memory_limit).c_str() : "none", l.memory_growth ? "on" : "off",
                config::format_bytes(s.bytes_in_use).c_str(), config::format_bytes(s.peak_bytes_in_use).c_str(),
                config::format_bytes(s.bytes_reserved).c_str(), static_cast<long long>(s.num_regions),
                s.num_regions == 1 ? "" : "s", config::format_bytes(s.largest_free_block).c_str());
    std::string line;
    for (const DeviceReading& r : readings_of(l.device))
      line += (line.empty() ? "          " : "  ") + r.name + " " + std::to_string(r.value);
    if (!line.empty()) std::printf("%s\n", line.c_str());
  }
  std::string env;
  for (const auto& [name, value] : kiln_environment()) env += "  " + name + "=" + value + "\n";
  if (!env.empty()) std::printf("Environment\n%s", env.c_str());
  return 0;
}

}  // namespace kiln::tools
