#include "kiln/core/device_group.h"

#include <array>
#include <atomic>

namespace kiln {
namespace {
std::array<std::atomic<DeviceGroupFactory>, kNumDeviceTypes> g_factories{};
}  // namespace

void register_device_group_factory(DeviceType type, DeviceGroupFactory factory) {
  g_factories[static_cast<size_t>(type)].store(factory);
}

std::unique_ptr<DeviceGroup> make_device_group(const std::vector<Device>& devices, std::string* why,
                                               const DeviceGroupSpan& span) {
  if (devices.empty()) {
    *why = "no devices";
    return nullptr;
  }
  const DeviceGroupFactory f = g_factories[static_cast<size_t>(devices[0].type)].load();
  if (!f) {
    *why = std::string("the ") + device_type_name(devices[0].type) + " backend has no collectives between devices";
    return nullptr;
  }
  std::vector<int> indices;
  for (const Device& d : devices) indices.push_back(d.index);
  return f(indices, span);
}

}  // namespace kiln
