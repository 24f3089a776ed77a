#pragma once
// Launchers of indexing_kernels.cu (internal): gather (also embedding), gather_nd,
// scatter_add, one_hot, top_k.
//
// Out-of-range indices: the CPU kernels throw OutOfRangeError before writing; a CUDA
// kernel cannot report without a host sync, so these follow TensorFlow's GPU kernels
// instead: gather / gather_nd / embedding write zeros for an out-of-range index, and
// scatter_add skips out-of-range indices (one_hot never errs: an index outside
// [0, depth) gives an all-"off" row on every device).
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// out[r, i, :] = params[r, idx[r / outer, i], :] for r < rows, i < ni, where params
// rows hold n slices of slice_bytes bytes, idx rows hold ni indices (i32, or i64 when
// idx64), and out rows hold ni slices.
struct GatherArgs {
  const void* params = nullptr;
  const void* indices = nullptr;
  bool idx64 = false;
  void* out = nullptr;
  int64_t rows = 0, outer = 1, n = 0, ni = 0, slice_bytes = 0;
};
void launch_gather(const GatherArgs& a, cudaStream_t stream);

// out[t, :] = params[idx[t, 0], .., idx[t, k-1], :] for t < tuples: slices of
// slice_bytes bytes; dims[j] the size of params dim j and strides[j] its stride in
// slices (j < k <= 8).
struct GatherNdArgs {
  const void* params = nullptr;
  const void* indices = nullptr;
  bool idx64 = false;
  void* out = nullptr;
  int k = 0;
  int64_t tuples = 0, slice_bytes = 0;
  int64_t dims[8] = {};
  int64_t strides[8] = {};
};
void launch_gather_nd(const GatherNdArgs& a, cudaStream_t stream);

// out[r, idx[i], c] += updates[r, i, c] for r < outer, i < ni, c < inner, with atomics
// (out holds x already; its rows hold n slices). out_dtype is updates_dtype, or f32
// with f16/bf16 updates (the caller widens x and rounds the result back, as the CPU
// does). Numeric dtypes only.
void launch_scatter_add(void* out, DType out_dtype, const void* updates, DType updates_dtype, const void* indices,
                        bool idx64, int64_t outer, int64_t n, int64_t ni, int64_t inner, cudaStream_t stream);

// out[idx[i]] = rows[i] for i < ni, rows of row_bytes bytes (out holds x already); an
// index outside [0, n) is skipped.
void launch_index_copy(void* out, const void* rows, const void* indices, bool idx64, int64_t n, int64_t ni,
                       int64_t row_bytes, cudaStream_t stream);

// out[r, d, i] = idx[r, i] == d ? on : off (elements of itemsize bytes: 1, 2, 4, 8;
// on/off point at one element each, in host memory).
void launch_one_hot(const void* indices, bool idx64, void* out, int64_t itemsize, int64_t outer, int64_t depth,
                    int64_t inner, const void* on, const void* off, cudaStream_t stream);

// The k largest of each row of n elements (NaN above everything, ties by lower index):
// values (dtype) and i64 indices, [rows, k]; sorted: descending, else by index.
// Sorted output needs k <= top_k_max_sorted(); n must be <= 2^31 - 1025 (int loops).
int64_t top_k_max_sorted();
void launch_top_k(const void* x, DType dtype, void* values, int64_t* indices, int64_t rows, int64_t n, int64_t k,
                  bool sorted, cudaStream_t stream);

}  // namespace kiln::cuda
