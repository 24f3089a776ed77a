#pragma once
// Broadcast index maps (internal): built on the host from shapes (kernel_util.h),
// passed by value to kernels, which map an output's flat index to an input's offset.
#include <cstdint>

#ifdef __CUDACC__
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE inline
#endif

namespace kiln::cuda {

constexpr int kMaxDims = 8;
// The output's sizes (outermost first) and an input's element strides, 0 where the
// input is broadcast. Adjacent dimensions are merged where both allow it, so most
// maps have rank 1 or 2.
struct BroadcastMap {
  int rank = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  KILN_HOST_DEVICE int64_t offset(int64_t flat) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t s = sizes[d];
      int64_t q = flat / s;
      off += (flat - q * s) * strides[d];
      flat = q;
    }
    return off;
  }
};

}  // namespace kiln::cuda
