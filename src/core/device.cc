#include "kiln/core/device.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <dlfcn.h>
#include <mutex>

#include "core/runtime_dir.h"
#include "kiln/core/error.h"
#include "kiln/core/flags.h"

namespace kiln {
namespace {
// Written at static initialisation or while a plugin loads (under call_once), read
// after: atomics keep a reader on another thread from seeing a torn pointer.
std::array<std::atomic<Backend*>, kNumDeviceTypes> g_backends{};

std::once_flag g_cuda_once;
std::string g_cuda_reason;  // written once under g_cuda_once


// Loads the CUDA plugin; its static initialisers register the backend, the device
// provider and the CUDA kernels. The handle stays open for the life of the process.
void load_cuda_plugin() {
  if (g_backends[static_cast<int>(DeviceType::kCUDA)].load()) return;  // linked in directly
  std::string path = flags().cuda_plugin;
  if (path == "none") {
    g_cuda_reason = "the CUDA backend is disabled (KILN_CUDA_PLUGIN=none)";
    return;
  }
#ifdef KILN_CUDA_PLUGIN
  // The plugin of this very version (its SONAME): a runtime never loads another's.
  if (path.empty()) path = detail::runtime_dir() + KILN_CUDA_PLUGIN;
#endif
  if (path.empty()) {
    g_cuda_reason = "kiln was built without CUDA (nvcc not found or KILN_WITH_CUDA=OFF)";
    return;
  }
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    const char* err = dlerror();
    g_cuda_reason = "the CUDA backend could not be loaded: " + std::string(err ? err : path);
    return;
  }
  if (!g_backends[static_cast<int>(DeviceType::kCUDA)].load())
    g_cuda_reason = path + " was loaded but registered no CUDA backend";
}
}  // namespace

std::string detail::runtime_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&find_backend), &info) || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

const char* device_type_name(DeviceType t) { return t == DeviceType::kCPU ? "cpu" : "cuda"; }

std::string Device::str() const { return std::string(device_type_name(type)) + ":" + std::to_string(index); }

Device parse_device(const std::string& s) {
  auto colon = s.find(':');
  std::string kind = s.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    std::string num = s.substr(colon + 1);
    if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos)
      throw InvalidArgumentError("bad device index in '" + s + "'; expected e.g. cpu:0 or cuda:1");
    index = std::stoi(num);
  }
  if (kind == "cpu") return {DeviceType::kCPU, index};
  if (kind == "cuda" || kind == "gpu") return {DeviceType::kCUDA, index};
  throw InvalidArgumentError("unknown device '" + s + "'; expected cpu[:N] or cuda[:N]");
}

void register_backend(DeviceType t, Backend* backend) { g_backends[static_cast<int>(t)].store(backend); }

Backend* find_backend(DeviceType t) {
  if (Backend* b = g_backends[static_cast<int>(t)].load(std::memory_order_acquire)) return b;
  if (t == DeviceType::kCUDA) std::call_once(g_cuda_once, load_cuda_plugin);
  return g_backends[static_cast<int>(t)].load(std::memory_order_acquire);
}

std::string backend_unavailable_reason(DeviceType t) {
  if (find_backend(t)) return "";
  if (t == DeviceType::kCUDA) return g_cuda_reason;  // set before call_once returned
  return std::string("no ") + device_type_name(t) + " backend in this build of kiln";
}

Backend& backend_for(const Device& d) {
  Backend* b = find_backend(d.type);
  if (!b) throw NotFoundError(std::string("no backend for device type '") + device_type_name(d.type) +
                              "': " + backend_unavailable_reason(d.type));
  if (d.index < 0 || d.index >= b->device_count())
    throw NotFoundError("device " + d.str() + " does not exist (" + std::to_string(b->device_count()) + " " +
                        device_type_name(d.type) + " device(s) visible)");
  return *b;
}

}  // namespace kiln
