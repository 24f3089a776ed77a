// Op-library benchmarks against peers in the same process:
//   matmul f32/bf16 vs oneDNN called directly;
//   elementwise add/mul/exp on 64 MiB f32 vs STREAM-style loops (copy and the same op);
//   eager dispatch overhead of a tiny add;
//   dense_784x256/<rows>: relu(x @ w + b) for 1-16 rows against constant weights, kiln
//   (a traced function: the small-M kernel up to 8 rows, src/backends/cpu/small_gemm.h;
//   KILN_SMALL_GEMM=0 for oneDNN) vs oneDNN's matmul with bias and ReLU post-ops;
//   the cnn's 3x3 32->64 NHWC convolution (14x14, batch 1-128), forward, backward
//   data and backward filter, and its first layer 3x3 1->32 (28x28) forward: kiln (its
//   direct kernel; KILN_DIRECT_CONV=0 for oneDNN) vs oneDNN's primitives called
//   directly (filters pre-reordered to its layout);
//   conv1_pool_grad/<batch>: the first layer's filter and bias gradients through its
//   ReLU and 2x2 max pool, fused_conv2d_backward_filter vs the unfused ops;
//   fma_peak/<256|512>: the CPU's FMA peak with 256- and 512-bit registers, what the
//   packed_gemm GFLOP/s compare with.
// Run: build/release/bin/bench_ops --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <array>
#include <cmath>
#include <unordered_map>
#include <vector>

#include "backends/cpu/packed_gemm.h"
#include "backends/cpu/vecmath.h"
#include "kiln/core/cpu_isa.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/graph/function.h"
#include "kiln/kiln.h"
#include "kiln/ops/nn_grad.h"
#include "fma_chains.h"
#include "ratio_reporter.h"

using namespace kiln;

namespace {

// ---- matmul ------------------------------------------------------------------------

void matmul_kiln(benchmark::State& st, DType dt) {
  int64_t n = st.range(0);
  Tensor a = ops::random_uniform({n, n}, -1, 1, DType::kF32, 1).to(dt);
  Tensor b = ops::random_uniform({n, n}, -1, 1, DType::kF32, 2).to(dt);
  for (auto _ : st) benchmark::DoNotOptimize(ops::matmul(a, b).raw_data());
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
}

void matmul_onednn(benchmark::State& st, dnnl::memory::data_type dt) {
  using namespace dnnl;
  int64_t n = st.range(0);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  memory::desc md({n, n}, dt, memory::format_tag::ab);
  memory::desc fmd({n, n}, memory::data_type::f32, memory::format_tag::ab);
  matmul::primitive_desc pd(matmul::desc(md, md, md), eng);
  matmul mm(pd);
  memory a(md, eng), b(md, eng), c(md, eng);
  std::vector<float> src(static_cast<size_t>(n * n));
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(static_cast<float>(i));
  memory fa(fmd, eng, src.data());
  reorder(fa, a).execute(s, fa, a);
  reorder(fa, b).execute(s, fa, b);
  s.wait();
  for (auto _ : st) {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
  st.SetLabel(pd.impl_info_str());
}

void BM_matmul_f32_kiln(benchmark::State& st) { matmul_kiln(st, DType::kF32); }
void BM_matmul_f32_peer(benchmark::State& st) { matmul_onednn(st, dnnl::memory::data_type::f32); }
void BM_matmul_bf16_kiln(benchmark::State& st) { matmul_kiln(st, DType::kBF16); }
// The peer for bf16 is oneDNN's best path on this CPU for the same math: f32 (it has
// no optimised bf16 matmul without AVX-512; its bf16 "ref" kernel is ~100x slower).
void BM_matmul_bf16_peer(benchmark::State& st) { matmul_onednn(st, dnnl::memory::data_type::f32); }

BENCHMARK(BM_matmul_f32_kiln)->Name("matmul_f32/kiln")->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_matmul_f32_peer)->Name("matmul_f32/peer")->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_matmul_bf16_kiln)->Name("matmul_bf16/kiln")->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_matmul_bf16_peer)->Name("matmul_bf16/peer")->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- conv2d: the cnn's second layer (and its first, forward) ------------------------

struct ConvLayer {
  int64_t h, c, o;  // h x h input, c -> o channels, 3x3 "same"
};
constexpr ConvLayer kConv2{14, 32, 64}, kConv1{28, 1, 32};

ops::Conv2dOptions same_conv() {
  ops::Conv2dOptions o;
  o.padding = "same";
  return o;
}

void conv_counters(benchmark::State& st, const ConvLayer& l, int64_t n) {
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * n * l.h * l.h * l.o * l.c * 9,
                                             benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// pass: 0 forward, 1 backward data, 2 backward filter.
void conv_kiln(benchmark::State& st, int pass, const ConvLayer& l = kConv2) {
  const int64_t n = st.range(0);
  Tensor x = ops::random_uniform({n, l.h, l.h, l.c}, -1, 1, DType::kF32, 1);
  Tensor w = ops::random_uniform({3, 3, l.c, l.o}, -1, 1, DType::kF32, 2);
  Tensor dy = ops::random_uniform({n, l.h, l.h, l.o}, -1, 1, DType::kF32, 3);
  for (auto _ : st) {
    Tensor r = pass == 0   ? ops::conv2d(x, w, same_conv())
               : pass == 1 ? ops::conv2d_backward_data(dy, w, x.shape(), same_conv())
                           : ops::conv2d_backward_filter(x, dy, w.shape(), same_conv());
    benchmark::DoNotOptimize(r.raw_data());
  }
  conv_counters(st, l, n);
}

void conv_onednn(benchmark::State& st, int pass, const ConvLayer& l = kConv2) {
  using namespace dnnl;
  const int64_t n = st.range(0);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const auto f32 = memory::data_type::f32;
  memory::desc src({n, l.c, l.h, l.h}, f32, memory::format_tag::nhwc);
  memory::desc dst({n, l.o, l.h, l.h}, f32, memory::format_tag::nhwc);
  memory::desc wany({l.o, l.c, 3, 3}, f32, memory::format_tag::any);
  const memory::dims one{1, 1}, none{0, 0};
  convolution_forward::desc fd(prop_kind::forward_training, algorithm::convolution_direct, src, wany, dst, one, none,
                               one, one);
  convolution_forward::primitive_desc fpd(fd, eng);
  memory xs(src, eng), ys(dst, eng), ws(fpd.weights_desc(), eng);
  for (memory* m : {&xs, &ys, &ws}) {
    float* p = static_cast<float*>(m->get_data_handle());
    for (size_t i = 0; i < m->get_desc().get_size() / sizeof(float); ++i) p[i] = std::sin(static_cast<float>(i));
  }
  primitive prim;
  std::unordered_map<int, memory> args;
  if (pass == 0) {
    prim = convolution_forward(fpd);
    args = {{DNNL_ARG_SRC, xs}, {DNNL_ARG_WEIGHTS, ws}, {DNNL_ARG_DST, ys}};
    st.SetLabel(fpd.impl_info_str());
  } else if (pass == 1) {
    convolution_backward_data::primitive_desc pd(
        convolution_backward_data::desc(algorithm::convolution_direct, src, wany, dst, one, none, one, one), eng, fpd);
    memory wd(pd.weights_desc(), eng), dx(src, eng);
    reorder(ws, wd).execute(s, ws, wd);
    prim = convolution_backward_data(pd);
    args = {{DNNL_ARG_DIFF_DST, ys}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dx}};
    st.SetLabel(pd.impl_info_str());
  } else {
    convolution_backward_weights::primitive_desc pd(
        convolution_backward_weights::desc(algorithm::convolution_direct, src, wany, dst, one, none, one, one), eng,
        fpd);
    memory dw(pd.diff_weights_desc(), eng);
    prim = convolution_backward_weights(pd);
    args = {{DNNL_ARG_SRC, xs}, {DNNL_ARG_DIFF_DST, ys}, {DNNL_ARG_DIFF_WEIGHTS, dw}};
    st.SetLabel(pd.impl_info_str());
  }
  s.wait();
  for (auto _ : st) {
    prim.execute(s, args);
    s.wait();
  }
  conv_counters(st, l, n);
}

void BM_conv_fwd_kiln(benchmark::State& st) { conv_kiln(st, 0); }
void BM_conv_fwd_peer(benchmark::State& st) { conv_onednn(st, 0); }
void BM_conv_bwd_data_kiln(benchmark::State& st) { conv_kiln(st, 1); }
void BM_conv_bwd_data_peer(benchmark::State& st) { conv_onednn(st, 1); }
void BM_conv_bwd_filter_kiln(benchmark::State& st) { conv_kiln(st, 2); }
void BM_conv_bwd_filter_peer(benchmark::State& st) { conv_onednn(st, 2); }
void BM_conv1_fwd_kiln(benchmark::State& st) { conv_kiln(st, 0, kConv1); }
void BM_conv1_fwd_peer(benchmark::State& st) { conv_onednn(st, 0, kConv1); }
#define KILN_CONV_BENCH(fn, name)     \
  BENCHMARK(fn)                       \
      ->Name(name)                    \
      ->Arg(1)                        \
      ->Arg(4)                        \
      ->Arg(8)                        \
      ->Arg(32)                       \
      ->Arg(64)                       \
      ->Arg(128)                      \
      ->Unit(benchmark::kMicrosecond) \
      ->UseRealTime()
KILN_CONV_BENCH(BM_conv_fwd_kiln, "conv3x3_32to64_fwd/kiln");
KILN_CONV_BENCH(BM_conv_fwd_peer, "conv3x3_32to64_fwd/peer");
KILN_CONV_BENCH(BM_conv_bwd_data_kiln, "conv3x3_32to64_bwd_data/kiln");
KILN_CONV_BENCH(BM_conv_bwd_data_peer, "conv3x3_32to64_bwd_data/peer");
KILN_CONV_BENCH(BM_conv_bwd_filter_kiln, "conv3x3_32to64_bwd_filter/kiln");
KILN_CONV_BENCH(BM_conv_bwd_filter_peer, "conv3x3_32to64_bwd_filter/peer");
KILN_CONV_BENCH(BM_conv1_fwd_kiln, "conv3x3_1to32_fwd/kiln");
KILN_CONV_BENCH(BM_conv1_fwd_peer, "conv3x3_1to32_fwd/peer");
#undef KILN_CONV_BENCH

// The first layer's gradients in a training step (the cnn: 28x28, 3x3 1->32, ReLU, 2x2
// max pool): kiln = fused_conv2d_backward_filter (what the graph runs, relu + bias) vs
// peer = the ops it replaces, as eager mode runs them (max_pool2d_backward, relu_grad,
// conv2d_backward_filter, the bias sum).
struct PooledLayer {
  Tensor x, y, dp;
  explicit PooledLayer(int64_t n)
      : x(ops::random_uniform({n, 28, 28, 1}, 0, 1, DType::kF32, 1)),
        y(ops::relu(ops::random_uniform({n, 28, 28, 32}, -1, 1, DType::kF32, 2))),
        dp(ops::random_uniform({n, 14, 14, 32}, -1, 1, DType::kF32, 3)) {}
};
void BM_conv1_pool_grad_kiln(benchmark::State& st) {
  PooledLayer l(st.range(0));
  Attrs a{{"filter_shape", std::vector<int64_t>{3, 3, 1, 32}},
          {"padding", std::string("same")},
          {"relu", true},
          {"bias_grad", true}};
  const OpDef& op = OpRegistry::global().get("fused_conv2d_backward_filter");
  for (auto _ : st) benchmark::DoNotOptimize(call_op(op, std::vector<Tensor>{l.x, l.y, l.dp}, a));
}
void BM_conv1_pool_grad_peer(benchmark::State& st) {
  PooledLayer l(st.range(0));
  for (auto _ : st) {
    Tensor d = ops::relu_grad(ops::max_pool2d_backward(l.y, l.dp, {2, 2}, {2, 2}, "valid"), l.y);
    benchmark::DoNotOptimize(ops::conv2d_backward_filter(l.x, d, {3, 3, 1, 32}, same_conv()));
    benchmark::DoNotOptimize(ops::sum(d, {0, 1, 2}));
  }
}
BENCHMARK(BM_conv1_pool_grad_kiln)
    ->Name("conv1_pool_grad/kiln")
    ->Arg(32)
    ->Arg(128)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_conv1_pool_grad_peer)
    ->Name("conv1_pool_grad/peer")
    ->Arg(32)
    ->Arg(128)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- elementwise on 64 MiB ---------------------------------------------------------

constexpr int64_t kBig = (64 << 20) / 4;  // 16 Mi floats

void set_bytes(benchmark::State& st, int64_t arrays) {
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(arrays * kBig * 4), benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}

struct Arrays {
  std::vector<float> a, b, c;
  Arrays() : a(kBig, 1.5f), b(kBig, 0.25f), c(kBig, 0.0f) {}
};

void BM_add_kiln(benchmark::State& st) {
  Tensor a = ops::full({kBig}, 1.5, DType::kF32), b = ops::full({kBig}, 0.25, DType::kF32);
  for (auto _ : st) benchmark::DoNotOptimize(ops::add(a, b).raw_data());
  set_bytes(st, 3);
}
void BM_add_peer(benchmark::State& st) {
  Arrays x;
  for (auto _ : st) {
    const float *a = x.a.data(), *b = x.b.data();
    float* c = x.c.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < kBig; ++i) c[i] = a[i] + b[i];
    benchmark::ClobberMemory();
  }
  set_bytes(st, 3);
}
void BM_mul_kiln(benchmark::State& st) {
  Tensor a = ops::full({kBig}, 1.5, DType::kF32), b = ops::full({kBig}, 0.25, DType::kF32);
  for (auto _ : st) benchmark::DoNotOptimize(ops::mul(a, b).raw_data());
  set_bytes(st, 3);
}
void BM_mul_peer(benchmark::State& st) {
  Arrays x;
  for (auto _ : st) {
    const float *a = x.a.data(), *b = x.b.data();
    float* c = x.c.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < kBig; ++i) c[i] = a[i] * b[i];
    benchmark::ClobberMemory();
  }
  set_bytes(st, 3);
}
void BM_exp_kiln(benchmark::State& st) {
  Tensor a = ops::random_uniform({kBig}, -3, 3, DType::kF32, 3);
  for (auto _ : st) benchmark::DoNotOptimize(ops::exp(a).raw_data());
  set_bytes(st, 2);
}
// Peer: the STREAM copy loop (the memory-bandwidth bound for a read+write op).
void BM_exp_peer(benchmark::State& st) {
  Arrays x;
  for (auto _ : st) {
    const float* a = x.a.data();
    float* c = x.c.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < kBig; ++i) c[i] = a[i];
    benchmark::ClobberMemory();
  }
  set_bytes(st, 2);
}
// Copy-bound reference for add/mul too: the same bytes moved as a copy.
void BM_copy_peer(benchmark::State& st) { BM_exp_peer(st); }
void BM_copy_kiln(benchmark::State& st) {
  Tensor a = ops::full({kBig}, 1.5, DType::kF32);
  for (auto _ : st) benchmark::DoNotOptimize(a.clone().raw_data());
  set_bytes(st, 2);
}

BENCHMARK(BM_add_kiln)->Name("add_64MiB/kiln")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_add_peer)->Name("add_64MiB/peer")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_mul_kiln)->Name("mul_64MiB/kiln")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_mul_peer)->Name("mul_64MiB/peer")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_exp_kiln)->Name("exp_vs_copy_64MiB/kiln")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_exp_peer)->Name("exp_vs_copy_64MiB/peer")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_copy_kiln)->Name("clone_vs_copy_64MiB/kiln")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_copy_peer)->Name("clone_vs_copy_64MiB/peer")->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- a dense layer at small batch, constant weights ----------------------------------

constexpr int64_t kDenseK = 784, kDenseN = 256;

void BM_dense_small_kiln(benchmark::State& st) {
  const int64_t rows = st.range(0);
  const Tensor w = ops::random_uniform({kDenseK, kDenseN}, -1, 1, DType::kF32, 1);
  const Tensor b = ops::random_uniform({kDenseN}, -1, 1, DType::kF32, 2);
  Function f = function(
      [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::relu(ops::add(ops::matmul(x[0], w), b))}; });
  const std::vector<Tensor> x{ops::random_uniform({rows, kDenseK}, -1, 1, DType::kF32, 3)};
  for (auto _ : st) benchmark::DoNotOptimize(f(x)[0].raw_data());
}

void BM_dense_small_peer(benchmark::State& st) {
  using namespace dnnl;
  const int64_t rows = st.range(0);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const auto f32 = memory::data_type::f32;
  memory::desc ad({rows, kDenseK}, f32, memory::format_tag::ab), wd({kDenseK, kDenseN}, f32, memory::format_tag::ab);
  memory::desc bd({1, kDenseN}, f32, memory::format_tag::ab), cd({rows, kDenseN}, f32, memory::format_tag::ab);
  post_ops po;
  po.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
  primitive_attr attr;
  attr.set_post_ops(po);
  matmul::primitive_desc pd(matmul::desc(ad, wd, bd, cd), attr, eng);
  matmul mm(pd);
  memory a(ad, eng), w(wd, eng), b(bd, eng), c(cd, eng);
  for (memory* m : {&a, &w, &b}) {
    float* p = static_cast<float*>(m->get_data_handle());
    for (size_t i = 0; i < m->get_desc().get_size() / sizeof(float); ++i) p[i] = std::sin(static_cast<float>(i));
  }
  for (auto _ : st) {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, c}});
    s.wait();
  }
  st.SetLabel(pd.impl_info_str());
}
// ---- the dense layers' GEMMs at batch 32-128: packed_gemm vs oneDNN's matmul ----------
// Args: M, K, N, trans_a (A given as [K, M]: a weight gradient X^T @ dY). Both compute
// relu(op(A) @ B + bias) (trans_a: no bias/ReLU, as in a weight gradient); kiln's B is
// packed beforehand (a graph constant's packing is cached per node).

void BM_packed_gemm_kiln(benchmark::State& st) {
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  const bool ta = st.range(3) != 0;
  const Tensor a = ops::random_uniform(ta ? Shape{K, M} : Shape{M, K}, -1, 1, DType::kF32, 1);
  const Tensor w = ops::random_uniform({K, N}, -1, 1, DType::kF32, 2);
  const Tensor b = ops::random_uniform({N}, -1, 1, DType::kF32, 3);
  std::vector<float> packed(cpu::packed_gemm::packed_size(K, N)), c(static_cast<size_t>(M * N));
  cpu::packed_gemm::pack(w.data<float>(), K, N, false, packed.data());
  for (auto _ : st) {
    cpu::packed_gemm::run(a.data<float>(), ta, M, K, N, packed.data(), ta ? nullptr : b.data<float>(), !ta, c.data());
    benchmark::DoNotOptimize(c.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * M * K * N, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
}

void BM_packed_gemm_peer(benchmark::State& st) {
  using namespace dnnl;
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  const bool ta = st.range(3) != 0;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const auto f32 = memory::data_type::f32;
  memory::desc ad({M, K}, f32, ta ? memory::format_tag::ba : memory::format_tag::ab);
  memory::desc wd({K, N}, f32, memory::format_tag::ab), bd({1, N}, f32, memory::format_tag::ab);
  memory::desc cd({M, N}, f32, memory::format_tag::ab);
  primitive_attr attr;
  if (!ta) {
    post_ops po;
    po.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  matmul::primitive_desc pd(ta ? matmul::desc(ad, wd, cd) : matmul::desc(ad, wd, bd, cd), attr, eng);
  matmul mm(pd);
  memory a(ad, eng), w(wd, eng), b(bd, eng), c(cd, eng);
  for (memory* m : {&a, &w, &b}) {
    float* p = static_cast<float*>(m->get_data_handle());
    for (size_t i = 0; i < m->get_desc().get_size() / sizeof(float); ++i) p[i] = std::sin(static_cast<float>(i));
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, c}};
  if (!ta) args.emplace(DNNL_ARG_BIAS, b);
  for (auto _ : st) {
    mm.execute(s, args);
    s.wait();
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * M * K * N, benchmark::Counter::kIsIterationInvariantRate,
                                             benchmark::Counter::kIs1000);
  st.SetLabel(pd.impl_info_str());
}
void packed_gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "ta"});
  for (auto [m, k, n, ta] : std::vector<std::array<int64_t, 4>>{{64, 784, 256, 0},
                                                                {64, 256, 128, 0},
                                                                {32, 3136, 128, 0},
                                                                {128, 784, 256, 0},
                                                                {128, 256, 128, 0},
                                                                {512, 784, 256, 0},
                                                                {2048, 784, 256, 0},
                                                                {256, 3136, 128, 0},
                                                                {784, 32, 256, 1},
                                                                {784, 128, 256, 1},
                                                                {3136, 32, 128, 1},
                                                                {3136, 128, 128, 1}})
    b->Args({m, k, n, ta});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK(BM_packed_gemm_kiln)->Name("packed_gemm/kiln")->Apply(packed_gemm_shapes);
BENCHMARK(BM_packed_gemm_peer)->Name("packed_gemm/peer")->Apply(packed_gemm_shapes);

// ---- the FMA peak the GEMMs are measured against ------------------------------------
// fma_peak/<width>: 12 independent chains of 256- or 512-bit FMAs per thread on every
// pool thread (two FMA pipes x 4 cycles of latency), no memory traffic: GFLOP/s
// (2 per lane; the chains: fma_chains.h). The 512-bit case is skipped on a CPU
// without it.
void BM_fma_peak(benchmark::State& st) {
  const int width = static_cast<int>(st.range(0));
  if (width == 512 && !cpu_has(CpuIsa::kAvx512)) {
    st.SkipWithError("no AVX-512 here (or KILN_CPU_ISA caps it)");
    return;
  }
  const int64_t steps = 1 << 20;
  const int threads = num_threads();
  for (auto _ : st)
    benchmark::DoNotOptimize(width == 512 ? bench::fma_chains512(steps, threads)
                                          : bench::fma_chains256(steps, threads));
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * (width / 32) * 12 * steps * threads,
                                             benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_fma_peak)->Name("fma_peak")->Arg(256)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();


BENCHMARK(BM_dense_small_kiln)->Name("dense_784x256/kiln")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_dense_small_peer)->Name("dense_784x256/peer")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMicrosecond)->UseRealTime();

// ---- eager dispatch ------------------------------------------------------------------

void BM_tiny_add_kiln(benchmark::State& st) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {4}), b = Tensor::from_vector<float>({5, 6, 7, 8}, {4});
  for (auto _ : st) benchmark::DoNotOptimize(ops::add(a, b).raw_data());
}
// Peer: the same 4 adds into a fresh heap buffer (what any eager framework must do at least).
void BM_tiny_add_peer(benchmark::State& st) {
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  for (auto _ : st) {
    auto* c = new float[4];
    for (int i = 0; i < 4; ++i) c[i] = a[i] + b[i];
    benchmark::DoNotOptimize(c);
    delete[] c;
  }
}
BENCHMARK(BM_tiny_add_kiln)->Name("tiny_add_dispatch/kiln")->Unit(benchmark::kNanosecond);
BENCHMARK(BM_tiny_add_peer)->Name("tiny_add_dispatch/peer")->Unit(benchmark::kNanosecond);

}  // namespace

KILN_BENCH_MAIN()
