#include "cast_launch.h"
#include "device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
  KILN_GRID_STRIDE_LOOP(i, n) {
    if constexpr (std::is_integral_v<D>) {
      // As the CPU's convert_loop: integer -> integer directly (exact for i64, wraps
      // modulo 2^bits when narrowing; a detour through double would lose i64 bits above
      // 2^53 and saturate), floating -> integer from the compute type (truncation).
      if constexpr (std::is_integral_v<S>) dst[i] = static_cast<D>(src[i]);
      else dst[i] = static_cast<D>(load_as<compute_t<S>>(src, i));
    } else {
      store_from(dst, i, load_as<compute_t<D>>(src, i));
    }
  }
}

template <typename S>
__global__ void cast_to_bool_kernel(const S* src, uint8_t* dst, int64_t n) {
  // As the CPU: static_cast<float>(x) != 0 (an f64 below f32's range gives false).
  KILN_GRID_STRIDE_LOOP(i, n) { dst[i] = load_as<float>(src, i) != 0.0f ? 1 : 0; }
}

}  // namespace

void launch_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  auto fail = [&] { throw_bad_dtype("cast", src_dtype); };
  KILN_CUDA_DISPATCH_ALL(src_dtype, fail, {
    using S = T;
    if (dst_dtype == DType::kBool) {
      cast_to_bool_kernel<S><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const S*>(src),
                                                                   static_cast<uint8_t*>(dst), n);
    } else {
      auto fail2 = [&] { throw_bad_dtype("cast", dst_dtype); };
      KILN_CUDA_DISPATCH_ALL(dst_dtype, fail2, {
        cast_kernel<S, T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const S*>(src), static_cast<T*>(dst), n);
      })
    }
  })
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
