// Denormal floats (kiln/core/denormals.h): flushed to zero in eager ops and graphs on
// every thread of the pool by default, kept with the mode off; the calling thread's own
// mode is restored after each call and left alone when the mode is off. (With the op
// tests, not the core ones: it runs the OpenMP pool on several threads, which the
// ThreadSanitizer preset does not, libgomp being invisible to it.)
#include "kiln/core/denormals.h"

#include <gtest/gtest.h>

#include <thread>

#include "kiln/core/parallel.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln {
namespace {

constexpr float kDenormal = 1e-39f;  // below FLT_MIN (1.18e-38)
constexpr int64_t kBig = 1 << 20;    // split over every thread of the pool

class Denormals : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(__x86_64__)
    GTEST_SKIP() << "the denormal mode is set on x86-64 only";
#endif
    saved_threads_ = num_threads();
  }
  void TearDown() override {
    set_flush_denormals(true);
    set_num_threads(saved_threads_);
  }
  int saved_threads_ = 1;
};

// kBig denormals, copied in (ops::full would convert its value under the mode: 0).
Tensor denormals() {
  Tensor t = Tensor::from_vector<float>(std::vector<float>(kBig, kDenormal), {kBig});
  EXPECT_EQ(t.data<float>()[kBig - 1], kDenormal);
  return t;
}

// Elements of t (f32) equal to v.
int64_t count(const Tensor& t, float v) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += t.data<float>()[i] == v;
  return n;
}

#if defined(__x86_64__)
unsigned mode_bits() { return _mm_getcsr() & 0x8040u; }
#endif

TEST_F(Denormals, EagerOpsFlushThemOnEveryThread) {
  ASSERT_TRUE(flush_denormals());  // the default (KILN_FLUSH_DENORMALS unset in tests)
  const Tensor tiny = denormals();
  const Tensor small = ops::full({kBig}, 1e-20, DType::kF32), smaller = ops::full({kBig}, 1e-19, DType::kF32);
  for (const int threads : {2, 3, 1}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    set_num_threads(threads);
    EXPECT_EQ(count(ops::add(tiny, tiny), 0.0f), kBig);      // denormal inputs read as zero
    EXPECT_EQ(count(ops::mul(small, smaller), 0.0f), kBig);  // a denormal result (1e-39) is zero
    EXPECT_EQ(count(ops::add(small, small), 2e-20f), kBig);  // normal numbers are untouched
  }
}

TEST_F(Denormals, OffKeepsThemAndOnAgainReachesNewWorkers) {
  set_flush_denormals(false);
  const Tensor tiny = denormals();
  set_num_threads(4);  // workers started now start without the mode
  EXPECT_EQ(count(ops::add(tiny, tiny), 2 * kDenormal), kBig);
  set_flush_denormals(true);
  EXPECT_EQ(count(ops::add(tiny, tiny), 0.0f), kBig);
}

// oneDNN's primitives run on the pool's workers too: an eager 64x64x64 matmul (oneDNN,
// on two threads) of 1e-20 x 1e-19 sums 64 products of 1e-39, each flushed to zero with
// the mode on. Off first, so that the workers start without it and only kiln can give
// it to them (inputs copied in: no parallel loop of kiln's runs before the matmul).
TEST_F(Denormals, OneDnnPrimitivesFlushThemOnEveryThread) {
  set_num_threads(2);
  const Tensor a = Tensor::from_vector<float>(std::vector<float>(64 * 64, 1e-20f), {64, 64});
  const Tensor b = Tensor::from_vector<float>(std::vector<float>(64 * 64, 1e-19f), {64, 64});
  set_flush_denormals(false);
  const Tensor kept = ops::matmul(a, b);
  EXPECT_EQ(count(kept, 0.0f), 0);
  EXPECT_NEAR(kept.data<float>()[64 * 64 - 1], 6.4e-38f, 1e-40f);
  set_flush_denormals(true);
  EXPECT_EQ(count(ops::matmul(a, b), 0.0f), 64 * 64);
}

TEST_F(Denormals, GraphsFlushThem) {
  Function f = function([](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::add(x[0], x[0])}; });
  const Tensor tiny = denormals();
  EXPECT_EQ(count(f({tiny})[0], 0.0f), kBig);
  set_flush_denormals(false);
  EXPECT_EQ(count(f({tiny})[0], 2 * kDenormal), kBig);
}

#if defined(__x86_64__)
TEST_F(Denormals, TheCallersModeIsRestoredOrLeftAlone) {
  const unsigned before = mode_bits();
  ASSERT_EQ(before, 0u);  // gtest's thread computes with denormals
  const Tensor tiny = denormals();
  ops::add(tiny, tiny);
  EXPECT_EQ(mode_bits(), before);
  // A thread that sets FTZ/DAZ itself keeps them through kiln calls, on or off.
  std::thread([&] {
    _mm_setcsr(_mm_getcsr() | 0x8040u);
    ops::add(tiny, tiny);
    EXPECT_EQ(mode_bits(), 0x8040u);
    set_flush_denormals(false);
    const Tensor sum = ops::add(tiny, tiny);
    EXPECT_EQ(mode_bits(), 0x8040u);
    EXPECT_EQ(sum.data<float>()[0], 0.0f);  // the caller's own mode applies to its share
  }).join();
}
#endif

}  // namespace
}  // namespace kiln
