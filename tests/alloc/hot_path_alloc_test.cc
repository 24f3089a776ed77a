// The graph executor's hot path allocates nothing per op: a traced call's heap
// allocations (operator new, counted by a replacement in this binary only) do not
// grow with the number of ops it runs. What a call does allocate is per call (its
// result vector, its outputs' buffers); what a kernel library allocates inside itself
// with malloc (oneDNN's scratchpads) is not counted, and these graphs call none.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/graph/function.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"

namespace {
std::atomic<long> g_news{0};
std::atomic<bool> g_counting{false};
}  // namespace

// The replacement pairs malloc with free by design (GCC cannot tell it is the
// replacement of both).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace kiln {
namespace {

// operator new calls per call of f on args, after warm-up calls (tracing, planning,
// kernels' first-call caches).
long news_per_call(Function& f, const std::vector<Tensor>& args) {
  for (int i = 0; i < 3; ++i) f(args);
  constexpr int kCalls = 20;
  g_news = 0;
  g_counting = true;
  for (int i = 0; i < kCalls; ++i) f(args);
  g_counting = false;
  return g_news / kCalls;
}

// `layers` rounds of elementwise ops, reductions, softmax, gather and a transpose
// over [32, 64]; with the passes off every op is a node of its own, with them the
// elementwise runs become fused_elementwise nodes.
Function chain(int layers, int level) {
  FunctionOptions o;
  o.passes.level = level;
  return function(
      [layers](const std::vector<Tensor>& a) {
        Tensor h = a[0];
        for (int i = 0; i < layers; ++i) {
          h = ops::relu(ops::add(ops::mul(h, a[1]), a[2]));
          h = ops::tanh(ops::sub(h, ops::mean(h, {-1}, true)));
          h = ops::softmax(ops::mul(h, ops::sum(h, {0}, true)), -1);
          h = ops::gather(h, a[3], 0);
          h = ops::transpose(ops::transpose(h, {1, 0}), {1, 0});
        }
        return std::vector<Tensor>{h, ops::sum(h)};
      },
      o);
}

std::vector<Tensor> chain_args() {
  return {ops::random_uniform({32, 64}, -1, 1, DType::kF32, 1), ops::random_uniform({64}, 0.5, 1.5, DType::kF32, 2),
          ops::random_uniform({32, 64}, -0.1, 0.1, DType::kF32, 3),
          ops::cast(ops::random_uniform({32}, 0, 32, DType::kF32, 4), DType::kI32)};
}

TEST(HotPathAlloc, ExecutorAllocatesNothingPerOp) {
  const std::vector<Tensor> args = chain_args();
  Function small = chain(1, 0), large = chain(10, 0);
  const long one = news_per_call(small, args), ten = news_per_call(large, args);
  ASSERT_GT(large.concrete(args).graph().nodes.size(), 5 * small.concrete(args).graph().nodes.size());
  // The same allocations for 16 ops as for 160: per call, the result vector and the two
  // outputs' buffers (each a Storage and the BFC allocator's chunk bookkeeping).
  EXPECT_EQ(ten, one) << "16 ops: " << one << " allocations per call, 160 ops: " << ten;
  EXPECT_LE(one, 12);
}

TEST(HotPathAlloc, FusedGraphsAllocateNothingPerNode) {
  const std::vector<Tensor> args = chain_args();
  Function small = chain(1, graph::kDefaultLevel), large = chain(10, graph::kDefaultLevel);
  const long one = news_per_call(small, args), ten = news_per_call(large, args);
  const graph::Graph& g = large.concrete(args).graph();
  ASSERT_GE(g.count_ops("fused_elementwise"), 10) << g.str();
  EXPECT_EQ(ten, one) << "1 round: " << one << " allocations per call, 10 rounds: " << ten;
}

}  // namespace
}  // namespace kiln
