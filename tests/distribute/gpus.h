#pragma once
// The GPUs a test of GPU replicas runs on: up to `most` CUDA devices, or none with the
// reason (no CUDA backend, no device) for GTEST_SKIP.
#include <algorithm>
#include <string>
#include <vector>

#include "kiln/core/device.h"

namespace kiln::testing {

inline std::vector<Device> gpus_for_test(int most, std::string* why) {
  Backend* cuda = find_backend(DeviceType::kCUDA);
  if (!cuda) {
    *why = "no CUDA backend: " + backend_unavailable_reason(DeviceType::kCUDA);
    return {};
  }
  if (cuda->device_count() == 0) {
    *why = "no CUDA device: " + cuda->no_device_reason();
    return {};
  }
  std::vector<Device> gpus;
  for (int i = 0; i < std::min(most, cuda->device_count()); ++i) gpus.push_back({DeviceType::kCUDA, i});
  return gpus;
}

}  // namespace kiln::testing
