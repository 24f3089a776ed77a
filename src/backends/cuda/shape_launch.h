#pragma once
// Launchers of shape_kernels.cu (internal): byte-moving copies for the shape ops
// (reshape, transpose, concat, stack, split, strided_slice, pad, tile, broadcast_to),
// also used by other families (e.g. the reductions' permuted copies).
//
// They never look at values: elements are moved as 1/2/4/8-byte words, and runs that
// are contiguous on both sides as wider words (up to 16 bytes) where sizes and
// addresses allow. Dimensions are simplified first (size-1 dims dropped, neighbours
// that stay contiguous merged). Everything is enqueued on `stream`; nothing syncs.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// Most dimensions a strided copy takes (tile doubles the rank of an 8-d tensor).
constexpr int kShapeMaxDims = 16;

// dst[0, bytes) = src[0, bytes) (device to device).
void launch_copy_bytes(void* dst, const void* src, int64_t bytes, cudaStream_t stream);

// out (contiguous, dims out_sizes[0..rank)) [o_0, .., o_{r-1}] =
//   in[base + sum_d o_d * in_strides[d]]
// with base and strides in elements of `itemsize` bytes (1, 2, 4 or 8); strides may be
// 0 (broadcast) or negative. rank <= kShapeMaxDims.
void launch_strided_copy(const void* in, void* out, int64_t itemsize, int rank, const int64_t* out_sizes,
                         const int64_t* in_strides, int64_t base, cudaStream_t stream);

// out = in with its dims permuted: out dim k is in dim perm[k] (in contiguous with dims
// in_dims[0..rank)). rank <= 8.
void launch_permute(const void* in, void* out, int64_t itemsize, int rank, const int64_t* in_dims,
                    const int64_t* perm, cudaStream_t stream);

// A 2-d block copy: `rows` rows of `row_bytes` bytes, row r at src + r * src_stride and
// dst + r * dst_stride (byte strides).
struct CopyPart {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t rows = 0, row_bytes = 0, src_stride = 0, dst_stride = 0;
};
// Runs all parts (a few launches for many parts; empty parts are skipped).
void launch_copy_parts(const CopyPart* parts, int n, cudaStream_t stream);

// Padding modes of launch_pad.
enum PadMode : int { kPadConstant = 0, kPadEdge = 1, kPadReflect = 2 };
// out[o] = in[o - lo] per dim where inside; outside: the fill element (constant), the
// nearest edge element (edge), or the reflection without repeating the edge
// (reflect: i < 0 -> -i, i >= n -> 2(n-1) - i). `fill` points at one element of
// `itemsize` bytes (host memory; constant mode only). rank <= 8.
void launch_pad(const void* in, void* out, int64_t itemsize, int rank, const int64_t* in_sizes, const int64_t* lo,
                const int64_t* out_sizes, int mode, const void* fill, cudaStream_t stream);

}  // namespace kiln::cuda
