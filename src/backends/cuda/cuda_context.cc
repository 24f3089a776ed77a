#include "cuda_context.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_error.h"
#include "kiln/core/device_config.h"
#include "kiln/core/error.h"
#include "kiln/core/flags.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<DeviceContext*> g_contexts[kMaxDevices];
std::mutex g_mu;

DeviceContext* create_context(int logical) {
  auto ctx = std::make_unique<DeviceContext>();
  ctx->logical = logical;
  ctx->physical = config::physical_index({DeviceType::kCUDA, logical});
  DeviceGuard guard(ctx->physical);
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&ctx->props, ctx->physical));
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  KILN_CUBLAS_CHECK(cublasLtCreate(&ctx->cublaslt));
  return ctx.release();  // lives for the process, like the CUDA context itself
}

// One host thread's handles and scratch memory on each device.
struct ThreadState {
  struct PerDevice {
    cudnnHandle_t cudnn = nullptr;
    Tensor workspace;  // u8 on the device
  };
  std::vector<PerDevice> devices;
  ~ThreadState() {
    // At process exit the driver may be gone already: errors are ignored.
    for (auto& d : devices)
      if (d.cudnn) cudnnDestroy(d.cudnn);
  }
  PerDevice& at(int logical) {
    if (static_cast<size_t>(logical) >= devices.size()) devices.resize(logical + 1);
    return devices[logical];
  }
};
thread_local ThreadState t_state;

}  // namespace

DeviceContext& device_context(int logical) {
  if (logical < 0 || logical >= kMaxDevices)
    throw NotFoundError("CUDA device index " + std::to_string(logical) + " out of range");
  if (DeviceContext* c = g_contexts[logical].load(std::memory_order_acquire)) return *c;
  std::lock_guard<std::mutex> lock(g_mu);
  if (DeviceContext* c = g_contexts[logical].load(std::memory_order_acquire)) return *c;
  if (logical >= config::logical_device_count(DeviceType::kCUDA))
    throw NotFoundError("device cuda:" + std::to_string(logical) + " does not exist");
  DeviceContext* c = create_context(logical);
  g_contexts[logical].store(c, std::memory_order_release);
  return *c;
}

cudnnHandle_t cudnn_handle(DeviceContext& ctx) {
  auto& d = t_state.at(ctx.logical);
  if (!d.cudnn) {
    DeviceGuard guard(ctx.physical);
    KILN_CUDNN_CHECK(cudnnCreate(&d.cudnn));
    KILN_CUDNN_CHECK(cudnnSetStream(d.cudnn, ctx.stream));
  }
  return d.cudnn;
}

void* workspace(DeviceContext& ctx, size_t bytes) {
  auto& d = t_state.at(ctx.logical);
  if (bytes == 0) return nullptr;
  if (!d.workspace.defined() || d.workspace.nbytes() < bytes) {
    // Round up so that a sequence of growing requests does not reallocate each time.
    size_t want = 1u << 20;
    while (want < bytes) want *= 2;
    d.workspace = Tensor();  // give the old block back first (stream order keeps it safe)
    d.workspace = Tensor::empty(Shape{static_cast<int64_t>(want)}, DType::kU8, Device{DeviceType::kCUDA, ctx.logical});
  }
  return d.workspace.raw_data();
}

DeviceGuard::DeviceGuard(int physical) {
  KILN_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != physical) KILN_CUDA_CHECK(cudaSetDevice(physical));
  else previous_ = -1;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

namespace {
DeviceContext& context_for(const Tensor& t) {
  Device d = t.device();
  if (d.type != DeviceType::kCUDA)
    throw InternalError("a CUDA kernel got a tensor on " + d.str());
  return device_context(d.index);
}
}  // namespace

KernelScope::KernelScope(const Tensor& t) : ctx(context_for(t)), guard(ctx.physical), stream(ctx.stream) {}

bool allow_tf32() { return kiln::cuda_allow_tf32(); }

}  // namespace kiln::cuda
