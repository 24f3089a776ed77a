// Inter-op parallelism in the executor (KILN_PARALLEL_BRANCHES=1): two independent heavy
// nodes of similar work (matmuls, convolutions and their gradients) run at once, one
// thread each (kiln::parallel_invoke); the memory plan keeps each from reusing what the
// other reads. Checked: the pair really ran on two threads (the profiler's thread ids),
// the results equal the sequential executor's (the default) and eager mode, including a
// training step whose layer gradients run as pairs.
#include <map>
#include <regex>

#include "kiln/autodiff/tape.h"
#include "kiln/core/dtype.h"
#include "kiln/core/parallel.h"
#include "kiln/core/tensor.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/function.h"
#include "kiln/graph/profiler.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "test_util.h"

namespace kiln::graph {
namespace {
using testing::rand_tensor;

// Runs the graph once with the profiler on; returns node -> thread id of its event.
std::map<int, size_t> threads_of(const Graph& g, const std::vector<Tensor>& in, std::vector<Tensor>* out) {
  std::string json;
  {
    // read when the executor plans (its first run)
    testing::ScopedKernelPreferences prefs([](KernelPreferences& k) { k.parallel_branches = true; });
    Executor ex(g);
    start_profiling();
    *out = ex.run(in);
    json = stop_profiling();
  }
  std::map<int, size_t> tid;
  const std::regex event(R"re("tid":(\d+),"args":\{"node":(\d+))re");
  for (auto it = std::sregex_iterator(json.begin(), json.end(), event); it != std::sregex_iterator(); ++it)
    tid[std::stoi((*it)[2])] = std::stoul((*it)[1]);
  return tid;
}

std::vector<Tensor> run_sequential(const Graph& g, const std::vector<Tensor>& in) { return Executor(g).run(in); }

int node_of(const Graph& g, const std::string& op, int nth = 0) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].kind == NodeKind::kOp && g.nodes[i].op->name == op && nth-- == 0) return static_cast<int>(i);
  ADD_FAILURE() << "no " << op << " node";
  return -1;
}

class ParallelBranches : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = num_threads();
    set_num_threads(2);  // pairs need two threads (CI's machine has two cores)
  }
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = 1;
};

TEST_F(ParallelBranches, IndependentMatmulsRunAtOnceAndMatchTheSequentialRun) {
  const Tensor w1 = rand_tensor({192, 160}, DType::kF32, -1, 1, 1), w2 = rand_tensor({192, 160}, DType::kF32, -1, 1, 2);
  const Tensor x = rand_tensor({128, 192}, DType::kF32, -1, 1, 3);
  Graph g = trace(
      [&](const std::vector<Tensor>& a) {
        Tensor y1 = ops::matmul(a[0], w1), y2 = ops::matmul(a[0], w2);
        return std::vector<Tensor>{ops::sub(y1, y2), y1};
      },
      {x});
  std::vector<Tensor> got;
  std::map<int, size_t> tid = threads_of(g, {x}, &got);
  const int m1 = node_of(g, "matmul", 0), m2 = node_of(g, "matmul", 1);
  ASSERT_TRUE(tid.count(m1) && tid.count(m2));
  EXPECT_NE(tid[m1], tid[m2]) << "the two matmuls did not run on two threads";
  const std::vector<Tensor> want = run_sequential(g, {x});
  EXPECT_CLOSE(got[0], want[0], 1e-5, 1e-5);
  EXPECT_CLOSE(got[1], want[1], 1e-5, 1e-5);
  EXPECT_CLOSE(got[1], ops::matmul(x, w1), 1e-5, 1e-5);

  // Work too unequal (or too small) to pair: both on the calling thread.
  const Tensor small = rand_tensor({192, 8}, DType::kF32, -1, 1, 4);
  Graph h = trace(
      [&](const std::vector<Tensor>& a) {
        return std::vector<Tensor>{ops::matmul(a[0], w1), ops::matmul(a[0], small)};
      },
      {x});
  std::vector<Tensor> out;
  tid = threads_of(h, {x}, &out);
  EXPECT_EQ(tid[node_of(h, "matmul", 0)], tid[node_of(h, "matmul", 1)]);
}

// A conv layer's training step: conv2d_backward_data and conv2d_backward_filter of the
// second convolution are independent and of equal work: they pair. Gradients must equal
// eager mode's (a memory plan that let one reuse the other's input would corrupt them).
TEST_F(ParallelBranches, ConvTrainingGradientsMatchEager) {
  const Tensor w1 = rand_tensor({3, 3, 8, 32}, DType::kF32, -0.3, 0.3, 5);
  const Tensor w2 = rand_tensor({3, 3, 32, 32}, DType::kF32, -0.3, 0.3, 6);
  const Tensor x = rand_tensor({16, 12, 12, 8}, DType::kF32, -1, 1, 7);
  ops::Conv2dOptions same;
  same.padding = "same";
  auto grads = [&](const std::vector<Tensor>& a) {
    GradientTape tape;
    tape.watch(a[1]);
    tape.watch(a[2]);
    Tensor h = ops::relu(ops::conv2d(a[0], a[1], same));
    Tensor y = ops::conv2d(h, a[2], same);
    Tensor loss = ops::sum(ops::mul(y, y));
    return tape.gradient(loss, {a[1], a[2]});
  };
  Graph g = trace(grads, {x, w1, w2});
  std::vector<Tensor> got;
  std::map<int, size_t> tid = threads_of(g, {x, w1, w2}, &got);
  const int bd = node_of(g, "conv2d_backward_data"), bf = node_of(g, "conv2d_backward_filter", 0);
  ASSERT_TRUE(tid.count(bd) && tid.count(bf));
  EXPECT_NE(tid[bd], tid[bf]) << "the second conv's data and filter gradients did not run at once";
  const std::vector<Tensor> want = grads({x, w1, w2});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_CLOSE(got[0], want[0], 1e-4, 1e-3);
  EXPECT_CLOSE(got[1], want[1], 1e-4, 1e-3);
  // Sequentially the filter gradients split their sums over two threads, inside a branch
  // over one: the same sums in another order (Winograd's transformed terms are a few times
  // larger than the direct products, hence not 1e-5).
  const std::vector<Tensor> seq = run_sequential(g, {x, w1, w2});
  EXPECT_CLOSE(got[0], seq[0], 1e-4, 1e-3);
  EXPECT_CLOSE(got[1], seq[1], 1e-4, 1e-3);
}

TEST(ParallelInvoke, RunsBothAndRethrows) {
  const int saved = num_threads();
  set_num_threads(2);
  int a = 0, b = 0;
  parallel_invoke([&] { a = 1; }, [&] { b = 2; });
  EXPECT_EQ(a + b, 3);
  a = 0;
  EXPECT_THROW(parallel_invoke([&] { a = 1; }, [] { throw InvalidArgumentError("from b"); }), InvalidArgumentError);
  EXPECT_EQ(a, 1);  // a still ran to the end
  set_num_threads(1);
  b = 0;
  parallel_invoke([&] { b += 1; }, [&] { b *= 10; });  // one thread: a, then b
  EXPECT_EQ(b, 10);
  set_num_threads(saved);
}

}  // namespace
}  // namespace kiln::graph
