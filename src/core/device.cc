#include "kiln/core/device.h"

#include <array>

#include "kiln/core/error.h"

namespace kiln {
namespace {
std::array<Backend*, kNumDeviceTypes>& backends() {
  static std::array<Backend*, kNumDeviceTypes> b{};
  return b;
}
}  // namespace

const char* device_type_name(DeviceType t) { return t == DeviceType::kCPU ? "cpu" : "cuda"; }

std::string Device::str() const { return std::string(device_type_name(type)) + ":" + std::to_string(index); }

Device parse_device(const std::string& s) {
  auto colon = s.find(':');
  std::string kind = s.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    std::string num = s.substr(colon + 1);
    if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos)
      throw InvalidArgumentError("bad device index in '" + s + "'; expected e.g. cpu:0 or cuda:1");
    index = std::stoi(num);
  }
  if (kind == "cpu") return {DeviceType::kCPU, index};
  if (kind == "cuda" || kind == "gpu") return {DeviceType::kCUDA, index};
  throw InvalidArgumentError("unknown device '" + s + "'; expected cpu[:N] or cuda[:N]");
}

void register_backend(DeviceType t, Backend* backend) { backends()[static_cast<int>(t)] = backend; }

Backend* find_backend(DeviceType t) { return backends()[static_cast<int>(t)]; }

Backend& backend_for(const Device& d) {
  Backend* b = find_backend(d.type);
  if (!b) throw NotFoundError(std::string("no backend for device type '") + device_type_name(d.type) +
                              "' in this build of kiln");
  if (d.index < 0 || d.index >= b->device_count())
    throw NotFoundError("device " + d.str() + " does not exist (" + std::to_string(b->device_count()) + " " +
                        device_type_name(d.type) + " device(s) visible)");
  return *b;
}

}  // namespace kiln
