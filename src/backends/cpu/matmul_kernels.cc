// CPU matmul: oneDNN for f32 (and bf16/f16 where the CPU has native support), except
// a graph's matmuls against a constant B (small_gemm.h, packed_gemm.h) and dense
// weight gradients (packed_gemm.h), as select_matmul (kernel_selection.h) decides once
// per node and shapes; otherwise bf16/f16 widen to f32;
// f64 and integers use a cache-blocked loop.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernel_util.h"
#include "kiln/core/kernel.h"
#include "kernel_selection.h"
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

MatmulGeom geometry(const Shape& a, const Shape& b, const Shape& c, const Attrs& attrs) {
  MatmulGeom g;
  g.d.trans_a = attrs.get_bool("transpose_a", false);
  g.d.trans_b = attrs.get_bool("transpose_b", false);
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

MatmulGeom geometry(const OpContext& ctx) {
  return geometry(ctx.in[0].shape(), ctx.in[1].shape(), ctx.out[0].shape(), ctx.attrs);
}

// bias [N] (and ReLU) over the rows of c.
void add_bias_rows(float* c, int64_t rows, int64_t n, const float* bias, bool relu) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = c + i * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = relu ? std::max(row[j] + bias[j], 0.0f) : row[j] + bias[j];
  }
}

// f32 matmul and fused_matmul (activation(a @ b + bias)), prepared per node and shapes:
// the algorithm chosen once (select_matmul), a constant B packed once (shared with the
// node's other shapes when they need the same packing).
class MatmulF32 final : public PreparedKernel {
 public:
  MatmulF32(const PrepareContext& pc, bool fused) {
    g_ = geometry(pc.in[0].shape, pc.in[1].shape, pc.out[0].shape, pc.attrs);
    relu_ = fused && pc.attrs.get_string("activation", "") == "relu";
    const onednn::GemmDims& d = g_.d;
    const Tensor* b = pc.constant(1);
    algo_ = select_matmul({g_.batch, d.M, d.K, d.N, d.trans_a, d.trans_b, pc.in[0].shape.rank(),
                           pc.in[1].shape.rank(), b != nullptr, fused});
    if (algo_ != MatmulAlgo::kSmallGemm && algo_ != MatmulAlgo::kPackedGemm) return;
    if (const auto* prev = dynamic_cast<const MatmulF32*>(pc.previous);
        prev && prev->algo_ == algo_ && prev->g_.d.K == d.K && prev->g_.d.N == d.N && prev->g_.d.trans_b == d.trans_b) {
      packed_b_ = prev->packed_b_;
      return;
    }
    const bool small = algo_ == MatmulAlgo::kSmallGemm;
    auto v = std::make_shared<std::vector<float>>(small ? small_gemm::packed_size(d.K, d.N)
                                                        : packed_gemm::packed_size(d.K, d.N));
    if (small) small_gemm::pack(b->data<float>(), d.K, d.N, d.trans_b, v->data());
    else packed_gemm::pack(b->data<float>(), d.K, d.N, d.trans_b, v->data());
    packed_b_ = std::move(v);
  }

  void run(OpContext& ctx) const override {
    const onednn::GemmDims& d = g_.d;
    const float* bias = ctx.in.size() > 2 ? ctx.in[2].data<float>() : nullptr;
    const int64_t rows = g_.batch * d.M;
    float* c = ctx.out[0].data<float>();
    switch (algo_) {
      case MatmulAlgo::kNothing: return;
      case MatmulAlgo::kZeros:
        std::memset(c, 0, ctx.out[0].nbytes());
        if (bias) add_bias_rows(c, rows, d.N, bias, relu_);
        return;
      case MatmulAlgo::kSmallGemm:
        small_gemm::run(ctx.in[0].data<float>(), rows, d.K, d.N, packed_b_->data(), bias, relu_, c);
        return;
      case MatmulAlgo::kPackedGemm:
        packed_gemm::run(ctx.in[0].data<float>(), false, rows, d.K, d.N, packed_b_->data(), bias, relu_, c);
        return;
      case MatmulAlgo::kWeightGradient: {
        thread_local std::vector<float> packed;  // per thread, only grows
        const size_t need = packed_gemm::packed_size(d.K, d.N);
        if (packed.size() < need) packed.resize(need);
        packed_gemm::pack(ctx.in[1].data<float>(), d.K, d.N, false, packed.data());
        packed_gemm::run(ctx.in[0].data<float>(), true, d.M, d.K, d.N, packed.data(), nullptr, false, c);
        return;
      }
      case MatmulAlgo::kOneDnnThenBias:
        onednn::gemm(d, DType::kF32, ctx.in[0].raw_data(), ctx.in[1].raw_data(), c);
        add_bias_rows(c, rows, d.N, bias, relu_);
        return;
      case MatmulAlgo::kOneDnn:
        if (bias) onednn::gemm(d, DType::kF32, ctx.in[0].raw_data(), ctx.in[1].raw_data(), bias, relu_, c);
        else onednn::gemm(d, DType::kF32, ctx.in[0].raw_data(), ctx.in[1].raw_data(), c);
        return;
    }
  }

 private:
  MatmulGeom g_;
  bool relu_ = false;
  MatmulAlgo algo_ = MatmulAlgo::kOneDnn;
  std::shared_ptr<const std::vector<float>> packed_b_;
};

std::unique_ptr<const PreparedKernel> prepare_matmul_f32(const PrepareContext& pc) {
  return std::make_unique<MatmulF32>(pc, false);
}
std::unique_ptr<const PreparedKernel> prepare_fused_matmul_f32(const PrepareContext& pc) {
  return std::make_unique<MatmulF32>(pc, true);
}

void matmul_low_precision(OpContext& ctx) {
  if (ctx.out[0].numel() == 0) return;
  MatmulGeom g = geometry(ctx);
  if (g.d.K > 0 &&
      onednn::gemm(g.d, ctx.in[0].dtype(), ctx.in[0].raw_data(), ctx.in[1].raw_data(), ctx.out[0].raw_data()))
    return;
  via_f32<detail::run_prepared_eagerly<prepare_matmul_f32>>(ctx);
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

KILN_REGISTER_PREPARED_KERNEL("matmul", kCPU, DType::kF32, prepare_matmul_f32);
KILN_REGISTER_PREPARED_KERNEL("fused_matmul", kCPU, DType::kF32, prepare_fused_matmul_f32);
KILN_REGISTER_KERNEL("matmul", kCPU, (std::initializer_list<DType>{DType::kBF16, DType::kF16}), matmul_low_precision);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kF64, matmul_loop<double>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kI32, matmul_loop<int32_t>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kI64, matmul_loop<int64_t>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kI8, matmul_loop<int8_t>);
KILN_REGISTER_KERNEL("matmul", kCPU, DType::kU8, matmul_loop<uint8_t>);

}  // namespace
}  // namespace kiln::cpu
