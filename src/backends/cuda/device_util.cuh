#pragma once
// Device-side helpers shared by the .cu files of the CUDA backend (internal): the
// CUDA types behind kiln's dtypes, float conversions for 16-bit types, grid sizing,
// broadcast index maps and dtype dispatch. Names no kiln header except dtype.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "broadcast.h"
#include "cuda_error.h"
#include "kiln/core/dtype.h"

namespace kiln::cuda {

// The CUDA storage type of a kiln dtype (bool is stored as one byte, as in kiln).
template <DType D> struct CudaType;
template <> struct CudaType<DType::kBool> { using type = uint8_t; };
template <> struct CudaType<DType::kU8> { using type = uint8_t; };
template <> struct CudaType<DType::kI8> { using type = int8_t; };
template <> struct CudaType<DType::kI32> { using type = int32_t; };
template <> struct CudaType<DType::kI64> { using type = int64_t; };
template <> struct CudaType<DType::kF16> { using type = __half; };
template <> struct CudaType<DType::kBF16> { using type = __nv_bfloat16; };
template <> struct CudaType<DType::kF32> { using type = float; };
template <> struct CudaType<DType::kF64> { using type = double; };

// Arithmetic type: 16-bit floats compute in float (as kiln's CPU kernels do).
template <typename T> struct ComputeType { using type = T; };
template <> struct ComputeType<__half> { using type = float; };
template <> struct ComputeType<__nv_bfloat16> { using type = float; };
template <typename T> using compute_t = typename ComputeType<T>::type;

template <typename C, typename T>
__device__ __forceinline__ C load_as(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __half>) return static_cast<C>(__half2float(p[i]));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return static_cast<C>(__bfloat162float(p[i]));
  else return static_cast<C>(p[i]);
}
template <typename T, typename C>
__device__ __forceinline__ void store_from(T* p, int64_t i, C v) {
  if constexpr (std::is_same_v<T, __half>) p[i] = __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) p[i] = __float2bfloat16_rn(static_cast<float>(v));
  else p[i] = static_cast<T>(v);
}

constexpr int kThreads = 256;
// Blocks for n elements at kThreads per block, capped (kernels use grid-stride loops).
inline unsigned grid_for(int64_t n, int64_t per_thread = 1) {
  int64_t blocks = (n + kThreads * per_thread - 1) / (kThreads * per_thread);
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 8) blocks = 65535LL * 8;
  return static_cast<unsigned>(blocks);
}

#define KILN_GRID_STRIDE_LOOP(i, n)                                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);       \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Dispatch on a dtype: runs BODY with `T` the CUDA storage type. Unknown dtypes throw
// through the callback `fail` (a lambda returning void).
#define KILN_CUDA_CASE(D, ...)                          \
  case D: {                                             \
    using T = typename ::kiln::cuda::CudaType<D>::type; \
    __VA_ARGS__;                                        \
    break;                                              \
  }
#define KILN_CUDA_DISPATCH_FLOAT(dtype, fail, ...)                  \
  switch (dtype) {                                                  \
    KILN_CUDA_CASE(::kiln::DType::kF32, __VA_ARGS__)                \
    KILN_CUDA_CASE(::kiln::DType::kF64, __VA_ARGS__)                \
    KILN_CUDA_CASE(::kiln::DType::kF16, __VA_ARGS__)                \
    KILN_CUDA_CASE(::kiln::DType::kBF16, __VA_ARGS__)               \
    default:                                                        \
      fail();                                                       \
  }
#define KILN_CUDA_DISPATCH_ALL(dtype, fail, ...)                    \
  switch (dtype) {                                                  \
    KILN_CUDA_CASE(::kiln::DType::kBool, __VA_ARGS__)               \
    KILN_CUDA_CASE(::kiln::DType::kU8, __VA_ARGS__)                 \
    KILN_CUDA_CASE(::kiln::DType::kI8, __VA_ARGS__)                 \
    KILN_CUDA_CASE(::kiln::DType::kI32, __VA_ARGS__)                \
    KILN_CUDA_CASE(::kiln::DType::kI64, __VA_ARGS__)                \
    KILN_CUDA_CASE(::kiln::DType::kF16, __VA_ARGS__)                \
    KILN_CUDA_CASE(::kiln::DType::kBF16, __VA_ARGS__)               \
    KILN_CUDA_CASE(::kiln::DType::kF32, __VA_ARGS__)                \
    KILN_CUDA_CASE(::kiln::DType::kF64, __VA_ARGS__)                \
    default:                                                        \
      fail();                                                       \
  }

// Thrown (through cuda_error.cc) when a launcher gets a dtype it has no kernel for.
[[noreturn]] void throw_bad_dtype(const char* what, DType dtype);

}  // namespace kiln::cuda
