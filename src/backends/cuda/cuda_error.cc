#include "cuda_error.h"

#include <string>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"

namespace kiln::cuda {
namespace {
std::string where(const char* call, const char* file, int line) {
  std::string f = file;
  auto slash = f.rfind('/');
  return std::string(call) + " (" + (slash == std::string::npos ? f : f.substr(slash + 1)) + ":" +
         std::to_string(line) + ")";
}
}  // namespace

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  std::string msg = std::string("CUDA error ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + " in " +
                    where(call, file, line);
  if (e == cudaErrorMemoryAllocation) throw ResourceExhaustedError(msg);
  throw InternalError(msg);
}

void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  std::string msg = std::string("cuBLAS error ") + cublasLtGetStatusName(s) + ": " + cublasLtGetStatusString(s) +
                    " in " + where(call, file, line);
  if (s == CUBLAS_STATUS_ALLOC_FAILED) throw ResourceExhaustedError(msg);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) throw UnimplementedError(msg);
  throw InternalError(msg);
}

void throw_cudnn_error(cudnnStatus_t s, const char* call, const char* file, int line) {
  std::string msg = std::string("cuDNN error: ") + cudnnGetErrorString(s) + " in " + where(call, file, line);
  if (s == CUDNN_STATUS_ALLOC_FAILED) throw ResourceExhaustedError(msg);
  if (s == CUDNN_STATUS_NOT_SUPPORTED) throw UnimplementedError(msg);
  throw InternalError(msg);
}

void throw_bad_dtype(const char* what, DType dtype) {
  throw UnimplementedError(std::string("CUDA kernel ") + what + " has no " + std::string(dtype_name(dtype)) +
                           " variant");
}

}  // namespace kiln::cuda
