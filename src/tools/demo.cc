// `kiln demo`: a numerical self-check of the op library and a matmul timing.
#include "demo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/parallel.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"

namespace kiln::tools {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool check(const char* what, const Tensor& got, const Tensor& ref, double rtol, double atol) {
  bool ok = allclose(got, ref, rtol, atol);
  std::printf("  %-44s %s%s%s\n", what, ok ? "ok" : "MISMATCH", ok ? "" : ": ",
              ok ? "" : describe_mismatch(got, ref, rtol, atol).c_str());
  return ok;
}

}  // namespace

int run_demo(int64_t n) {
  std::printf("kiln demo: %d intra-op threads\n", num_threads());
  std::printf("self-check against f64 computations:\n");
  Tensor a = ops::random_uniform({n, n}, -1, 1, DType::kF32, 1);
  Tensor b = ops::random_uniform({n, n}, -1, 1, DType::kF32, 2);
  bool ok = true;
  Tensor ref = ops::matmul(a.to(DType::kF64), b.to(DType::kF64));
  ok &= check("matmul f32 (oneDNN) vs f64", ops::matmul(a, b), ref, 1e-4, 1e-4);
  ok &= check("matmul bf16 vs f64", ops::matmul(a.to(DType::kBF16), b.to(DType::kBF16)), ref, 0.05, 0.3);
  Tensor x = ops::random_uniform({1 << 16}, -4, 4, DType::kF32, 3);
  ok &= check("exp f32 (libmvec) vs f64", ops::exp(x), ops::exp(x.to(DType::kF64)), 1e-6, 0);
  ok &= check("gelu f32 vs f64", ops::gelu(x), ops::gelu(x.to(DType::kF64)), 1e-5, 1e-7);
  ok &= check("softmax f32 vs f64", ops::softmax(a), ops::softmax(a.to(DType::kF64)), 1e-5, 1e-7);
  ok &= check("sum f32 vs f64", ops::sum(a, {1}), ops::sum(a.to(DType::kF64), {1}), 1e-4, 1e-4);

  std::printf("matmul %lldx%lld f32 timing (median of 5):\n", static_cast<long long>(n), static_cast<long long>(n));
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Tensor c = ops::matmul(a, b);
    if (i > 0) times.push_back(seconds_since(t0));  // first call creates the oneDNN primitive
  }
  std::sort(times.begin(), times.end());
  double t = times[times.size() / 2];
  std::printf("  %.3f ms, %.1f GFLOP/s\n", t * 1e3, 2.0 * n * n * n / t / 1e9);
  AllocatorStats st = backend_for(Device::cpu()).allocator(0).stats();
  std::printf("cpu allocator: %s\n", st.str().c_str());
  std::printf(ok ? "demo: all checks passed\n" : "demo: CHECKS FAILED\n");
  return ok ? 0 : 1;
}

}  // namespace kiln::tools
