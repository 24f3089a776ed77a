#include "conv_launch.h"
#include "device_util.cuh"

namespace kiln::cuda {
namespace {

template <size_t N> struct Bits;
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

template <typename E>
__global__ void window_copy_kernel(const E* __restrict__ src, E* __restrict__ dst, bool nchw, int64_t total,
                                   int64_t c, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh, int64_t ow) {
  KILN_GRID_STRIDE_LOOP(i, total) {
    int64_t n, ch, h, w;
    if (nchw) {
      w = i % dw;
      int64_t r = i / dw;
      h = r % dh;
      r /= dh;
      ch = r % c;
      n = r / c;
    } else {
      ch = i % c;
      int64_t r = i / c;
      w = r % dw;
      r /= dw;
      h = r % dh;
      n = r / dh;
    }
    const int64_t y = h + oh, x = w + ow;
    E v = 0;
    if (y >= 0 && y < sh && x >= 0 && x < sw)
      v = nchw ? src[((n * c + ch) * sh + y) * sw + x] : src[((n * sh + y) * sw + x) * c + ch];
    dst[i] = v;
  }
}

constexpr int kT = 32;

template <typename E>
__global__ void transpose_kernel(const E* __restrict__ src, E* __restrict__ dst, int64_t rows, int64_t cols) {
  __shared__ E tile[kT][kT + 1];
  const int64_t rt = (rows + kT - 1) / kT, ct = (cols + kT - 1) / kT;
  for (int64_t t = blockIdx.x; t < rt * ct; t += gridDim.x) {  // uniform per block
    const int64_t r0 = t / ct * kT, c0 = t % ct * kT;
    for (int i = threadIdx.y; i < kT; i += blockDim.y) {
      const int64_t r = r0 + i, cc = c0 + threadIdx.x;
      if (r < rows && cc < cols) tile[i][threadIdx.x] = src[r * cols + cc];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kT; i += blockDim.y) {
      const int64_t cc = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && cc < cols) dst[cc * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();
  }
}

template <typename F>
void by_size(size_t elem_bytes, F&& f) {
  switch (elem_bytes) {
    case 2: f(Bits<2>::type{}); break;
    case 4: f(Bits<4>::type{}); break;
    case 8: f(Bits<8>::type{}); break;
    default: throw_bad_dtype("conv layout copy", DType::kBool);
  }
}

}  // namespace

void launch_window_copy(const void* src, void* dst, size_t elem_bytes, bool nchw, int64_t n, int64_t c, int64_t src_h,
                        int64_t src_w, int64_t dst_h, int64_t dst_w, int64_t off_h, int64_t off_w,
                        cudaStream_t stream) {
  const int64_t total = n * c * dst_h * dst_w;
  if (total == 0) return;
  by_size(elem_bytes, [&](auto tag) {
    using E = decltype(tag);
    window_copy_kernel<E><<<grid_for(total, 4), kThreads, 0, stream>>>(
        static_cast<const E*>(src), static_cast<E*>(dst), nchw, total, c, src_h, src_w, dst_h, dst_w, off_h, off_w);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_transpose2d(const void* src, void* dst, size_t elem_bytes, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
  const int64_t tiles = ((rows + kT - 1) / kT) * ((cols + kT - 1) / kT);
  if (tiles == 0) return;
  const unsigned grid = static_cast<unsigned>(tiles < 65535LL * 8 ? tiles : 65535LL * 8);
  by_size(elem_bytes, [&](auto tag) {
    using E = decltype(tag);
    transpose_kernel<E><<<grid, dim3(kT, 8), 0, stream>>>(static_cast<const E*>(src), static_cast<E*>(dst), rows,
                                                          cols);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
