// oneDNN primitives on several threads at once (src/backends/cpu/onednn.h, cached()):
// each calling thread keeps its own primitives, since oneDNN as Debian builds it shares
// one scratchpad among a thread's primitives and a primitive must run on the thread
// that made it. When kiln shared them across threads, concurrent eager matmuls returned
// another call's numbers every few thousand calls (a served model's answers too).
#include <atomic>
#include <thread>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/ops.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/shape.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

TEST(OneDnnThreads, ConcurrentCallsMatchSerialOnes) {
  ScopedKernelPreferences direct([](KernelPreferences& k) { k.direct_conv = DirectConv::kOff; });  // the convolutions on oneDNN too
  const Tensor w = rand_tensor({4, 8}, DType::kF32, -1, 1, 1);
  const Tensor f = rand_tensor({3, 3, 4, 16}, DType::kF32, -1, 1, 2);
  ops::Conv2dOptions same;
  same.padding = "same";
  auto compute = [&](const Tensor& x) {
    return std::vector<Tensor>{ops::matmul(x, w), ops::conv2d(ops::reshape(x, {-1, 2, 2, 4}), f, same)};
  };
  constexpr int kThreads = 4, kCalls = 1500;
  std::vector<std::vector<Tensor>> xs(kThreads);
  std::vector<std::vector<std::vector<Tensor>>> want(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kCalls; ++i) {
      // 20-27 rows: a few shapes, each run by every thread.
      xs[t].push_back(rand_tensor({4 * (5 + (t + i) % 2), 4}, DType::kF32, -1, 1, uint64_t(1000 * t + i)));
      want[t].push_back(compute(xs[t].back()));
    }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const std::vector<Tensor> got = compute(xs[t][i]);
        for (size_t k = 0; k < got.size(); ++k) {
          const std::vector<float> g = got[k].to_vector<float>(), e = want[t][i][k].to_vector<float>();
          for (size_t j = 0; j < g.size(); ++j)
            if (std::abs(g[j] - e[j]) > 1e-4f * (1 + std::abs(e[j]))) {
              ++wrong;
              break;
            }
        }
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0) << "calls with a wrong result, of " << kThreads * kCalls * 2;
}

}  // namespace
}  // namespace kiln::testing
