// CPU matmul: oneDNN for f32 (and bf16/f16 where the CPU has native support), except
// a graph's matmuls against a constant B (small_gemm.h, packed_gemm.h) and dense
// weight gradients (packed_gemm.h); otherwise bf16/f16 widen to f32;
// f64 and integers use a cache-blocked loop.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_util.h"
#include "kiln/core/kernel.h"
#include "core/kernel_cache.h"
#include "kiln/core/parallel.h"
#include "onednn.h"
#include "packed_gemm.h"
#include "small_gemm.h"

namespace kiln::cpu {
namespace {

struct MatmulGeom {
  onednn::GemmDims d;
  Shape c_batch;
  int64_t batch = 1;  // number of output matrices
};

MatmulGeom geometry(const OpContext& ctx) {
  const Shape &a = ctx.in[0].shape(), &b = ctx.in[1].shape(), &c = ctx.out[0].shape();
  MatmulGeom g;
  g.d.trans_a = ctx.attrs.get_bool("transpose_a", false);
  g.d.trans_b = ctx.attrs.get_bool("transpose_b", false);
  g.d.M = c[c.rank() - 2];
  g.d.N = c[c.rank() - 1];
  g.d.K = g.d.trans_a ? a[a.rank() - 2] : a[a.rank() - 1];
  int nb = c.rank() - 2;
  for (int i = 0; i < nb; ++i) {
    int ia = a.rank() - 2 - nb + i, ib = b.rank() - 2 - nb + i;
    g.d.a_batch.push_back(ia >= 0 ? a[ia] : 1);
    g.d.b_batch.push_back(ib >= 0 ? b[ib] : 1);
    g.d.c_batch.push_back(c[i]);
    g.batch *= c[i];
  }
  return g;
}

// The kernel cache's key for B packed for `kernel` (small_gemm or packed_gemm): the
// shape and transposition, formatted on the stack (no allocation per call).
struct PackKey {
  char text[64];
  PackKey(const char* kernel, const onednn::GemmDims& d) {
    std::snprintf(text, sizeof text, "%s B %lldx%lld%s", kernel, static_cast<long long>(d.K),
                  static_cast<long long>(d.N), d.trans_b ? " T" : "");
  }
};

// A graph's matmul against a constant B [K, N] (or [N, K]): B packed once per node
// for the small-M kernel (small_gemm.h: a few rows, or any against a tiny B) or the
// 6x16 one (packed_gemm.h: up to kPackedGemmMaxRows rows, where it beats oneDNN). A's
// batch dims, if any, are more rows (B has none). False when neither applies.
constexpr int64_t kPackedGemmMaxRows = 512;  // level with oneDNN from here (docs/benchmarks.md)

bool gemm_with_constant_b(const OpContext& ctx, const MatmulGeom& g, const float* bias, bool relu) {
  const auto& d = g.d;
  const int64_t rows = g.batch * d.M;
  if (d.trans_a || ctx.in[1].shape().rank() != 2) return false;
  const bool small = small_gemm::supports(rows, d.K, d.N);
  if (!small && !(rows <= kPackedGemmMaxRows && packed_gemm::available())) return false;
  KernelCache* cache = current_kernel_cache();
  if (!cache || !cache->constant_input(1)) return false;
  const float* b = ctx.in[1].data<float>();
  const float* a = ctx.in[0].data<float>();
  float* c = ctx.out[0].data<float>();
  if (small) {
    auto packed = cache->get<std::vector<float>>(PackKey("small gemm", d).text, [&] {
      std::vector<float> v(small_gemm::packed_size(d.K, d.N));
      small_gemm::pack(b, d.K, d.N, d.trans_b, v.data());
      return v;
    });
    small_gemm::run(a, rows, d.K, d.N, packed->data(), bias, relu, c);
  } else {
    auto packed = cache->get<std::vector<float>>(PackKey("packed gemm", d).text, [&] {
      std::vector<float> v(packed_gemm::packed_size(d.K, d.N));
      packed_gemm::pack(b, d.K, d.N, d.trans_b, v.data());
      return v;
    });
    packed_gemm::run(a, false, rows, d.K, d.N, packed->data(), bias, relu, c);
  }
  return true;
}

// A weight gradient op(A)^T @ B of a dense layer, A [K, M] with K a batch of up to
// kMaxPackedK rows and B = dY [K, N]: B is small, so packing it per call (into a
// per-thread buffer that only grows) costs little next to the M x N output
// (measured 1.1-1.2x oneDNN on the mlp's and the cnn's weight gradients).
constexpr int64_t kMaxPackedK = 256;

bool gemm_weight_gradient(const OpContext& ctx, const MatmulGeom& g) {
  const auto& d = g.d;
  if (!d.trans_a || d.trans_b || g.batch != 1 || ctx.in[0].shape().rank() != 2 || ctx.in[1].shape().rank() != 2 ||
      d.K > kMaxPackedK || d.M < 64 || !packed_gemm::available())
    return false;
  thread_local std::vector<float> packed;
  const size_t need = packed_gemm::packed_size(d.K, d.N);
  if (packed.size() < need) packed.resize(need);
  packed_gemm::pack(ctx.in[1].data<float>(), d.K, d.N, false, packed.data());
  packed_gemm::run(ctx.in[0].data<float>(), true, d.M, d.K, d.N, packed.data(), nullptr, false,
                   ctx.out[0].data<float>());
  return true;
}

void matmul_f32(OpContext& ctx) {
  if (ctx.out[0].numel() == 0) return;
  MatmulGeom g = geometry(ctx);
  if (g.d.K == 0) {
    std::memset(ctx.out[0].raw_data(), 0, ctx.out[0].nbytes());
    return;
  }
  if (gemm_with_constant_b(ctx, g, nullptr, false) || gemm_weight_gradient(ctx, g)) return;
  onednn::gemm(g.d, DType::kF32, ctx.in[0].raw_data(), ctx.in[1].raw_data(), ctx.out[0].raw_data());
}

void matmul_low_precision(OpContext& ctx) {
  if (ctx.out[0].numel() == 0) return;
  MatmulGeom g = geometry(ctx);
  if (g.d.K > 0 &&
      onednn::gemm(g.d, ctx.in[0].dtype(), ctx.in[0].raw_data(), ctx.in[1].raw_data(), ctx.out[0].raw_data()))
    return;
  via_f32<matmul_f32>(ctx);
}

// Offset of batch element `i` of an operand whose batch dims broadcast to c's.
int64_t batch_offset(int64_t i, const onednn::GemmDims& d, const dnnl::memory::dims& own, int64_t mat) {
  int64_t off = 0, stride = mat;
  for (int k = static_cast<int>(own.size()) - 1; k >= 0; --k) {
    int64_t idx = i % d.c_batch[k];
    i /= d.c_batch[k];
    if (own[k] != 1) off += idx * stride;
    stride *= own[k];
  }
  return off;
}

template <typename T>
void matmul_loop(OpContext& ctx) {
  MatmulGeom g = geometry(ctx);
  const auto& d = g.d;
  const T* A = static_cast<const T*>(ctx.in[0].raw_data());
  const T* B = static_cast<const T*>(ctx.in[1].raw_data());
  T* C = static_cast<T*>(ctx.out[0].raw_data());
  const int64_t M = d.M, N = d.N, K = d.K;
  parallel_for(g.batch * M, std::max<int64_t>(1, 4096 / std::max<int64_t>(N * K, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t bi = r / M, m = r % M;
      const T* a = A + batch_offset(bi, d, d.a_batch, M * K);
      const T* b = B + batch_offset(bi, d, d.b_batch, K * N);
      T* c = C + bi * M * N + m * N;
      std::fill(c, c + N, T(0));
      for (int64_t k = 0; k < K; ++k) {
        T av = d.trans_a ? a[k * M + m] : a[m * K + k];
        if (d.trans_b) {
          for (int64_t n = 0; n < N; ++n) c[n] = static_cast<T>(c[n] + av * b[n * K + k]);
        } else {
          const T* brow = b + k * N;
#pragma omp simd
          for (int64_t n = 0; n < N; ++n) c[n] = static_cast<T>(c[n] + av * brow[n]);
        }
      }
    }
  });
}

// activation(a @ b + bias) in one oneDNN call (bias and ReLU as post-ops).
void fused_matmul_f32(OpContext& ctx) {
  if (ctx.out[0].numel() == 0) return;
  MatmulGeom g = geometry(ctx);
  const bool relu = ctx.attrs.get_string("activation", "") == "relu";
  const float* bias = ctx.in[2].data<float>();
  float* c = ctx.out[0].data<float>();
  if (g.d.K > 0 && gemm_with_constant_b(ctx, g, bias, relu)) return;
  // oneDNN's bias/ReLU post-processing costs more than a plain loop over a few rows
  // (measured: batch-1 MLP layers 10% slower fused), so small M adds them here.
  if (g.d.K == 0 || g.d.M < 32) {
    if (g.d.K == 0) std::memset(c, 0, ctx.out[0].nbytes());
    else onednn::gemm(g.d, DType::kF32, ctx.in[0].raw_data(), ctx.in[1].raw_data(), c);
    for (int64_t i = 0; i < g.d.M; ++i) {
      float* row = c + i * g.d.N;
#pragma omp simd
      for (int64_t j = 0; j < g.d.N; ++j) row[j] = relu ? std::max(row[j] + bias[j], 0.0f) : row[j] + bias[j];
    }
    return;
  }
  onednn::gemm(g.d, DType::kF32, ctx.in[0].raw_data(), ctx.in[1].raw_data(), bias, relu, c);
}

KILN_REGISTER_KERNEL("matmul", kCPU, DType::kF32, matmul_f32);
KILN_REGISTER_KERNEL("fused_matmul", kCPU, DType::kF32, fused_matmul_f32);
KILN_REGISTER_KERNEL("matmul", kCPU, (std::initializer_list<DType>{DType::kBF16, DType::kF16}), matmul_low_precision);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kF64, matmul_loop<double>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kI32, matmul_loop<int32_t>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kI64, matmul_loop<int64_t>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kI8, matmul_loop<int8_t>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kU8, matmul_loop<uint8_t>);

}  // namespace
}  // namespace kiln::cpu
