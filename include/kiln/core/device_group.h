#pragma once
// Collectives among several devices of one backend, each driven by a thread of its own:
// the GPU replicas of a distribution strategy (NCCL, in the CUDA plugin), in one process
// or spanning the processes of a multi-worker job. A backend that has them registers a
// factory when it loads; the distribute layer asks for a group.
//
// Thread-safety: every member calls a collective at the same time, each from its own
// thread, with its own member index; one member's calls never overlap.
#include <functional>
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

// A group whose members are spread over several processes: this process's devices are
// members [first, first + devices) of `size`. Every process makes its part at the same
// time; `share` gives every process the bytes member 0's process passes it (the others'
// arguments are ignored): the backend's rendezvous token (NCCL's unique id), sent through
// the processes' own collectives.
struct DeviceGroupSpan {
  int first = 0;
  int size = 0;  // 0: the group is this process's devices alone
  std::function<std::string(const std::string&)> share;
};

using DeviceGroupFactory = std::unique_ptr<DeviceGroup> (*)(const std::vector<int>& device_indices,
                                                            const DeviceGroupSpan& span);
void register_device_group_factory(DeviceType type, DeviceGroupFactory factory);

// A group over `devices` (all of one type, loaded backend), or null with `why` set when
// their backend has no collectives. all_reduce_sum then sums over every member of the span.
std::unique_ptr<DeviceGroup> make_device_group(const std::vector<Device>& devices, std::string* why,
                                               const DeviceGroupSpan& span = {});

}  // namespace kiln
