// fused_elementwise on CUDA: one kernel interprets the program (kiln/ops/fused.h) per
// group of V consecutive elements, intermediate values in a small per-thread scratch
// (local memory, L1-resident), so memory is read and written once. The instruction
// switch is uniform across the grid. Each instruction is the elementwise op's own
// f32 expression (elementwise_launch.h), as on the CPU.
#include "device_util.cuh"
#include "elementwise_launch.h"

namespace kiln::cuda {
namespace {

// Operand `ref` of the group at element `base` into v.
template <int V, int S>
__device__ __forceinline__ void fetch(const FusedProgram& prog, uint8_t ref, int64_t base, int64_t n, bool full,
                                      const float (&slot)[S][V], float (&v)[V]) {
  if (ref & kFusedInput) {
    const int k = ref & (kFusedInput - 1);
    const float* p = prog.in[k];
    if ((prog.scalar_mask >> k) & 1) {
      const float s = p[0];
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = s;
      return;
    }
    if (const int64_t period = prog.period[k]; period > 0) {
      int64_t i = base % period;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        v[j] = base + j < n ? p[i] : 0.0f;
        i = i + 1 == period ? 0 : i + 1;
      }
      return;
    }
    if constexpr (V == 4) {
      if (full) {
        const float4 q = *reinterpret_cast<const float4*>(p + base);
        v[0] = q.x;
        v[1] = q.y;
        v[2] = q.z;
        v[3] = q.w;
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = base + j < n ? p[base + j] : 0.0f;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = slot[ref][j];
  }
}

// V elements per thread per step; S scratch slots. vec: the output and every
// non-scalar input are 16-byte aligned (float4 accesses for whole groups).
template <int V, int S>
__global__ void fused_kernel(const __grid_constant__ FusedProgram prog, float* __restrict__ out, int64_t n, bool vec) {
  float slot[S][V];
  const int64_t groups = (n + V - 1) / V;
  const int last = prog.n_instr - 1;
  KILN_GRID_STRIDE_LOOP(g, groups) {
    const int64_t base = g * V;
    const bool full = vec && base + V <= n;
    for (int k = 0; k <= last; ++k) {
      const FusedInstr ins = prog.ins[k];
      float x[V];
      fetch<V, S>(prog, ins.a, base, n, full, slot, x);
      if (ins.binary) {
        float y[V];
        fetch<V, S>(prog, ins.b, base, n, full, slot, y);
        ew::binary_group<float, V>(static_cast<EwBinaryOp>(ins.op), x, y, x);
      } else {
        ew::unary_group<float, V>(static_cast<EwUnaryOp>(ins.op), x, 0.0f, 0.0f);
      }
      if (k < last) {
#pragma unroll
        for (int j = 0; j < V; ++j) slot[ins.dst][j] = x[j];
        continue;
      }
      if constexpr (V == 4) {
        if (full) {
          *reinterpret_cast<float4*>(out + base) = make_float4(x[0], x[1], x[2], x[3]);
          continue;
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (base + j < n) out[base + j] = x[j];
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void launch_fused_elementwise(const FusedProgram& prog, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0 || prog.n_instr <= 0) return;
  if (prog.n_slots <= 8) {
    // Four elements per thread: float4 accesses, and the instruction dispatch is
    // amortised over four values.
    bool vec = aligned16(out);
    for (int k = 0; k < prog.n_in; ++k)
      if (!((prog.scalar_mask >> k) & 1) && prog.period[k] == 0) vec = vec && aligned16(prog.in[k]);
    fused_kernel<4, 8><<<grid_for((n + 3) / 4), kThreads, 0, stream>>>(prog, out, n, vec);
  } else {
    // Wide programs: one element per thread keeps the scratch at 128 bytes.
    fused_kernel<1, kFusedMaxSlots><<<grid_for(n), kThreads, 0, stream>>>(prog, out, n, false);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
