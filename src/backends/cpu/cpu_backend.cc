// The CPU backend: host memory through a BFC allocator, synchronous execution.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kiln/core/bfc_allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/parallel.h"

namespace kiln {
namespace {

size_t env_bytes(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (end && (*end == 'G' || *end == 'g')) x *= 1024.0 * 1024 * 1024;
  if (end && (*end == 'M' || *end == 'm')) x *= 1024.0 * 1024;
  return x > 0 ? static_cast<size_t>(x) : 0;
}

class CpuBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::kCPU; }
  const char* name() const override { return "cpu"; }
  int device_count() const override { return 1; }

  DeviceProperties properties(int) const override {
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
    return p;
  }

  bool supports(DType) const override { return true; }

  Allocator& allocator(int) override {
    // Never destroyed: tensors in static storage may outlive everything else.
    static BFCAllocator* a = [] {
      BFCOptions o;
      o.memory_limit = env_bytes("KILN_CPU_MEMORY_LIMIT");
      return new BFCAllocator(make_host_sub_allocator(), o, "cpu_bfc");
    }();
    return *a;
  }

  void copy_to_host(void* dst, const void* src, size_t bytes, int) override { std::memcpy(dst, src, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes, int) override { std::memcpy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes, int) override { std::memcpy(dst, src, bytes); }
  void synchronize(int) override {}
};

struct Registrar {
  Registrar() {
    static CpuBackend backend;
    register_backend(DeviceType::kCPU, &backend);
  }
} registrar;

}  // namespace
}  // namespace kiln
