#include "nvml_readings.h"

#include <dlfcn.h>

namespace kiln::cuda {
namespace {

// The slice of NVML's C ABI used here (nvml.h is not shipped with the toolkit; these
// layouts and values are fixed by NVML's stable API).
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
using nvmlTemperatureSensors_t = int;
constexpr nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU = 0;
using nvmlPcieUtilCounter_t = int;
constexpr nvmlPcieUtilCounter_t NVML_PCIE_UTIL_TX_BYTES = 0;
constexpr nvmlPcieUtilCounter_t NVML_PCIE_UTIL_RX_BYTES = 1;

// The NVML entry points kiln uses, resolved once.
struct Nvml {
  std::string status;  // "" when loaded and initialised
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned int*) = nullptr;  // optional (nvmlDeviceGetEnforcedPowerLimit)
  nvmlReturn_t (*pcie)(nvmlDevice_t, nvmlPcieUtilCounter_t, unsigned int*) = nullptr;
};

template <typename F>
bool resolve(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

const Nvml& nvml() {
  static const Nvml n = [] {
    Nvml n;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      n.status = std::string("NVML not available: ") + (e ? e : "libnvidia-ml.so.1 not found");
      return n;
    }
    bool ok = resolve(lib, "nvmlInit_v2", n.init) && resolve(lib, "nvmlDeviceGetHandleByPciBusId_v2", n.by_pci) &&
              resolve(lib, "nvmlDeviceGetUtilizationRates", n.utilization) &&
              resolve(lib, "nvmlDeviceGetMemoryInfo", n.memory) &&
              resolve(lib, "nvmlDeviceGetTemperature", n.temperature) &&
              resolve(lib, "nvmlDeviceGetPowerUsage", n.power) &&
              resolve(lib, "nvmlDeviceGetPcieThroughput", n.pcie);
    resolve(lib, "nvmlDeviceGetEnforcedPowerLimit", n.power_limit);  // absent: no power_limit_watts reading
    if (!ok) {
      n.status = "NVML: a required symbol is missing from libnvidia-ml.so.1";
      n.init = nullptr;
      return n;
    }
    if (nvmlReturn_t r = n.init(); r != NVML_SUCCESS) {
      n.status = "NVML: nvmlInit failed with code " + std::to_string(r);
      n.init = nullptr;
    }
    return n;
  }();
  return n;
}

}  // namespace

std::string nvml_status() { return nvml().status; }

std::vector<DeviceReading> nvml_readings(const std::string& pci_bus_id) {
  const Nvml& n = nvml();
  std::vector<DeviceReading> out;
  nvmlDevice_t dev{};
  if (!n.init || n.by_pci(pci_bus_id.c_str(), &dev) != NVML_SUCCESS) return out;
  nvmlUtilization_t u{};
  if (n.utilization(dev, &u) == NVML_SUCCESS) {
    out.push_back({"gpu_utilization_ratio", u.gpu / 100.0, "Fraction of time a kernel ran over the last sample period"});
    out.push_back({"memory_utilization_ratio", u.memory / 100.0, "Fraction of time device memory was read or written"});
  }
  nvmlMemory_t m{};
  if (n.memory(dev, &m) == NVML_SUCCESS) {
    out.push_back({"memory_used_bytes", double(m.used), "Device memory in use by all processes"});
    out.push_back({"memory_total_bytes", double(m.total), "Device memory in all"});
  }
  unsigned int v = 0;
  if (n.temperature(dev, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS)
    out.push_back({"temperature_celsius", double(v), "GPU die temperature"});
  if (n.power(dev, &v) == NVML_SUCCESS) out.push_back({"power_watts", v / 1000.0, "Power draw of the board"});
  if (n.power_limit && n.power_limit(dev, &v) == NVML_SUCCESS)
    out.push_back({"power_limit_watts", v / 1000.0, "Power limit the driver enforces (the alert's denominator)"});
  if (n.pcie(dev, NVML_PCIE_UTIL_TX_BYTES, &v) == NVML_SUCCESS)
    out.push_back({"pcie_tx_bytes_per_second", v * 1024.0, "PCIe transmit throughput (device to host)"});
  if (n.pcie(dev, NVML_PCIE_UTIL_RX_BYTES, &v) == NVML_SUCCESS)
    out.push_back({"pcie_rx_bytes_per_second", v * 1024.0, "PCIe receive throughput (host to device)"});
  return out;
}

}  // namespace kiln::cuda
