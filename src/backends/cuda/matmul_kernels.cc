// matmul and fused_matmul on CUDA.
//
// Floating dtypes run on cuBLASLt: f32 (TF32 Tensor Cores when allow_tf32()), f16 and
// bf16 (f32 accumulation on Tensor Cores), f64. kiln's row-major C = op(A) op(B) is
// cuBLAS's column-major C^T = op(B)^T op(A)^T: the operands swap and no data moves.
// Batch dimensions that broadcast become strided batches (stride 0 for a broadcast
// operand); dimensions that cannot merge into one strided run loop on the host. A
// weight shared by every batch ([..., M, K] @ [K, N]) folds the batch into M.
//
// The matmul descriptor's layouts and the heuristic's algorithm are cached per
// problem (shapes, strides, dtype, transposes, epilogue, pointer alignments): the
// heuristic query costs far more than the matmul of a small problem.
//
// fused_matmul = activation(a @ b + bias) uses cuBLASLt's BIAS / RELU_BIAS epilogue
// (RELU_BIAS turns NaN into 0, where the CPU keeps NaN); where no algorithm has the
// epilogue, the matmul runs plain and a small kernel adds bias and activation.
//
// Integer dtypes (i8, u8, i32, i64) use a tiled kernel of matmul_kernels.cu that wraps
// around like the CPU's loop.
#include <cublasLt.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_error.h"
#include "kernel_util.h"
#include "matmul_launch.h"
#include "kiln/core/kernel.h"

namespace kiln::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct Geometry {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  // Batch dims of the output and of each operand (right-aligned, padded with 1s).
  std::vector<int64_t> c_batch, a_batch, b_batch;
  int64_t batch = 1;
};

Geometry geometry(const OpContext& ctx) {
  const Shape &a = ctx.in[0].shape(), &b = ctx.in[1].shape(), &c = ctx.out[0].shape();
  Geometry g;
  g.ta = ctx.attrs.get_bool("transpose_a", false);
  g.tb = ctx.attrs.get_bool("transpose_b", false);
  g.M = c[c.rank() - 2];
  g.N = c[c.rank() - 1];
  g.K = g.ta ? a[a.rank() - 2] : a[a.rank() - 1];
  const int nb = c.rank() - 2;
  for (int i = 0; i < nb; ++i) {
    const int ia = a.rank() - 2 - nb + i, ib = b.rank() - 2 - nb + i;
    g.a_batch.push_back(ia >= 0 ? a[ia] : 1);
    g.b_batch.push_back(ib >= 0 ? b[ib] : 1);
    g.c_batch.push_back(c[i]);
    g.batch *= c[i];
  }
  return g;
}

// ---- cuBLASLt plumbing -------------------------------------------------------------------

struct LtTypes {
  cudaDataType_t data;
  cudaDataType_t scale;
  cublasComputeType_t compute;
};

LtTypes lt_types(DType t) {
  switch (t) {
    case DType::kF32:
      return {CUDA_R_32F, CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
    case DType::kF16: return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::kBF16: return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::kF64: return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
    default: throw InternalError("matmul: no cuBLASLt types for dtype " + std::string(dtype_name(t)));
  }
}

// Largest power of two (<= 256) dividing every value.
uint32_t alignment_of(std::initializer_list<uint64_t> values) {
  uint64_t bits = 256;
  for (uint64_t v : values) bits |= v;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const { cublasLtMatrixLayoutDestroy(p); }
};
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* p) const { cublasLtMatmulDescDestroy(p); }
};
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using Pref = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

// One strided-batched GEMM problem in kiln's (row-major) terms.
struct Problem {
  DType dtype = DType::kF32;
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t count = 1;                       // strided batch count
  int64_t stride_a = 0, stride_b = 0;      // element strides between batch matrices (0: broadcast)
  int64_t stride_c = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  uint32_t align_a = 256, align_b = 256, align_c = 256, align_bias = 256;
};

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t count, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  Layout owned(l);
  if (count > 1) {
    const int32_t n = static_cast<int32_t>(count);
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n));
    KILN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return owned;
}

// The matmul descriptor of a problem (bias: the epilogue's bias pointer, or null).
Desc make_desc(const Problem& p, const void* bias) {
  const LtTypes t = lt_types(p.dtype);
  cublasLtMatmulDesc_t d = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, t.compute, t.scale));
  Desc owned(d);
  // cuBLAS operand "A" is kiln's B and "B" is kiln's A (see the file comment).
  const cublasOperation_t op_a = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof p.epilogue));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  return owned;
}

struct Plan {
  Layout a, b, c;  // cuBLAS's A (kiln's B), B (kiln's A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // an algorithm was found
};

std::mutex g_plans_mu;
std::unordered_map<std::string, std::unique_ptr<Plan>> g_plans;

std::string plan_key(const DeviceContext& ctx, const Problem& p) {
  const int64_t v[] = {ctx.logical,
                       static_cast<int64_t>(p.dtype),
                       static_cast<int64_t>(lt_types(p.dtype).compute),
                       p.ta,
                       p.tb,
                       p.M,
                       p.N,
                       p.K,
                       p.count,
                       p.stride_a,
                       p.stride_b,
                       p.stride_c,
                       static_cast<int64_t>(p.epilogue),
                       p.align_a,
                       p.align_b,
                       p.align_c,
                       p.align_bias};
  return std::string(reinterpret_cast<const char*>(v), sizeof v);
}

// The cached plan of a problem; null when cuBLASLt has no algorithm for it.
const Plan* find_plan(DeviceContext& ctx, const Problem& p, const void* bias) {
  const std::string key = plan_key(ctx, p);
  std::lock_guard<std::mutex> lock(g_plans_mu);
  auto it = g_plans.find(key);
  if (it != g_plans.end()) return it->second->ok ? it->second.get() : nullptr;
  const LtTypes t = lt_types(p.dtype);
  auto plan = std::make_unique<Plan>();
  // Column-major views (rows, cols, ld) of the row-major operands.
  plan->a = p.tb ? make_layout(t.data, p.K, p.N, p.K, p.count, p.stride_b)
                 : make_layout(t.data, p.N, p.K, p.N, p.count, p.stride_b);
  plan->b = p.ta ? make_layout(t.data, p.M, p.K, p.M, p.count, p.stride_a)
                 : make_layout(t.data, p.K, p.M, p.K, p.count, p.stride_a);
  plan->c = make_layout(t.data, p.N, p.M, p.N, p.count, p.stride_c);
  Desc desc = make_desc(p, bias);
  cublasLtMatmulPreference_t pr = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pr));
  Pref pref(pr);
  const uint64_t ws = kWorkspaceBytes;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // cuBLAS's A is kiln's B and vice versa.
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p.align_b,
                                                         sizeof p.align_b));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p.align_a,
                                                         sizeof p.align_a));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p.align_c,
                                                         sizeof p.align_c));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p.align_c,
                                                         sizeof p.align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, desc.get(), plan->a.get(), plan->b.get(),
                                                     plan->c.get(), plan->c.get(), pr, 1, &result, &found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->ok = true;
  } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
    KILN_CUBLAS_CHECK(st);
  }
  Plan* raw = plan.get();
  g_plans.emplace(key, std::move(plan));
  return raw->ok ? raw : nullptr;
}

// Runs one strided-batched problem; false when cuBLASLt has no algorithm for it.
bool run_problem(KernelScope& s, const Problem& p, const void* a, const void* b, void* c, const void* bias) {
  const Plan* plan = find_plan(s.ctx, p, bias);
  if (!plan) return false;
  Desc desc = make_desc(p, bias);
  void* ws = workspace(s.ctx, kWorkspaceBytes);
  if (p.dtype == DType::kF64) {
    const double alpha = 1.0, beta = 0.0;
    KILN_CUBLAS_CHECK(cublasLtMatmul(s.ctx.cublaslt, desc.get(), &alpha, b, plan->a.get(), a, plan->b.get(), &beta, c,
                                     plan->c.get(), c, plan->c.get(), &plan->algo, ws, kWorkspaceBytes, s.stream));
  } else {
    const float alpha = 1.0f, beta = 0.0f;
    KILN_CUBLAS_CHECK(cublasLtMatmul(s.ctx.cublaslt, desc.get(), &alpha, b, plan->a.get(), a, plan->b.get(), &beta, c,
                                     plan->c.get(), c, plan->c.get(), &plan->algo, ws, kWorkspaceBytes, s.stream));
  }
  return true;
}

uint64_t addr(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

// C = op(A) op(B) over the broadcast batch of `g` (epilogue: for the unbatched
// fused_matmul only; returns false when no algorithm has it, before anything ran).
bool gemm(KernelScope& s, const Geometry& g, DType dtype, const void* A, const void* B, void* C,
          cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT, const void* bias = nullptr) {
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  const int64_t mat_a = g.M * g.K, mat_b = g.K * g.N, mat_c = g.M * g.N;
  // Batch dims (outermost first) with each operand's element stride, 0 where broadcast;
  // size-1 output dims dropped, then runs that are strided alike for A, B and C merged.
  struct Dim {
    int64_t size, sa, sb, sc;
  };
  std::vector<Dim> dims;
  {
    const int nb = static_cast<int>(g.c_batch.size());
    std::vector<Dim> all(nb);
    int64_t ra = mat_a, rb = mat_b, rc = mat_c;
    for (int i = nb - 1; i >= 0; --i) {
      all[i] = {g.c_batch[i], g.a_batch[i] == 1 ? 0 : ra, g.b_batch[i] == 1 ? 0 : rb, rc};
      ra *= g.a_batch[i];
      rb *= g.b_batch[i];
      rc *= g.c_batch[i];
    }
    for (const Dim& d : all) {
      if (d.size == 1) continue;
      dims.push_back(d);
    }
    // Merge from the inside out: dim i folds into dim i+1 when its strides continue it.
    std::vector<Dim> merged;
    for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
      const Dim& d = dims[i];
      if (!merged.empty()) {
        Dim& in = merged.back();
        if (d.sa == in.sa * in.size && d.sb == in.sb * in.size && d.sc == in.sc * in.size) {
          in.size *= d.size;
          continue;
        }
      }
      merged.push_back(d);
    }
    dims.assign(merged.rbegin(), merged.rend());
  }
  Problem p;
  p.dtype = dtype;
  p.ta = g.ta;
  p.tb = g.tb;
  p.M = g.M;
  p.N = g.N;
  p.K = g.K;
  p.epilogue = epilogue;
  std::vector<Dim> outer;
  if (!dims.empty()) {
    const Dim inner = dims.back();
    outer.assign(dims.begin(), dims.end() - 1);
    if (outer.empty() && inner.sb == 0 && inner.sa == mat_a && !g.ta) {
      p.M = g.M * inner.size;  // shared B: one GEMM of M * batch rows
    } else {
      if (inner.size > 0x7fffffff) throw UnimplementedError("matmul: batch too large for cuBLASLt");
      p.count = inner.size;
      p.stride_a = inner.sa;
      p.stride_b = inner.sb;
      p.stride_c = inner.sc;
    }
  }
  // Alignment of every pointer the problem is called with (bases, batch strides, outer steps).
  uint64_t oa = 0, ob = 0, oc = 0;
  for (const Dim& d : outer) {
    oa |= static_cast<uint64_t>(d.sa * es);
    ob |= static_cast<uint64_t>(d.sb * es);
    oc |= static_cast<uint64_t>(d.sc * es);
  }
  p.align_a = alignment_of({addr(A), static_cast<uint64_t>(p.stride_a * es), oa});
  p.align_b = alignment_of({addr(B), static_cast<uint64_t>(p.stride_b * es), ob});
  p.align_c = alignment_of({addr(C), static_cast<uint64_t>(p.stride_c * es), oc});
  p.align_bias = bias ? alignment_of({addr(bias)}) : 256;
  int64_t n_outer = 1;
  for (const Dim& d : outer) n_outer *= d.size;
  const char* a = static_cast<const char*>(A);
  const char* b = static_cast<const char*>(B);
  char* c = static_cast<char*>(C);
  for (int64_t o = 0; o < n_outer; ++o) {
    int64_t rem = o, offa = 0, offb = 0, offc = 0;
    for (int i = static_cast<int>(outer.size()) - 1; i >= 0; --i) {
      const int64_t idx = rem % outer[i].size;
      rem /= outer[i].size;
      offa += idx * outer[i].sa;
      offb += idx * outer[i].sb;
      offc += idx * outer[i].sc;
    }
    if (!run_problem(s, p, a + offa * es, b + offb * es, c + offc * es, bias)) {
      if (o == 0) return false;
      throw InternalError("matmul: cuBLASLt plan vanished");  // unreachable: plans are cached
    }
  }
  return true;
}

// ---- kernels -----------------------------------------------------------------------------

void matmul_float(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const Geometry g = geometry(ctx);
  if (g.K == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), s.stream));
    return;
  }
  if (!gemm(s, g, out.dtype(), ctx.in[0].raw_data(), ctx.in[1].raw_data(), out.raw_data()))
    throw UnimplementedError("matmul: cuBLASLt has no algorithm for " + ctx.in[0].shape().str() + " @ " +
                             ctx.in[1].shape().str() + " (" + std::string(dtype_name(out.dtype())) + ")");
}

void matmul_int(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const Geometry g = geometry(ctx);
  if (g.K == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), s.stream));
    return;
  }
  const Shape cb(g.c_batch), ab(g.a_batch), bb(g.b_batch);
  launch_matmul_int(ctx.in[0].raw_data(), ctx.in[1].raw_data(), out.raw_data(), out.dtype(), g.batch, g.M, g.N, g.K,
                    g.ta, g.tb, make_broadcast_map(cb, ab), make_broadcast_map(cb, bb), s.stream);
}

void fused_matmul(OpContext& ctx) {
  Tensor& out = ctx.out[0];
  if (out.numel() == 0) return;
  KernelScope s(out);
  const Geometry g = geometry(ctx);
  const bool relu = ctx.attrs.get_string("activation", "") == "relu";
  const void* bias = ctx.in[2].raw_data();
  if (g.K == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), s.stream));
  } else {
    const cublasLtEpilogue_t epi = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    if (gemm(s, g, out.dtype(), ctx.in[0].raw_data(), ctx.in[1].raw_data(), out.raw_data(), epi, bias)) return;
    if (!gemm(s, g, out.dtype(), ctx.in[0].raw_data(), ctx.in[1].raw_data(), out.raw_data()))
      throw UnimplementedError("fused_matmul: cuBLASLt has no algorithm for " + ctx.in[0].shape().str() + " @ " +
                               ctx.in[1].shape().str() + " (" + std::string(dtype_name(out.dtype())) + ")");
  }
  launch_bias_act(out.raw_data(), out.dtype(), out.numel(), bias, ctx.in[2].dtype(), g.N, 1, relu, s.stream);
}

KILN_REGISTER_KERNEL("matmul", kCUDA, KILN_CUDA_FLOAT_DTYPES, matmul_float);
KILN_REGISTER_KERNEL("matmul", kCUDA, (std::initializer_list<DType>{DType::kI8, DType::kU8, DType::kI32, DType::kI64}),
                     matmul_int);
KILN_REGISTER_KERNEL("fused_matmul", kCUDA, KILN_CUDA_FLOAT_DTYPES, fused_matmul);

}  // namespace
}  // namespace kiln::cuda
