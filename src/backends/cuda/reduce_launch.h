#pragma once
// Launchers of reduce_kernels.cu (internal).
//
// Every reduction runs on a contiguous (outer O, reduced R, inner I) view of its input
// (reduce_kernels.cc makes one, permuting on the device when the reduced axes are not
// adjacent) and writes O * I outputs. Accumulation matches the CPU kernels: floating
// sums, means, products, variances and logsumexp's sum of exps in f64 (16-bit inputs
// too), integer sums and products in uint64 (wrapping like int64), max/min/arg in
// the compute type (f32 for 16-bit floats). Results are deterministic for a given
// shape and device (fixed split of long reductions, partials combined in order).
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/core/dtype.h"

namespace kiln::cuda {

enum ReduceOp : int {
  kReduceSum,        // float -> same dtype; bool/int -> i64
  kReduceMean,       // float -> same dtype; bool/int -> f32
  kReduceProd,       // as sum
  kReduceMax,        // same dtype, NaN propagates
  kReduceMin,
  kReduceAll,        // -> bool
  kReduceAny,
  kReduceVar,        // floats: sum((x - center)^2) / max(R - ddof, 0); center: f64 mean per output
  kReduceStd,        // sqrt of var
  kReduceLogsumexp,  // floats: center + log(sum(exp(x - center))); center: dtype max per output
                     // (non-finite centers count as 0)
  kReduceArgmax,     // -> i64: first index of the max (NaN is largest)
  kReduceArgmin,     // -> i64: first index of the min (NaN is smallest)
  kReduceMeanF64,    // floats: the mean written as f64 (var/std centers)
};

struct ReduceArgs {
  const void* x = nullptr;  // O * R * I elements of `dtype`
  DType dtype = DType::kF32;
  void* out = nullptr;      // O * I outputs (dtype per op, above)
  const void* center = nullptr;  // var/std/logsumexp (null: 0 everywhere), else unused
  int64_t outer = 1, reduced = 1, inner = 1;
  int op = kReduceSum;
  int64_t ddof = 0;
};

// Device scratch bytes launch_reduce needs for `a` on a device with `num_sms`
// multiprocessors (0: none).
int64_t reduce_scratch_bytes(const ReduceArgs& a, int num_sms);
// Enqueues the reduction; `scratch` holds reduce_scratch_bytes(a, num_sms) bytes
// (16-byte aligned) or is null when that is 0.
void launch_reduce(const ReduceArgs& a, void* scratch, int num_sms, cudaStream_t stream);

}  // namespace kiln::cuda
