// The CPU backend: host memory through a BFC allocator, synchronous execution.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kiln/core/bfc_allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/parallel.h"

namespace kiln {
namespace {

// The container's memory cap (cgroup v2, then v1), or 0 when there is none.
int64_t cgroup_memory_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string v;
    if (!(in >> v) || v == "max") continue;
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (end && *end == '\0' && x > 0) return x;
  }
  return 0;
}

DeviceProperties host_properties() {
  DeviceProperties p;
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "cpu";
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && model == "cpu") model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && p.features.empty()) {
      for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16", "avx_vnni"})
        if (line.find(std::string(" ") + f) != std::string::npos) p.features.emplace_back(f);
    }
  }
  p.compute_units = num_threads();
  p.name = model + " (" + std::to_string(p.compute_units) + " threads)";
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  p.memory_bytes = static_cast<int64_t>(pages) * page;
  int64_t cg = cgroup_memory_limit();
  if (cg > 0 && cg < p.memory_bytes) p.memory_bytes = cg;
  return p;
}

// One physical device (the host), split into logical devices cpu:0, cpu:1, ... by the
// device configuration (kiln/core/device_config.h), each with its own allocator.
class CpuBackend final : public Backend, public config::DeviceProvider {
 public:
  DeviceType type() const override { return DeviceType::kCPU; }
  const char* name() const override { return "cpu"; }
  int device_count() const override { return config::logical_device_count(DeviceType::kCPU); }

  DeviceProperties properties(int) const override {
    static const DeviceProperties host = host_properties();  // /proc/cpuinfo is read once
    DeviceProperties p = host;
    p.compute_units = num_threads();
    p.name = p.name.substr(0, p.name.rfind(" (")) + " (" + std::to_string(p.compute_units) + " threads)";
    return p;
  }

  bool supports(DType) const override { return true; }

  Allocator& allocator(int index) override { return config::logical_allocator({DeviceType::kCPU, index}); }

  void copy_to_host(void* dst, const void* src, size_t bytes, int) override { std::memcpy(dst, src, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes, int) override { std::memcpy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes, int) override { std::memcpy(dst, src, bytes); }
  void synchronize(int) override {}

  // DeviceProvider
  int physical_device_count() override { return 1; }
  DeviceProperties physical_properties(int) override { return properties(0); }
  std::unique_ptr<SubAllocator> make_sub_allocator(int) override { return make_host_sub_allocator(); }
};

struct Registrar {
  Registrar() {
    static CpuBackend backend;
    register_backend(DeviceType::kCPU, &backend);
    config::register_device_provider(DeviceType::kCPU, &backend);
  }
} registrar;

}  // namespace
}  // namespace kiln
