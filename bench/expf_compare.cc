// Vectorised expf throughput: what `#pragma omp simd` loops over vm::exp (the CPU
// kernels' softmax, sigmoid, exp, ...) get from the libm vector ABI (_ZGVdN8v_expf),
// against a Cephes-style polynomial written for the comparison. Built and run by
// bench/expf_compare.sh, once linked against glibc's libmvec and once against SLEEF's
// GNU-ABI library (Debian's libsleef-dev) when it is installed.
//   expf_compare [--accuracy]   --accuracy also checks the polynomial on every float
//                               in [-110, 95] against exp() in double (ulp).
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;
}

namespace {

// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 (two-part ln 2), exp(r) by a
// degree-6 minimax polynomial; 2^n applied in two halves so denormal results round once.
inline float poly_exp(float x) {
  x = x > 88.8f ? 88.8f : x;  // NaN stays NaN (comparisons are false)
  x = x < -104.0f ? -104.0f : x;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: the sum's low bits hold round(x / ln 2)
  const float t = std::fma(x, 1.44269504088896341f, kShift);
  const float n = t - kShift;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  return p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
}

double ulps(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1e9;
  const float w = static_cast<float>(want);
  if (got == w) return 0;
  if (std::isinf(w)) return 1e9;
  const float u = w == 0 ? std::nextafter(0.0f, 1.0f) : std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(got - want) / u;
}

template <typename F>
double ns_per_element(F f, const std::vector<float>& x, std::vector<float>& y, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < reps; ++it) {
    const float* __restrict xp = x.data();
    float* __restrict yp = y.data();
    const int64_t n = static_cast<int64_t>(x.size());
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) yp[i] = f(xp[i]);
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / reps / static_cast<double>(x.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--accuracy") == 0) {
    double worst = 0;
    float worst_x = 0;
    std::vector<float> xs(1 << 20), ys(1 << 20);
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t end = std::bit_cast<uint32_t>(sign ? 110.0f : 95.0f);
      for (uint32_t b = 0; b < end;) {
        size_t m = 0;
        for (; m < xs.size() && b < end; ++m, ++b) xs[m] = std::bit_cast<float>(b | sign);
#pragma omp simd
        for (size_t i = 0; i < m; ++i) ys[i] = poly_exp(xs[i]);
        for (size_t i = 0; i < m; ++i)
          if (const double e = ulps(ys[i], std::exp(static_cast<double>(xs[i]))); e > worst) {
            worst = e;
            worst_x = xs[i];
          }
      }
    }
    std::printf("polynomial: worst %.3f ulp (at x = %.9g) over every float in [-110, 95]\n", worst, worst_x);
  }
  std::vector<float> x(8192), y(x.size());  // L1/L2-resident: compute throughput
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000) * 0.006f - 3.0f;
  for (int run = 0; run < 5; ++run)
    std::printf("ns per element: vector-ABI expf %.3f, polynomial %.3f\n",
                ns_per_element([](float v) { return expf(v); }, x, y, 5000),
                ns_per_element([](float v) { return poly_exp(v); }, x, y, 5000));
}
