#pragma once
// Per-device state of the CUDA backend (internal).
//
// Each logical CUDA device (kiln/core/device_config.h: one GPU, or a slice of one
// with its own memory limit) has one non-blocking stream on which all of kiln's work
// for it is enqueued, in program order, from every host thread. Memory from the BFC
// allocator is therefore reusable as soon as the host frees it: anything that
// later reuses the memory is enqueued after everything that used it before.
//
// Library handles: one cuBLASLt handle per device (thread-safe); a cuDNN handle and a
// workspace per (host thread, device), since cuDNN handles must not be used
// concurrently and a shared, growable workspace could be freed under another thread's
// queued kernel.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <string>

#include "kiln/core/tensor.h"

namespace kiln::cuda {

struct DeviceContext {
  int logical = 0;
  int physical = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  cudaDeviceProp props{};
};

// The context of logical device `logical` (created on first use: sets the device,
// creates the stream and handles). Throws NotFoundError for an unknown device.
DeviceContext& device_context(int logical);

// This thread's cuDNN handle for the device, bound to its stream.
cudnnHandle_t cudnn_handle(DeviceContext& ctx);
// This thread's scratch memory on the device, at least `bytes` (grown on demand;
// valid until this thread asks again with a larger size).
void* workspace(DeviceContext& ctx, size_t bytes);

// Makes a physical device current for the calling thread; restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int physical);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// What a kernel needs: the device of `t` (a CUDA tensor) made current, its context
// and stream.
struct KernelScope {
  explicit KernelScope(const Tensor& t);
  DeviceContext& ctx;
  DeviceGuard guard;
  cudaStream_t stream;
};

// TF32 for f32 matmuls and convolutions (on by default on Ampere and later, as in
// TensorFlow; KILN_CUDA_ALLOW_TF32=0 turns it off). Read once.
bool allow_tf32();

}  // namespace kiln::cuda
