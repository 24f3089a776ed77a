#pragma once
// Launchers of matmul_kernels.cu (internal): the integer matmul (cuBLASLt has no
// wrap-around integer GEMM) and the bias + activation epilogue shared by
// fused_matmul and the convolutions.
#include <cuda_runtime.h>

#include <cstdint>

#include "broadcast.h"
#include "kiln/core/dtype.h"

namespace kiln::cuda {

// c[i] = op(a[i']) @ op(b[i'']) for the `batch` output matrices i (row-major, M x N,
// contiguous), op = transpose when ta / tb; a_map / b_map map an output batch index to
// the operand's batch index (broadcasting; the operand's matrices are contiguous:
// M*K resp. K*N elements apart). Integer dtypes (i8, u8, i32, i64): products and sums
// wrap around modulo 2^bits, as the CPU's loop does.
void launch_matmul_int(const void* a, const void* b, void* c, DType dtype, int64_t batch, int64_t M, int64_t N,
                       int64_t K, bool ta, bool tb, const BroadcastMap& a_map, const BroadcastMap& b_map,
                       cudaStream_t stream);

// In place on n elements of y (floating dtype): y[i] = act(y[i] + bias[(i / inner) %
// channels]) with bias (may be null: no bias) of dtype bias_dtype (y's dtype, or f32
// for f16/bf16 y); relu: max(v, 0) keeping NaN. Computes in float (double for f64).
void launch_bias_act(void* y, DType dtype, int64_t n, const void* bias, DType bias_dtype, int64_t channels,
                     int64_t inner, bool relu, cudaStream_t stream);

}  // namespace kiln::cuda
