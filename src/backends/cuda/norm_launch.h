#pragma once
// Launchers of norm_kernels.cu (internal): layer norm, RMS norm, batch norm
// (inference and training). Dtypes f32/f64/f16/bf16; 16-bit floats compute in f32.
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

// Parameters (gamma, beta, mean, var) have the input's dtype, or f32 with f16/bf16
// inputs (ops::param_for keeps f32 parameters then, as the CPU's via_f32 sees them):
// bit i of `f32_params` marks parameter i (in argument order) as f32.

// Per row of d elements (one pass over global memory when the row fits in shared
// memory): mean = sum(x) / d, var = sum((x - mean)^2) / d (two-pass, in the compute
// type), y = (x - mean) * (1 / sqrt(var + eps)) * gamma + beta; gamma/beta have d
// elements. f32_params: bit 0 gamma, bit 1 beta.
void launch_layer_norm(const void* x, const void* gamma, const void* beta, void* y, DType dtype, int64_t rows,
                       int64_t d, double eps, unsigned f32_params, cudaStream_t stream);
// y = x * (1 / sqrt(sum(x^2) / d + eps)) * gamma per row of d elements. f32_params:
// bit 0 gamma.
void launch_rms_norm(const void* x, const void* gamma, void* y, DType dtype, int64_t rows, int64_t d, double eps,
                     unsigned f32_params, cudaStream_t stream);

// x viewed as [outer, c, inner] around the channel axis. Scratch: 8-byte aligned
// device memory of batch_norm_scratch_bytes(...) bytes.
int64_t batch_norm_scratch_bytes(bool training, int64_t outer, int64_t c, int64_t inner, int num_sms);
// y = x * scale + shift per channel, scale = gamma / sqrt(var + eps) and
// shift = beta - mean * scale computed in f64 and rounded to the compute type.
// f32_params: bit 0 mean, 1 var, 2 gamma, 3 beta.
void launch_batch_norm_inference(const void* x, const void* mean, const void* var, const void* gamma,
                                 const void* beta, unsigned f32_params, void* y, DType dtype, int64_t outer, int64_t c,
                                 int64_t inner, double eps, void* scratch, cudaStream_t stream);
// Batch statistics per channel over outer and inner (f64 accumulation of the sum;
// squared deviations from the mean rounded to the compute type, as the CPU), then y as
// above; mean_out/var_out (c elements of dtype) get the mean and the biased variance.
// f32_params: bit 0 gamma, bit 1 beta.
void launch_batch_norm_training(const void* x, const void* gamma, const void* beta, unsigned f32_params, void* y,
                                void* mean_out, void* var_out, DType dtype, int64_t outer, int64_t c, int64_t inner,
                                double eps, void* scratch, int num_sms, cudaStream_t stream);

}  // namespace kiln::cuda
