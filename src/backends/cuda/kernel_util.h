#pragma once
// Registration-side helpers of the CUDA backend (internal; .cc files, not nvcc).
//
// A CUDA kernel function has the CPU kernels' signature (void(OpContext&)): outputs
// are allocated on the inputs' CUDA device by call_op / the executor; the function
// takes a KernelScope (cuda_context.h) for the device and stream, reads shapes and
// attrs on the host and calls a launcher declared in one of the *_launch.h headers
// (implemented in a .cu file). Nothing synchronises: results are ready in stream
// order, and reading them on the host (Tensor::to(cpu)) waits.
#include <span>
#include <vector>

#include "broadcast.h"
#include "cuda_context.h"
#include "kiln/core/error.h"
#include "kiln/core/kernel.h"
#include "kiln/core/shape.h"

namespace kiln::cuda {

inline constexpr DeviceType kCUDA = DeviceType::kCUDA;

#define KILN_CUDA_FLOAT_DTYPES {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}
#define KILN_CUDA_ALL_DTYPES                                                                            \
  {DType::kBool, DType::kU8, DType::kI8, DType::kI32, DType::kI64, DType::kF16, DType::kBF16, DType::kF32, \
   DType::kF64}

// The map from `out`'s flat index to the offset in a tensor of shape `in`, which
// broadcasts to `out` (NumPy rules, right-aligned). Merges contiguous dimensions.
// Throws UnimplementedError beyond kMaxDims (after merging).
BroadcastMap make_broadcast_map(const Shape& out, const Shape& in);

// Stream of the device of ctx's output 0 (or input 0 when there are no outputs).
inline const Tensor& anchor(const OpContext& ctx) { return ctx.out.empty() ? ctx.in[0] : ctx.out[0]; }

}  // namespace kiln::cuda
