#pragma once
// Collectives among several devices of one backend, each driven by a thread of its own:
// the GPU replicas of a distribution strategy (NCCL, in the CUDA plugin). A backend that
// has them registers a factory when it loads; the distribute layer asks for a group.
//
// Thread-safety: every member calls a collective at the same time, each from its own
// thread, with its own member index; one member's calls never overlap.
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/tensor.h"

namespace kiln {

class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  // In place: member `member`'s tensors (on its device; the same shapes and float dtypes
  // on every member) become their sum over the members. Work is ordered on the device
  // with the kernels before and after it (it may return before it is done).
  virtual void all_reduce_sum(int member, std::vector<Tensor>& tensors) = 0;
};

using DeviceGroupFactory = std::unique_ptr<DeviceGroup> (*)(const std::vector<int>& device_indices);
void register_device_group_factory(DeviceType type, DeviceGroupFactory factory);

// A group over `devices` (all of one type, loaded backend), or null with `why` set when
// their backend has no collectives.
std::unique_ptr<DeviceGroup> make_device_group(const std::vector<Device>& devices, std::string* why);

}  // namespace kiln
