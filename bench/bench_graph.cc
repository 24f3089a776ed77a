// Graph mode vs eager: the same callables run through kiln::function (traced, passes,
// memory plan, executor) as "kiln" and eagerly as "peer", so the ratio is the speedup
// of tracing:
//   mlp_forward/<batch>: 784-256-128-10 ReLU inference;
//   mlp_train_step/<batch>: forward, tape gradients, SGD update of the same MLP;
//   cnn_forward/<batch>: the built-in cnn's inference (counters: the memory plan's
//     arena and the naive sum of its intermediates, MiB);
//   chain/<n>: 20 small elementwise ops on n floats (dispatch-bound; tanh-bound at 65536);
//   chain_mem/<n>: 30 cheap elementwise ops on n floats (memory-bound: fusion's case);
//   norm_softmax_by_hand/<rows>: layer norm + softmax written out of primitive ops over
//     [rows, 512] (the normalisation pattern fusion's case);
//   model_train_step/cnn:<0|1>/batch:<128|32>: Model::train_step of the built-in mlp
//     (0) or cnn (1) at batch 128 (bench/train_compare.sh's) and 32 (fit's default),
//     traced (fit's default) vs run_eagerly;
//   mlp_step_floor/<batch>: what no implementation of that mlp step can beat on this
//     machine (no peer): its GEMMs' multiply-adds as register FMAs on every thread (the
//     FMA peak) plus its Adam update's memory traffic with the arithmetic cut to FMAs.
// Run: build/default/bin/bench_graph --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <immintrin.h>
#include <omp.h>

#include <chrono>

#include "kiln/autodiff/tape.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/function.h"
#include "kiln/kiln.h"
#include "kiln/train/layers.h"
#include "kiln/train/model.h"
#include "fma_chains.h"
#include "ratio_reporter.h"

using namespace kiln;

namespace {

struct Mlp {
  Variable w1{ops::random_uniform({784, 256}, -0.05, 0.05, DType::kF32, 1), "w1"};
  Variable b1{ops::zeros({256}), "b1"};
  Variable w2{ops::random_uniform({256, 128}, -0.05, 0.05, DType::kF32, 2), "w2"};
  Variable b2{ops::zeros({128}), "b2"};
  Variable w3{ops::random_uniform({128, 10}, -0.05, 0.05, DType::kF32, 3), "w3"};
  Variable b3{ops::zeros({10}), "b3"};
  Tensor forward(const Tensor& x) const {
    Tensor h = ops::relu(ops::add(ops::matmul(x, w1.value()), b1.value()));
    h = ops::relu(ops::add(ops::matmul(h, w2.value()), b2.value()));
    return ops::add(ops::matmul(h, w3.value()), b3.value());
  }
  std::vector<Tensor> train_step(const std::vector<Tensor>& xy) {
    std::vector<Variable> vars{w1, b1, w2, b2, w3, b3};
    GradientTape tape;
    Tensor loss = ops::mean(ops::square(ops::sub(forward(xy[0]), xy[1])));
    std::vector<Tensor> g = tape.gradient(loss, vars);
    for (size_t i = 0; i < vars.size(); ++i)
      vars[i].assign(ops::sub(vars[i].peek(), ops::mul(g[i], ops::scalar(0.01))));
    return {loss};
  }
};

// The built-in cnn: conv32-pool-conv64-pool-dense128-dense10, NHWC.
struct Cnn {
  Variable c1{ops::random_uniform({3, 3, 1, 32}, -0.3, 0.3, DType::kF32, 11), "c1"};
  Variable cb1{ops::zeros({32}), "cb1"};
  Variable c2{ops::random_uniform({3, 3, 32, 64}, -0.05, 0.05, DType::kF32, 12), "c2"};
  Variable cb2{ops::zeros({64}), "cb2"};
  Variable d1{ops::random_uniform({3136, 128}, -0.02, 0.02, DType::kF32, 13), "d1"};
  Variable db1{ops::zeros({128}), "db1"};
  Variable d2{ops::random_uniform({128, 10}, -0.1, 0.1, DType::kF32, 14), "d2"};
  Variable db2{ops::zeros({10}), "db2"};
  Tensor forward(const Tensor& x) const {
    ops::Conv2dOptions same;
    same.padding = "same";
    Tensor h = ops::max_pool2d(ops::relu(ops::conv2d(x, c1.value(), same, cb1.value())), {2, 2}, {2, 2});
    h = ops::max_pool2d(ops::relu(ops::conv2d(h, c2.value(), same, cb2.value())), {2, 2}, {2, 2});
    h = ops::relu(ops::add(ops::matmul(ops::reshape(h, {x.dim(0), 3136}), d1.value()), db1.value()));
    return ops::add(ops::matmul(h, d2.value()), db2.value());
  }
};

// Counters (traced): the memory plan's arena, the naive sum of its intermediates (MiB)
// and how many intermediates were written in place.
void run(benchmark::State& st, const TracedFn& fn, const std::vector<Tensor>& args, bool traced) {
  Function f = function(fn);
  if (traced) {
    f(args);  // trace outside the timing
    std::vector<TensorMeta> metas;
    for (const Tensor& t : args) metas.push_back({t.shape(), t.dtype()});
    const graph::MemoryPlanStats ms = f.concrete(args).executor().memory_stats(metas);
    st.counters["arena_MiB"] = static_cast<double>(ms.arena_bytes) / (1 << 20);
    st.counters["naive_MiB"] = static_cast<double>(ms.naive_bytes) / (1 << 20);
    st.counters["in_place"] = static_cast<double>(ms.in_place);
  }
  for (auto _ : st) benchmark::DoNotOptimize((traced ? f(args) : fn(args))[0].raw_data());
}

void mlp_forward(benchmark::State& st, bool traced) {
  Mlp m;
  Tensor x = ops::random_uniform({st.range(0), 784}, 0, 1, DType::kF32, 4);
  run(st, [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{m.forward(a[0])}; }, {x}, traced);
}

void mlp_train_step(benchmark::State& st, bool traced) {
  Mlp m;
  Tensor x = ops::random_uniform({st.range(0), 784}, 0, 1, DType::kF32, 5);
  Tensor y = ops::random_uniform({st.range(0), 10}, 0, 1, DType::kF32, 6);
  run(st, [&](const std::vector<Tensor>& a) { return m.train_step(a); }, {x, y}, traced);
}

// Counters: the memory plan's arena and the naive sum of its intermediates (MiB).
void cnn_forward(benchmark::State& st, bool traced) {
  Cnn m;
  Tensor x = ops::random_uniform({st.range(0), 28, 28, 1}, 0, 1, DType::kF32, 15);
  TracedFn fn = [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{m.forward(a[0])}; };
  Function f = function(fn);
  graph::MemoryPlanStats ms = f.concrete({x}).executor().memory_stats({{x.shape(), x.dtype()}});
  st.counters["arena_MiB"] = static_cast<double>(ms.arena_bytes) / (1 << 20);
  st.counters["naive_MiB"] = static_cast<double>(ms.naive_bytes) / (1 << 20);
  for (auto _ : st) benchmark::DoNotOptimize((traced ? f({x}) : fn({x}))[0].raw_data());
}

void chain(benchmark::State& st, bool traced) {
  Tensor x = ops::random_uniform({st.range(0)}, -1, 1, DType::kF32, 7);
  run(st,
      [](const std::vector<Tensor>& a) {
        Tensor t = a[0];
        for (int i = 0; i < 10; ++i) t = ops::tanh(ops::mul(t, ops::scalar(0.9)));
        return std::vector<Tensor>{t};
      },
      {x}, traced);
}

// Memory-bound: 30 cheap ops over n floats (fused: one pass instead of 30).
void chain_mem(benchmark::State& st, bool traced) {
  Tensor x = ops::random_uniform({st.range(0)}, -1, 1, DType::kF32, 8);
  run(st,
      [](const std::vector<Tensor>& a) {
        Tensor t = a[0];
        for (int i = 0; i < 10; ++i) t = ops::relu(ops::add(ops::mul(t, ops::scalar(0.9f)), a[0]));
        return std::vector<Tensor>{t};
      },
      {x}, traced);
}

// Layer norm and softmax written out of primitive ops over [rows, 512] (a transformer
// block's tail, as people write it): the pipeline turns each into its fused kernel.
void norm_softmax_by_hand(benchmark::State& st, bool traced) {
  Tensor x = ops::random_uniform({st.range(0), 512}, -3, 3, DType::kF32, 16);
  Tensor gamma = ops::random_uniform({512}, 0.5, 1.5, DType::kF32, 17), beta = ops::zeros({512});
  Tensor eps = ops::scalar(1e-5f);
  run(st,
      [&](const std::vector<Tensor>& a) {
        Tensor d = ops::sub(a[0], ops::mean(a[0], {-1}, true));
        Tensor n = ops::mul(d, ops::rsqrt(ops::add(ops::mean(ops::square(d), {-1}, true), eps)));
        Tensor h = ops::add(ops::mul(n, gamma), beta);
        Tensor e = ops::exp(ops::sub(h, ops::max(h, {-1}, true)));
        return std::vector<Tensor>{ops::div(e, ops::sum(e, {-1}, true))};
      },
      {x}, traced);
}

// Model::train_step of the CLI's built-in models (Adam, sparse cross-entropy):
// "kiln" = the traced step fit runs by default, "peer" = run_eagerly.
train::ModelPtr builtin(bool cnn) {
  namespace L = train::layers;
  set_seed(1);
  if (!cnn)
    return std::make_shared<train::Sequential>(
        std::vector<train::LayerPtr>{L::Dense(256, "relu"), L::Dense(128, "relu"), L::Dense(10)}, Shape{784});
  train::layers::Conv2DOptions same;
  same.padding = "same";
  same.activation = "relu";
  return std::make_shared<train::Sequential>(
      std::vector<train::LayerPtr>{L::Conv2D(32, {3, 3}, same), L::MaxPool2D(), L::Conv2D(64, {3, 3}, same),
                                   L::MaxPool2D(), L::Flatten(), L::Dense(128, "relu"), L::Dense(10)},
      Shape{28, 28, 1});
}

void model_train_step(benchmark::State& st, bool traced) {
  const bool cnn = st.range(0) == 1;
  train::ModelPtr m = builtin(cnn);
  train::CompileOptions co{train::optimizers::Adam(), {train::losses::SparseCategoricalCrossentropy(true)}, {"accuracy"}};
  co.run_eagerly = !traced;
  m->compile(co);
  const int64_t batch = st.range(1);
  Tensor x = cnn ? ops::random_uniform({batch, 28, 28, 1}, 0, 1, DType::kF32, 9)
                 : ops::random_uniform({batch, 784}, 0, 1, DType::kF32, 9);
  Tensor y = ops::cast(ops::random_uniform({batch}, 0, 10, DType::kF32, 10), DType::kI32);
  for (int i = 0; i < 3; ++i) m->train_step({x}, {y});  // build, trace
  for (auto _ : st) benchmark::DoNotOptimize(m->train_step({x}, {y}));
}

// `flops` multiply-adds at the 256-bit FMA peak over the pool's threads (fma_chains.h).
float fma_chains(int64_t flops) {
  const int threads = num_threads();
  return bench::fma_chains256(flops / (12 * 16) / threads, threads);
}

void mlp_step_floor(benchmark::State& st) {
  const int64_t b = st.range(0);
  // Forward x@w1, h1@w2, h2@w3; the weight gradients of all three; the input gradients
  // of the second and third layers (the first layer's input needs none).
  const int64_t flops = 2 * b * (2 * 784 * 256 + 3 * 256 * 128 + 3 * 128 * 10);
  const size_t n = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10;
  std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  double fma_s = 0, adam_s = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(fma_chains(flops));
    const auto t1 = std::chrono::steady_clock::now();
    float *pp = p.data(), *gp = g.data(), *mp = m.data(), *vp = v.data();
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const float gi = gp[i], mi = 0.9f * mp[i] + 0.1f * gi, vi = 0.999f * vp[i] + 0.001f * gi * gi;
      mp[i] = mi;
      vp[i] = vi;
      pp[i] -= 1e-3f * (mi + vi);
    }
    benchmark::ClobberMemory();
    fma_s += std::chrono::duration<double>(t1 - t0).count();
    adam_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  const double iters = static_cast<double>(st.iterations());
  st.counters["gemm_us"] = fma_s / iters * 1e6;
  st.counters["adam_us"] = adam_s / iters * 1e6;
  st.counters["FMA_GFLOPs"] = static_cast<double>(flops) / (fma_s / iters) / 1e9;
}

}  // namespace

BENCHMARK(mlp_step_floor)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(model_train_step, kiln, true)
    ->ArgNames({"cnn", "batch"})
    ->ArgsProduct({{0, 1}, {128, 32}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(model_train_step, peer, false)
    ->ArgNames({"cnn", "batch"})
    ->ArgsProduct({{0, 1}, {128, 32}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mlp_forward, kiln, true)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mlp_forward, peer, false)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mlp_train_step, kiln, true)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mlp_train_step, peer, false)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(cnn_forward, kiln, true)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(cnn_forward, peer, false)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(chain, kiln, true)->Arg(64)->Arg(1 << 16)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(chain, peer, false)->Arg(64)->Arg(1 << 16)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(norm_softmax_by_hand, kiln, true)->Arg(256)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(norm_softmax_by_hand, peer, false)->Arg(256)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(chain_mem, kiln, true)->Arg(1 << 22)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(chain_mem, peer, false)->Arg(1 << 22)->Unit(benchmark::kMicrosecond);

KILN_BENCH_MAIN();
