#include "kiln/train/device_scope.h"

namespace kiln {
namespace {
thread_local Device t_device = Device::cpu();
}  // namespace

DeviceScope::DeviceScope(Device device) : previous_(t_device) { t_device = device; }
DeviceScope::~DeviceScope() { t_device = previous_; }
Device DeviceScope::current() { return t_device; }

}  // namespace kiln
