// The CUDA backend: GPUs the CUDA runtime shows (after CUDA_VISIBLE_DEVICES), each
// split into logical devices by the device configuration with a BFC allocator over
// cudaMalloc regions; one stream per logical device; host transfers staged through
// pinned buffers. Registered when libkiln_cuda.so is loaded (kiln/core/device.h).
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_context.h"
#include "cuda_error.h"
#include "kiln/core/bfc_allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/error.h"
#include "nvml_readings.h"

namespace kiln::cuda {
namespace {

// Device memory for one logical device's BFC allocator: big regions from cudaMalloc.
class CudaSubAllocator final : public SubAllocator {
 public:
  explicit CudaSubAllocator(int physical) : physical_(physical) {}
  void* alloc_region(size_t bytes) override {
    DeviceGuard guard(physical_);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state; the BFC reports the failure
      return nullptr;
    }
    return p;
  }
  void free_region(void* ptr, size_t) override {
    DeviceGuard guard(physical_);
    cudaFree(ptr);  // synchronises the device: regions are freed only by trim()
  }

 private:
  int physical_;
};

// Pinned host buffers through which host<->device copies are staged, so that the
// DMA engine runs asynchronously: a host-to-device copy returns once its data is in
// a staging buffer; a device-to-host copy is pipelined in chunks.
class Staging {
 public:
  static constexpr size_t kChunk = 8u << 20;
  static constexpr int kChunks = 4;

  void to_device(DeviceContext& ctx, void* dst, const void* src, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ready(ctx)) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx.stream));
      KILN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
      return;
    }
    for (size_t done = 0; done < bytes;) {
      size_t n = std::min(kChunk, bytes - done);
      Chunk& c = next();
      KILN_CUDA_CHECK(cudaEventSynchronize(c.done));  // its previous copy has finished
      std::memcpy(c.host, static_cast<const char*>(src) + done, n);
      KILN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + done, c.host, n, cudaMemcpyHostToDevice, ctx.stream));
      KILN_CUDA_CHECK(cudaEventRecord(c.done, ctx.stream));
      done += n;
    }
  }

  void to_host(DeviceContext& ctx, void* dst, const void* src, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ready(ctx)) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx.stream));
      KILN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
      return;
    }
    // Chunk i is copied out on the host while chunk i+1 is in flight.
    struct Pending {
      Chunk* c;
      size_t offset, n;
    };
    std::vector<Pending> pending;
    auto drain = [&](const Pending& p) {
      KILN_CUDA_CHECK(cudaEventSynchronize(p.c->done));
      std::memcpy(static_cast<char*>(dst) + p.offset, p.c->host, p.n);
    };
    for (size_t done = 0; done < bytes;) {
      size_t n = std::min(kChunk, bytes - done);
      Chunk& c = next();
      if (!pending.empty() && pending.front().c == &c) {
        drain(pending.front());
        pending.erase(pending.begin());
      }
      KILN_CUDA_CHECK(cudaEventSynchronize(c.done));
      KILN_CUDA_CHECK(cudaMemcpyAsync(c.host, static_cast<const char*>(src) + done, n, cudaMemcpyDeviceToHost, ctx.stream));
      KILN_CUDA_CHECK(cudaEventRecord(c.done, ctx.stream));
      pending.push_back({&c, done, n});
      done += n;
    }
    for (const Pending& p : pending) drain(p);
  }

 private:
  struct Chunk {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };

  // Allocates the pinned chunks on first use; false when pinned memory is refused.
  bool ready(DeviceContext& ctx) {
    if (tried_) return !chunks_.empty();
    tried_ = true;
    DeviceGuard guard(ctx.physical);
    for (int i = 0; i < kChunks; ++i) {
      Chunk c;
      if (cudaHostAlloc(&c.host, kChunk, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming));
      chunks_.push_back(c);
    }
    if (chunks_.size() < 2) {  // a pipeline needs two
      for (Chunk& c : chunks_) {
        cudaFreeHost(c.host);
        cudaEventDestroy(c.done);
      }
      chunks_.clear();
    }
    return !chunks_.empty();
  }
  Chunk& next() {
    Chunk& c = chunks_[next_];
    next_ = (next_ + 1) % chunks_.size();
    return c;
  }

  std::mutex mu_;
  bool tried_ = false;
  std::vector<Chunk> chunks_;
  size_t next_ = 0;
};

std::string pci_bus_id(int physical) {
  char buf[32] = {};
  if (cudaDeviceGetPCIBusId(buf, sizeof buf, physical) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return buf;
}

class CudaBackend final : public Backend, public config::DeviceProvider {
 public:
  DeviceType type() const override { return DeviceType::kCUDA; }
  const char* name() const override { return "cuda"; }
  int device_count() const override { return config::logical_device_count(DeviceType::kCUDA); }

  DeviceProperties properties(int index) const override {
    return const_cast<CudaBackend*>(this)->physical_properties(config::physical_index({DeviceType::kCUDA, index}));
  }

  bool supports(DType) const override { return true; }

  Allocator& allocator(int index) override { return config::logical_allocator({DeviceType::kCUDA, index}); }

  void copy_to_host(void* dst, const void* src, size_t bytes, int index) override {
    if (bytes == 0) return;
    DeviceContext& ctx = device_context(index);
    DeviceGuard guard(ctx.physical);
    staging(index).to_host(ctx, dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, int index) override {
    if (bytes == 0) return;
    DeviceContext& ctx = device_context(index);
    DeviceGuard guard(ctx.physical);
    staging(index).to_device(ctx, dst, src, bytes);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes, int index) override {
    if (bytes == 0) return;
    DeviceContext& ctx = device_context(index);
    DeviceGuard guard(ctx.physical);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.stream));
  }
  void synchronize(int index) override {
    DeviceContext& ctx = device_context(index);
    DeviceGuard guard(ctx.physical);
    KILN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  }

  std::vector<DeviceReading> readings(int index) const override {
    try {
      return nvml_readings(pci_bus_id(config::physical_index({DeviceType::kCUDA, index})));
    } catch (const std::exception&) {
      return {};
    }
  }

  std::string no_device_reason() const override {
    std::call_once(count_once_, [this] { count_devices(); });
    return reason_;
  }

  // DeviceProvider
  int physical_device_count() override {
    std::call_once(count_once_, [this] { count_devices(); });
    return count_;
  }

  DeviceProperties physical_properties(int physical) override {
    cudaDeviceProp p{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, physical));
    DeviceProperties out;
    out.name = std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
               std::to_string(p.multiProcessorCount) + " SMs)";
    out.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
    out.compute_units = p.multiProcessorCount;
    out.features.push_back("sm_" + std::to_string(p.major) + std::to_string(p.minor));
    out.features.push_back("f16");
    if (p.major >= 8) out.features.insert(out.features.end(), {"bf16", "tf32"});
    if (p.major >= 9) out.features.push_back("fp8");
    std::string pci = pci_bus_id(physical);
    if (!pci.empty()) out.features.push_back("pci=" + pci);
    return out;
  }

  std::unique_ptr<SubAllocator> make_sub_allocator(int physical) override {
    return std::make_unique<CudaSubAllocator>(physical);
  }

 private:
  void count_devices() const {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      reason_ = std::string("the CUDA runtime found no usable GPU: ") + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ")";
      count_ = 0;
      return;
    }
    count_ = n;
    if (n == 0) reason_ = "the CUDA runtime reports no GPU (check CUDA_VISIBLE_DEVICES)";
  }

  Staging& staging(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<size_t>(index) >= staging_.size()) staging_.resize(index + 1);
    if (!staging_[index]) staging_[index] = std::make_unique<Staging>();
    return *staging_[index];
  }

  mutable std::once_flag count_once_;
  mutable int count_ = 0;
  mutable std::string reason_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Staging>> staging_;
};

// Runs when libkiln_cuda.so is loaded: must not call find_backend(kCUDA) (the loader
// holds its once-flag) nor touch the device configuration's lock.
struct Registrar {
  Registrar() {
    static CudaBackend backend;
    register_backend(DeviceType::kCUDA, &backend);
    config::register_device_provider(DeviceType::kCUDA, &backend);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
