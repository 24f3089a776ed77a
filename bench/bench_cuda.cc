// The CUDA backend on a GPU (docs/benchmarks.md): kiln's matmul against cuBLASLt called
// directly on the same buffers (the figure: bf16 8192^3 >= 85% of cuBLAS), and
// training steps/s of the built-in mlp and cnn under float32 and mixed_bfloat16.
//
//   bench_cuda matmul [n=8192] [reps=20]
//   bench_cuda train [mlp|cnn] [steps=200] [batch=128]
//
// Times are wall-clock over `reps` enqueued calls after a warm-up, closed by a stream
// synchronisation; medians of 5 such runs. Exits with a clear message without a GPU.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/cuda_error.h"
#include "kiln/ops.h"
#include "kiln/train.h"

using namespace kiln;
using namespace kiln::train;

namespace {

const Device kGpu{DeviceType::kCUDA, 0};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per call of `fn` (enqueued `reps` times, then synchronised).
double time_calls(const std::function<void()>& fn, int reps) {
  Backend& b = backend_for(kGpu);
  for (int i = 0; i < 3; ++i) fn();
  b.synchronize(0);
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    b.synchronize(0);
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  return median(runs);
}

// C = A @ B, row-major n x n, through cuBLASLt with its top heuristic (what a careful
// user of cuBLAS gets): the peer.
struct CublasLtMatmul {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t layout{};
  cublasLtMatmulHeuristicResult_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = 32u << 20;
  CublasLtMatmul(cublasLtHandle_t h, int64_t n, cudaDataType_t type, cublasComputeType_t compute) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, n, n, n));
    cublasLtMatmulPreference_t pref;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                           sizeof ws_bytes));
    int found = 0;
    KILN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, layout, layout, layout, layout, pref, 1, &algo, &found));
    if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm");
    cublasLtMatmulPreferenceDestroy(pref);
    KILN_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  }
  ~CublasLtMatmul() { cudaFree(ws); }
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
  void run(cublasLtHandle_t h, const void* a, const void* b, void* c, cudaStream_t s) {
    const float one = 1, zero = 0;
    KILN_CUBLAS_CHECK(cublasLtMatmul(h, op, &one, b, layout, a, layout, &zero, c, layout, c, layout, &algo.algo, ws,
                                     ws_bytes, s));
  }
};

int bench_matmul(int64_t n, int reps) {
  cuda::DeviceContext& ctx = cuda::device_context(0);
  cuda::DeviceGuard guard(ctx.physical);
  std::printf("%-6s %8s %14s %14s %8s\n", "dtype", "n", "kiln TFLOP/s", "cuBLAS TFLOP/s", "ratio");
  struct Case {
    DType dt;
    cudaDataType_t type;
    cublasComputeType_t compute;
  };
  for (Case c : {Case{DType::kBF16, CUDA_R_16BF, CUBLAS_COMPUTE_32F}, Case{DType::kF16, CUDA_R_16F, CUBLAS_COMPUTE_32F},
                 Case{DType::kF32, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32}}) {
    Tensor a = ops::random_uniform({n, n}, -1, 1, DType::kF32, 1).to(kGpu);
    Tensor b = ops::random_uniform({n, n}, -1, 1, DType::kF32, 2).to(kGpu);
    a = ops::cast(a, c.dt);
    b = ops::cast(b, c.dt);
    Tensor out = Tensor::empty({n, n}, c.dt, kGpu);
    CublasLtMatmul peer(ctx.cublaslt, n, c.type, c.compute);
    const double flops = 2.0 * n * n * n;
    const double t_kiln = time_calls([&] { ops::matmul(a, b); }, reps);
    const double t_peer = time_calls([&] { peer.run(ctx.cublaslt, a.raw_data(), b.raw_data(), out.raw_data(), ctx.stream); },
                                     reps);
    std::printf("%-6s %8lld %14.1f %14.1f %8.3f\n", std::string(dtype_name(c.dt)).c_str(), static_cast<long long>(n),
                flops / t_kiln / 1e12, flops / t_peer / 1e12, t_peer / t_kiln);
  }
  return 0;
}

ModelPtr build(const std::string& kind) {
  namespace L = layers;
  if (kind == "mlp")
    return std::make_shared<Sequential>(
        std::vector<LayerPtr>{L::Dense(512, "relu"), L::Dense(512, "relu"), L::Dense(10)}, Shape{784});
  L::Conv2DOptions same;
  same.padding = "same";
  same.activation = "relu";
  return std::make_shared<Sequential>(
      std::vector<LayerPtr>{L::Conv2D(32, {3, 3}, same), L::MaxPool2D(), L::Conv2D(64, {3, 3}, same), L::MaxPool2D(),
                            L::Flatten(), L::Dense(128, "relu"), L::Dense(10)},
      Shape{28, 28, 1});
}

int bench_train(const std::string& kind, int steps, int64_t batch) {
  Shape xs = kind == "mlp" ? Shape{batch, 784} : Shape{batch, 28, 28, 1};
  Tensor x = ops::random_uniform(xs, 0, 1, DType::kF32, 3).to(kGpu);
  Tensor y = ops::random_uniform({batch}, 0, 10, DType::kI64, 4).to(kGpu);
  std::printf("%-4s %-16s %6s %12s %10s\n", "model", "policy", "batch", "steps/s", "vs f32");
  double f32 = 0;
  for (const char* policy : {"float32", "mixed_bfloat16"}) {
    ModelPtr m = build(kind);
    CompileOptions co;
    co.optimizer = optimizers::Adam();
    co.loss = {losses::SparseCategoricalCrossentropy(true)};
    co.precision = policy;
    co.device = "cuda:0";
    m->compile(co);
    for (int i = 0; i < 5; ++i) m->train_step({x}, {y});  // builds, traces
    const double t = time_calls([&] { m->train_step({x}, {y}); }, steps / 5);
    if (f32 == 0) f32 = t;
    std::printf("%-5s %-16s %6lld %12.1f %10.2f\n", kind.c_str(), policy, static_cast<long long>(batch), 1 / t, f32 / t);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Backend* b = find_backend(DeviceType::kCUDA);
  if (!b || b->device_count() == 0) {
    std::fprintf(stderr, "bench_cuda: no GPU: %s\n",
                 b ? b->no_device_reason().c_str() : backend_unavailable_reason(DeviceType::kCUDA).c_str());
    return 2;
  }
  std::printf("device: %s\n", b->properties(0).name.c_str());
  const std::string what = argc > 1 ? argv[1] : "matmul";
  try {
    if (what == "matmul") return bench_matmul(argc > 2 ? std::stoll(argv[2]) : 8192, argc > 3 ? std::stoi(argv[3]) : 20);
    if (what == "train")
      return bench_train(argc > 2 ? argv[2] : "mlp", argc > 3 ? std::stoi(argv[3]) : 200,
                         argc > 4 ? std::stoll(argv[4]) : 128);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: bench_cuda matmul [n] [reps] | train [mlp|cnn] [steps] [batch]\n");
  return 2;
}
