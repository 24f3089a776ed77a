#pragma once
// Devices and the Backend interface every compute backend implements.
//
// A Backend owns, per device: an allocator, data transfer to and from the host,
// and an execution queue (`synchronize` waits for all queued work). Kernels for a
// backend are registered in the op registry under its DeviceType; op code never
// names a backend. The CPU backend is always present; a CUDA backend registers
// itself when kiln is built with it.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/allocator.h"
#include "kiln/core/dtype.h"

namespace kiln {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;
const char* device_type_name(DeviceType t);

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu:0"
  static Device cpu() { return {DeviceType::kCPU, 0}; }
};
// Parses "cpu", "cpu:0", "cuda:1"; throws InvalidArgumentError.
Device parse_device(const std::string& s);

// One live reading of a device (NVML on GPUs): utilisation, memory, temperature ...
struct DeviceReading {
  std::string name;  // e.g. "utilization_ratio", "temperature_celsius"
  double value = 0;
  std::string help;  // one line, for metrics exposition
};

struct DeviceProperties {
  std::string name;          // e.g. "AMD EPYC (2 threads)"
  int64_t memory_bytes = 0;  // total memory of the device
  int compute_units = 0;     // cores / SMs
  std::vector<std::string> features;  // e.g. "avx2", "fma", "f16c", "bf16"
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType type() const = 0;
  virtual const char* name() const = 0;
  virtual int device_count() const = 0;
  virtual DeviceProperties properties(int index) const = 0;
  // Whether kernels of this backend can run `dtype` at all (some may still be missing).
  virtual bool supports(DType dtype) const = 0;
  virtual Allocator& allocator(int index) = 0;
  // Copies between a device of this backend and the host (or within the device).
  virtual void copy_to_host(void* dst, const void* src, size_t bytes, int index) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes, int index) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes, int index) = 0;
  // Waits for all queued work on the device.
  virtual void synchronize(int index) = 0;
  // Live readings of a device (empty when the backend has none). Never throws.
  virtual std::vector<DeviceReading> readings(int index) const { return {}; }
  // Why the backend sees no physical device ("" when it sees some), e.g. "no CUDA
  // driver (cudaErrorInsufficientDriver)".
  virtual std::string no_device_reason() const { return ""; }
};

// The backend for a device type, or nullptr if none is registered. For kCUDA the
// first call loads the CUDA plugin (thread-safe, once per process).
Backend* find_backend(DeviceType t);
// Why find_backend(t) returns nullptr ("" when it does not): e.g. "kiln was built
// without CUDA" or the dlopen error of libkiln_cuda.so.
std::string backend_unavailable_reason(DeviceType t);
// Throws NotFoundError if `d` has no backend or no such device index.
Backend& backend_for(const Device& d);
// Backends register themselves at static-initialisation time.
void register_backend(DeviceType t, Backend* backend);

}  // namespace kiln
