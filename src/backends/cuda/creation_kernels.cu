// Creation kernels: fill (16-byte vector stores), eye, arange.
#include "creation_launch.h"
#include "device_util.cuh"

namespace kiln::cuda {
namespace {

// out[0, head) and the tail one element at a time; the 16-byte-aligned middle as
// `groups` vectors.
template <typename U>
__global__ void fill_kernel(U* __restrict__ out, int64_t head, int64_t groups, int64_t n, U v, uint4 pattern) {
  uint4* vo = reinterpret_cast<uint4*>(out + head);
  KILN_GRID_STRIDE_LOOP(g, groups) { vo[g] = pattern; }
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  if (t < head) out[t] = v;
  for (int64_t i = head + groups * static_cast<int64_t>(16 / sizeof(U)) + t; i < n; i += stride) out[i] = v;
}

template <typename U>
void fill_typed(void* out, int64_t n, uint64_t bits, cudaStream_t stream) {
  constexpr int64_t per = 16 / sizeof(U);
  const U v = static_cast<U>(bits);
  uint64_t rep = 0;
  for (int k = 0; k < static_cast<int>(8 / sizeof(U)); ++k) rep |= static_cast<uint64_t>(v) << (8 * sizeof(U) * k);
  const uint4 pattern = make_uint4(static_cast<uint32_t>(rep), static_cast<uint32_t>(rep >> 32),
                                   static_cast<uint32_t>(rep), static_cast<uint32_t>(rep >> 32));
  const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
  int64_t head = static_cast<int64_t>(((16 - addr % 16) % 16) / sizeof(U));
  if (addr % sizeof(U) != 0 || head > n) head = n;  // (never misaligned: raw_data is element-aligned)
  const int64_t groups = (n - head) / per;
  fill_kernel<U><<<grid_for(groups > 0 ? groups : n), kThreads, 0, stream>>>(static_cast<U*>(out), head, groups, n,
                                                                          v, pattern);
}

template <typename U>
__global__ void diagonal_kernel(U* __restrict__ out, int64_t count, int64_t cols, U v) {
  KILN_GRID_STRIDE_LOOP(i, count) { out[i * (cols + 1)] = v; }
}

template <typename T>
__global__ void arange_kernel(T* __restrict__ out, int64_t n, double start, double step, bool exact_int,
                              int64_t istart, int64_t istep, bool to_bool) {
  KILN_GRID_STRIDE_LOOP(i, n) {
    if constexpr (std::is_integral_v<T>) {
      if (exact_int) {  // modulo 2^64, then truncated to T (the op checked the range)
        const uint64_t v = static_cast<uint64_t>(istart) + static_cast<uint64_t>(i) * static_cast<uint64_t>(istep);
        out[i] = static_cast<T>(static_cast<int64_t>(v));
        continue;
      }
    }
    // The CPU build contracts start + i * step into one fma.
    const double v = fma(static_cast<double>(i), step, start);
    if constexpr (std::is_same_v<T, __half>) out[i] = __float2half_rn(static_cast<float>(v));
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) out[i] = __float2bfloat16_rn(static_cast<float>(v));
    else if constexpr (std::is_same_v<T, uint8_t>) out[i] = to_bool ? uint8_t(v != 0.0) : static_cast<uint8_t>(v);
    else out[i] = static_cast<T>(v);
  }
}

}  // namespace

void launch_fill(void* out, int64_t n, size_t itemsize, uint64_t bits, cudaStream_t stream) {
  if (n <= 0) return;
  if (bits == 0 || itemsize == 1) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out, static_cast<int>(bits & 0xff), static_cast<size_t>(n) * itemsize, stream));
    return;
  }
  switch (itemsize) {
    case 2: fill_typed<uint16_t>(out, n, bits, stream); break;
    case 4: fill_typed<uint32_t>(out, n, bits, stream); break;
    case 8: fill_typed<uint64_t>(out, n, bits, stream); break;
    default: throw_bad_dtype("fill", DType::kF32);  // no such itemsize
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_eye(void* out, int64_t rows, int64_t cols, size_t itemsize, uint64_t one_bits, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  KILN_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(n) * itemsize, stream));
  const int64_t count = rows < cols ? rows : cols;
  switch (itemsize) {
    case 1:
      diagonal_kernel<uint8_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<uint8_t*>(out), count, cols,
                                                                         static_cast<uint8_t>(one_bits));
      break;
    case 2:
      diagonal_kernel<uint16_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<uint16_t*>(out), count, cols,
                                                                          static_cast<uint16_t>(one_bits));
      break;
    case 4:
      diagonal_kernel<uint32_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<uint32_t*>(out), count, cols,
                                                                          static_cast<uint32_t>(one_bits));
      break;
    case 8:
      diagonal_kernel<uint64_t><<<grid_for(count), kThreads, 0, stream>>>(static_cast<uint64_t*>(out), count, cols,
                                                                          one_bits);
      break;
    default:
      throw_bad_dtype("eye", DType::kF32);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_arange(DType dtype, void* out, int64_t n, double start, double step, bool exact_int, int64_t istart,
                   int64_t istep, cudaStream_t stream) {
  if (n <= 0) return;
  const bool to_bool = dtype == DType::kBool;
  if (to_bool) exact_int = false;
  auto fail = [&] { throw_bad_dtype("arange", dtype); };
  KILN_CUDA_DISPATCH_ALL(dtype, fail,
                         arange_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(out), n, start, step,
                                                                                exact_int, istart, istep, to_bool))
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
