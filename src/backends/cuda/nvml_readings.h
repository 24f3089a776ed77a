#pragma once
// NVML readings of a GPU (utilisation, memory, temperature, power, PCIe throughput),
// through libnvidia-ml.so.1 loaded with dlopen on first use: the library comes with
// the driver, so kiln neither links it nor fails without it (no readings then).
#include <string>
#include <vector>

#include "kiln/core/device.h"

namespace kiln::cuda {

// Readings of the GPU with this PCI bus id ("0000:41:00.0", as cudaDeviceGetPCIBusId
// gives it; NVML's device order may differ from CUDA's). Empty when NVML is missing
// or the query fails; never throws.
std::vector<DeviceReading> nvml_readings(const std::string& pci_bus_id);

// Why nvml_readings() returns nothing ("" when NVML loaded).
std::string nvml_status();

}  // namespace kiln::cuda
