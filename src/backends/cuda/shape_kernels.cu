// Byte-moving kernels of the shape ops (see shape_launch.h).
//
// - strided copy: out (contiguous) from any linear index map of the input (transpose,
//   strided_slice, tile, broadcast_to); runs contiguous on both sides move as up to
//   16-byte words; a transposed innermost dim goes through 32x32 shared-memory tiles.
// - part copies: batches of 2-d block copies (concat, stack, split).
// - pad: per-dim constant / edge / reflect index maps.
// Index arithmetic is 32-bit when the element count allows (most tensors), else 64-bit.
#include <algorithm>
#include <climits>
#include <cstring>

#include "device_util.cuh"
#include "shape_launch.h"

namespace kiln::cuda {
namespace {

// Calls f(U{}) with U the word of `bytes` bytes (1, 2, 4, 8, 16).
template <typename F>
void dispatch_unit(int64_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(static_cast<unsigned long long>(0)); break;
    case 16: f(uint4{}); break;
    default: throw_bad_dtype("shape copy (element size)", DType::kU8);
  }
}

bool aligned(const void* p, int64_t u) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(u) == 0; }

unsigned blocks_for(int64_t n) { return grid_for(n); }

// ---- strided copy ------------------------------------------------------------------

// Innermost dimension first; strides in units of the copied word.
struct CopyMap {
  int rank = 0;
  int64_t sizes[kShapeMaxDims] = {};
  int64_t strides[kShapeMaxDims] = {};
};

template <typename I>
__device__ __forceinline__ int64_t map_offset(const CopyMap& m, I rem) {
  int64_t off = 0;
#pragma unroll
  for (int k = 0; k < kShapeMaxDims; ++k) {
    if (k < m.rank - 1) {
      const I s = static_cast<I>(m.sizes[k]);
      const I q = rem / s;
      off += static_cast<int64_t>(rem - q * s) * m.strides[k];
      rem = q;
    } else if (k == m.rank - 1) {
      off += static_cast<int64_t>(rem) * m.strides[k];
    }
  }
  return off;
}

template <typename U>
__global__ void strided_copy_kernel(const U* __restrict__ in, U* __restrict__ out, CopyMap m, int64_t n) {
  if (n <= INT_MAX) {
    const uint32_t n32 = static_cast<uint32_t>(n);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += blockDim.x * gridDim.x)
      out[i] = in[map_offset<uint32_t>(m, i)];
  } else {
    KILN_GRID_STRIDE_LOOP(i, n) { out[i] = in[map_offset<int64_t>(m, i)]; }
  }
}

// Transposes the innermost output dim j against dim i (contiguous in the input) in
// 32x32 tiles, batched over the other dims (innermost first).
struct TileMap {
  int nb = 0;
  int64_t bsizes[kShapeMaxDims] = {};
  int64_t bin[kShapeMaxDims] = {};
  int64_t bout[kShapeMaxDims] = {};
  int64_t ni = 0, nj = 0, is_j = 0, os_i = 0;
  int64_t tiles_i = 0, tiles_j = 0, ntiles = 0;
};

constexpr int kTile = 32;
constexpr int kTileRows = 8;

template <typename U>
__global__ void __launch_bounds__(kTile* kTileRows) transpose_tile_kernel(const U* __restrict__ in,
                                                                          U* __restrict__ out, TileMap m) {
  __shared__ U tile[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < m.ntiles; t += gridDim.x) {
    int64_t rem = t;
    const int64_t j0 = rem % m.tiles_j * kTile;
    rem /= m.tiles_j;
    const int64_t i0 = rem % m.tiles_i * kTile;
    rem /= m.tiles_i;
    int64_t io = 0, oo = 0;
#pragma unroll
    for (int k = 0; k < kShapeMaxDims; ++k) {
      if (k < m.nb) {
        const int64_t idx = rem % m.bsizes[k];
        rem /= m.bsizes[k];
        io += idx * m.bin[k];
        oo += idx * m.bout[k];
      }
    }
    const int64_t i = i0 + tx;
#pragma unroll
    for (int r = 0; r < kTile; r += kTileRows) {
      const int64_t j = j0 + ty + r;
      if (i < m.ni && j < m.nj) tile[ty + r][tx] = in[io + j * m.is_j + i];
    }
    __syncthreads();
    const int64_t j = j0 + tx;
#pragma unroll
    for (int r = 0; r < kTile; r += kTileRows) {
      const int64_t ii = i0 + ty + r;
      if (ii < m.ni && j < m.nj) out[oo + ii * m.os_i + j] = tile[tx][ty + r];
    }
    __syncthreads();
  }
}

// Outermost-first dims with element strides.
struct Dims {
  int rank = 0;
  int64_t size[kShapeMaxDims] = {};
  int64_t stride[kShapeMaxDims] = {};
};

// Drops size-1 dims and merges neighbours that stay contiguous in the input.
Dims simplify(int rank, const int64_t* sizes, const int64_t* strides) {
  Dims r;
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] == 1) continue;
    if (r.rank > 0 && r.stride[r.rank - 1] == strides[d] * sizes[d]) {
      r.size[r.rank - 1] *= sizes[d];
      r.stride[r.rank - 1] = strides[d];
    } else {
      r.size[r.rank] = sizes[d];
      r.stride[r.rank] = strides[d];
      ++r.rank;
    }
  }
  return r;
}

void launch_tiled(const char* src, void* out, int64_t itemsize, const Dims& s, int bi, cudaStream_t stream) {
  const int last = s.rank - 1;
  int64_t out_stride[kShapeMaxDims];
  int64_t acc = 1;
  for (int d = last; d >= 0; --d) {
    out_stride[d] = acc;
    acc *= s.size[d];
  }
  TileMap m;
  for (int d = last - 1; d >= 0; --d) {  // innermost batch dim first
    if (d == bi) continue;
    m.bsizes[m.nb] = s.size[d];
    m.bin[m.nb] = s.stride[d];
    m.bout[m.nb] = out_stride[d];
    ++m.nb;
  }
  m.ni = s.size[bi];
  m.nj = s.size[last];
  m.is_j = s.stride[last];
  m.os_i = out_stride[bi];
  m.tiles_i = (m.ni + kTile - 1) / kTile;
  m.tiles_j = (m.nj + kTile - 1) / kTile;
  m.ntiles = acc / (m.ni * m.nj) * m.tiles_i * m.tiles_j;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(m.ntiles, int64_t{1} << 20));
  auto launch = [&](auto u) {
    using U = decltype(u);
    transpose_tile_kernel<U><<<blocks, dim3(kTile, kTileRows), 0, stream>>>(reinterpret_cast<const U*>(src),
                                                                          static_cast<U*>(out), m);
  };
  switch (itemsize) {  // elements of kiln dtypes: 1, 2, 4 or 8 bytes
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    default: launch(static_cast<unsigned long long>(0)); break;
  }
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- part copies -------------------------------------------------------------------

constexpr int kPartsPerLaunch = 32;
struct PartDev {
  const char* src;
  char* dst;
  int64_t rows, row_units, src_stride, dst_stride;  // strides in units
};
struct PartBatch {
  PartDev p[kPartsPerLaunch];
};

template <typename U>
__global__ void copy_parts_kernel(PartBatch b) {
  const PartDev p = b.p[blockIdx.y];
  const U* __restrict__ src = reinterpret_cast<const U*>(p.src);
  U* __restrict__ dst = reinterpret_cast<U*>(p.dst);
  const int64_t n = p.rows * p.row_units;
  if (p.rows == 1 || (p.src_stride == p.row_units && p.dst_stride == p.row_units)) {
    KILN_GRID_STRIDE_LOOP(i, n) { dst[i] = src[i]; }
  } else if (n <= INT_MAX) {
    const uint32_t n32 = static_cast<uint32_t>(n), w = static_cast<uint32_t>(p.row_units);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += blockDim.x * gridDim.x) {
      const uint32_t r = i / w, c = i - r * w;
      dst[r * p.dst_stride + c] = src[r * p.src_stride + c];
    }
  } else {
    KILN_GRID_STRIDE_LOOP(i, n) {
      const int64_t r = i / p.row_units, c = i - r * p.row_units;
      dst[r * p.dst_stride + c] = src[r * p.src_stride + c];
    }
  }
}

// ---- pad ---------------------------------------------------------------------------

constexpr int kPadDims = 8;
struct PadMap {
  int rank = 0;  // innermost first
  int64_t out_sizes[kPadDims] = {};
  int64_t in_sizes[kPadDims] = {};
  int64_t lo[kPadDims] = {};
  int64_t in_strides[kPadDims] = {};  // units
};

template <typename I>
__device__ __forceinline__ int64_t pad_offset(const PadMap& m, int mode, I rem, bool& fill) {
  int64_t off = 0;
#pragma unroll
  for (int k = 0; k < kPadDims; ++k) {
    if (k < m.rank) {
      int64_t o;
      if (k < m.rank - 1) {
        const I s = static_cast<I>(m.out_sizes[k]);
        const I q = rem / s;
        o = static_cast<int64_t>(rem - q * s);
        rem = q;
      } else {
        o = static_cast<int64_t>(rem);
      }
      int64_t i = o - m.lo[k];
      const int64_t n = m.in_sizes[k];
      if (i < 0 || i >= n) {
        if (mode == kPadConstant) fill = true;
        else if (mode == kPadEdge) i = i < 0 ? 0 : n - 1;
        else i = i < 0 ? -i : 2 * (n - 1) - i;
      }
      off += i * m.in_strides[k];
    }
  }
  return off;
}

template <typename U>
__global__ void pad_kernel(const U* __restrict__ in, U* __restrict__ out, PadMap m, int mode, U fill_value,
                           int64_t n) {
  if (n <= INT_MAX) {
    const uint32_t n32 = static_cast<uint32_t>(n);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += blockDim.x * gridDim.x) {
      bool fill = false;
      const int64_t off = pad_offset<uint32_t>(m, mode, i, fill);
      out[i] = fill ? fill_value : in[off];
    }
  } else {
    KILN_GRID_STRIDE_LOOP(i, n) {
      bool fill = false;
      const int64_t off = pad_offset<int64_t>(m, mode, i, fill);
      out[i] = fill ? fill_value : in[off];
    }
  }
}

}  // namespace

void launch_copy_bytes(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  if (bytes <= 0 || dst == src) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
}

void launch_strided_copy(const void* in, void* out, int64_t itemsize, int rank, const int64_t* out_sizes,
                         const int64_t* in_strides, int64_t base, cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= out_sizes[d];
  if (n == 0) return;
  Dims s = simplify(rank, out_sizes, in_strides);
  const char* src = static_cast<const char*>(in) + base * itemsize;
  if (s.rank == 0) {
    launch_copy_bytes(out, src, itemsize, stream);
    return;
  }
  const int last = s.rank - 1;
  if (s.rank == 1 && s.stride[0] == 1) {
    launch_copy_bytes(out, src, n * itemsize, stream);
    return;
  }
  if (s.stride[last] != 1 && s.size[last] >= 16) {
    // The input's contiguous dim, when the output has it elsewhere: tiled transpose.
    for (int bi = 0; bi < last; ++bi) {
      if (s.stride[bi] == 1 && s.size[bi] >= 16) {
        launch_tiled(src, out, itemsize, s, bi, stream);
        return;
      }
    }
  }
  // Widest word for a run contiguous on both sides.
  int64_t unit = itemsize;
  if (s.stride[last] == 1) {
    const int64_t run = s.size[last] * itemsize;
    for (int64_t u : {int64_t{16}, int64_t{8}, int64_t{4}, int64_t{2}}) {
      if (u <= itemsize) break;
      bool ok = run % u == 0 && aligned(src, u) && aligned(out, u);
      for (int d = 0; ok && d < last; ++d) ok = (s.stride[d] * itemsize) % u == 0;
      if (ok) {
        unit = u;
        break;
      }
    }
    if (unit > itemsize) {
      const int64_t k = unit / itemsize;
      s.size[last] /= k;
      for (int d = 0; d < last; ++d) s.stride[d] /= k;
    }
  }
  CopyMap m;
  m.rank = s.rank;
  for (int d = 0; d < s.rank; ++d) {
    m.sizes[d] = s.size[last - d];
    m.strides[d] = s.stride[last - d];
  }
  const int64_t units = n * itemsize / unit;
  dispatch_unit(unit, [&](auto u) {
    using U = decltype(u);
    strided_copy_kernel<U><<<blocks_for(units), kThreads, 0, stream>>>(reinterpret_cast<const U*>(src),
                                                                       static_cast<U*>(out), m, units);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_permute(const void* in, void* out, int64_t itemsize, int rank, const int64_t* in_dims,
                    const int64_t* perm, cudaStream_t stream) {
  int64_t stride[kShapeMaxDims], sizes[kShapeMaxDims], strides[kShapeMaxDims];
  int64_t acc = 1;
  for (int d = rank - 1; d >= 0; --d) {
    stride[d] = acc;
    acc *= in_dims[d];
  }
  for (int k = 0; k < rank; ++k) {
    sizes[k] = in_dims[perm[k]];
    strides[k] = stride[perm[k]];
  }
  launch_strided_copy(in, out, itemsize, rank, sizes, strides, 0, stream);
}

void launch_copy_parts(const CopyPart* parts, int n, cudaStream_t stream) {
  int i = 0;
  while (i < n) {
    // Gather up to kPartsPerLaunch non-empty parts.
    const CopyPart* batch[kPartsPerLaunch];
    int nb = 0;
    for (; i < n && nb < kPartsPerLaunch; ++i)
      if (parts[i].rows > 0 && parts[i].row_bytes > 0) batch[nb++] = &parts[i];
    if (nb == 0) break;
    int64_t unit = 1, max_units = 0;
    for (int64_t u : {int64_t{16}, int64_t{8}, int64_t{4}, int64_t{2}}) {
      bool ok = true;
      for (int k = 0; ok && k < nb; ++k) {
        const CopyPart& p = *batch[k];
        ok = p.row_bytes % u == 0 && aligned(p.src, u) && aligned(p.dst, u) &&
             (p.rows == 1 || (p.src_stride % u == 0 && p.dst_stride % u == 0));
      }
      if (ok) {
        unit = u;
        break;
      }
    }
    PartBatch b{};
    for (int k = 0; k < nb; ++k) {
      const CopyPart& p = *batch[k];
      b.p[k] = PartDev{static_cast<const char*>(p.src), static_cast<char*>(p.dst), p.rows, p.row_bytes / unit,
                       p.src_stride / unit, p.dst_stride / unit};
      max_units = std::max(max_units, p.rows * (p.row_bytes / unit));
    }
    const unsigned gx = std::min<unsigned>(blocks_for(max_units), std::max(1u, 4096u / static_cast<unsigned>(nb)));
    dispatch_unit(unit, [&](auto u) {
      using U = decltype(u);
      copy_parts_kernel<U><<<dim3(gx, static_cast<unsigned>(nb)), kThreads, 0, stream>>>(b);
    });
    KILN_CUDA_CHECK_LAUNCH();
  }
}

void launch_pad(const void* in, void* out, int64_t itemsize, int rank, const int64_t* in_sizes, const int64_t* lo,
                const int64_t* out_sizes, int mode, const void* fill, cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= out_sizes[d];
  if (n == 0) return;
  int64_t in_stride[kPadDims];
  int64_t acc = 1;
  for (int d = rank - 1; d >= 0; --d) {
    in_stride[d] = acc;
    acc *= in_sizes[d];
  }
  // Outermost first: drop unpadded size-1 dims, merge neighbouring unpadded dims.
  int r = 0;
  int64_t os[kPadDims], is[kPadDims], l[kPadDims], st[kPadDims];
  for (int d = 0; d < rank; ++d) {
    const bool unpadded = lo[d] == 0 && out_sizes[d] == in_sizes[d];
    if (unpadded && out_sizes[d] == 1) continue;
    if (unpadded && r > 0 && l[r - 1] == 0 && os[r - 1] == is[r - 1]) {
      os[r - 1] *= out_sizes[d];
      is[r - 1] *= in_sizes[d];
      st[r - 1] = in_stride[d];
      continue;
    }
    os[r] = out_sizes[d];
    is[r] = in_sizes[d];
    l[r] = lo[d];
    st[r] = in_stride[d];
    ++r;
  }
  if (r == 0 || (r == 1 && l[0] == 0 && os[0] == is[0])) {  // nothing padded
    launch_copy_bytes(out, in, n * itemsize, stream);
    return;
  }
  int64_t unit = itemsize;
  const int last = r - 1;
  if (l[last] == 0 && os[last] == is[last]) {
    const int64_t run = os[last] * itemsize;
    for (int64_t u : {int64_t{16}, int64_t{8}, int64_t{4}, int64_t{2}}) {
      if (u <= itemsize) break;
      if (run % u == 0 && aligned(in, u) && aligned(out, u)) {
        unit = u;
        break;
      }
    }
    if (unit > itemsize) {
      const int64_t k = unit / itemsize;
      os[last] /= k;
      is[last] /= k;
      for (int d = 0; d < last; ++d) st[d] /= k;
    }
  }
  PadMap m;
  m.rank = r;
  for (int d = 0; d < r; ++d) {
    m.out_sizes[d] = os[last - d];
    m.in_sizes[d] = is[last - d];
    m.lo[d] = l[last - d];
    m.in_strides[d] = st[last - d];
  }
  unsigned char pattern[16] = {};
  if (mode == kPadConstant && fill)
    for (int64_t b = 0; b < unit; b += itemsize) std::memcpy(pattern + b, fill, static_cast<size_t>(itemsize));
  const int64_t units = n * itemsize / unit;
  dispatch_unit(unit, [&](auto u) {
    using U = decltype(u);
    U f;
    std::memcpy(&f, pattern, sizeof(U));
    pad_kernel<U><<<blocks_for(units), kThreads, 0, stream>>>(static_cast<const U*>(in), static_cast<U*>(out), m, mode,
                                                             f, units);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
