#pragma once
// Error checks for CUDA, cuBLAS(Lt), cuDNN and NCCL calls. Included by .cu files too,
// so it names no kiln header: failures are reported through functions defined in
// cuda_error.cc, which throw kiln::InternalError (ResourceExhaustedError for device
// out-of-memory) with the call, the library's message, the file and the line.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

namespace kiln::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t s, const char* call, const char* file, int line);

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(call)                                                                 \
  do {                                                                                        \
    cudaError_t kiln_cuda_err_ = (call);                                                      \
    if (kiln_cuda_err_ != cudaSuccess) ::kiln::cuda::throw_cuda_error(kiln_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
#define KILN_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                          \
    cublasStatus_t kiln_cublas_st_ = (call);                                                    \
    if (kiln_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::kiln::cuda::throw_cublas_error(kiln_cublas_st_, #call, __FILE__, __LINE__);             \
  } while (0)
#define KILN_CUDNN_CHECK(call)                                                                              \
  do {                                                                                                      \
    cudnnStatus_t kiln_cudnn_st_ = (call);                                                                  \
    if (kiln_cudnn_st_ != CUDNN_STATUS_SUCCESS) ::kiln::cuda::throw_cudnn_error(kiln_cudnn_st_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())
