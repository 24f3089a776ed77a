// kiln::function: tracing, concrete functions per signature, pinned signatures,
// variables by reference, assignments, a traced train step, and the executor's memory
// plan. References: the same callables run eagerly.
#include <algorithm>
#include <filesystem>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/kernel.h"
#include "kiln/core/random.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/function.h"
#include "kiln/graph/profiler.h"
#include "kiln/ops.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "test_util.h"

namespace kiln {
namespace {
using graph::Graph;
using testing::make;
using testing::rand_tensor;

struct Mlp {
  Variable w1{rand_tensor({4, 8}, DType::kF32, -1, 1, 1), "w1"};
  Variable b1{rand_tensor({8}, DType::kF32, -1, 1, 2), "b1"};
  Variable w2{rand_tensor({8, 3}, DType::kF32, -1, 1, 3), "w2"};
  std::vector<Tensor> operator()(const std::vector<Tensor>& x) const {
    return {ops::matmul(ops::relu(ops::add(ops::matmul(x[0], w1.value()), b1.value())), w2.value())};
  }
};

TEST(FunctionTest, TracesOncePerSignatureAndMatchesEager) {
  Mlp m;
  Function f = function([&](const std::vector<Tensor>& x) { return m(x); });
  Tensor x1 = rand_tensor({5, 4}, DType::kF32, -1, 1, 7), x2 = rand_tensor({5, 4}, DType::kF32, -1, 1, 8);
  EXPECT_CLOSE(f({x1})[0], m({x1})[0], 0, 0);  // the tracing call
  EXPECT_CLOSE(f({x2})[0], m({x2})[0], 1e-6, 1e-6);  // the executor
  EXPECT_EQ(f.num_traces(), 1);
  const Graph& g = f.concrete({x2}).graph();
  EXPECT_EQ(g.count_ops("fused_matmul"), 1);  // relu(x @ w1 + b1)
  EXPECT_EQ(g.count_ops("matmul"), 1);        // h @ w2 has no bias
  EXPECT_EQ(g.count_ops("relu"), 0);
  // A new batch size is a new signature.
  Tensor x3 = rand_tensor({2, 4}, DType::kF32, -1, 1, 9);
  EXPECT_CLOSE(f({x3})[0], m({x3})[0], 1e-6, 1e-6);
  EXPECT_EQ(f.num_traces(), 2);
}

TEST(FunctionTest, VariablesAreCapturedByReference) {
  Mlp m;
  Function f = function([&](const std::vector<Tensor>& x) { return m(x); });
  Tensor x = rand_tensor({3, 4}, DType::kF32, -1, 1, 4);
  f({x});
  m.w2.assign(ops::mul(m.w2.peek(), ops::scalar(2.0)));
  EXPECT_CLOSE(f({x})[0], m({x})[0], 1e-6, 1e-6);
  EXPECT_EQ(f.num_traces(), 1);
}

TEST(FunctionTest, PinnedSignatureReusesTheTraceAcrossBatchSizes) {
  Mlp m;
  FunctionOptions o;
  o.input_signature = std::vector<TensorSpec>{{{-1, 4}, DType::kF32}};
  o.name = "mlp";
  Function f = function([&](const std::vector<Tensor>& x) { return m(x); }, o);
  for (int64_t b : {3, 7, 1, 7}) {
    Tensor x = rand_tensor({b, 4}, DType::kF32, -1, 1, static_cast<uint64_t>(b));
    EXPECT_CLOSE(f({x})[0], m({x})[0], 1e-6, 1e-6);
  }
  EXPECT_EQ(f.num_traces(), 1);
  EXPECT_KILN_ERROR(f({rand_tensor({3, 5}, DType::kF32)}), kInvalidArgument,
                    "mlp: argument 0 is f32[3, 5] on cpu:0, the signature wants f32[-1, 4]");
  EXPECT_KILN_ERROR(f({rand_tensor({3, 4}, DType::kF64)}), kInvalidArgument, "the signature wants f32[-1, 4]");
  EXPECT_KILN_ERROR(f({}), kInvalidArgument, "the input signature has 1 tensors, got 0 arguments");
}

TEST(FunctionTest, TraceThatFixesTheBatchIsTracedAgainForAnotherBatch) {
  FunctionOptions o;
  o.input_signature = std::vector<TensorSpec>{{{-1, 6}, DType::kF32}};
  // The reshape names the traced batch size: the pinned trace cannot run batch 4.
  Function f = function(
      [](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{ops::sum(ops::reshape(x[0], {x[0].dim(0), 2, 3}), {2})};
      },
      o);
  Tensor a = rand_tensor({2, 6}, DType::kF32), b = rand_tensor({4, 6}, DType::kF32);
  f({a});
  EXPECT_CLOSE(f({b})[0], ops::sum(ops::reshape(b, {4, 2, 3}), {2}), 1e-6, 1e-6);
  EXPECT_EQ(f.num_traces(), 2);
  EXPECT_CLOSE(f({b})[0], ops::sum(ops::reshape(b, {4, 2, 3}), {2}), 1e-6, 1e-6);
  EXPECT_EQ(f.num_traces(), 2);
}

TEST(FunctionTest, AssignmentsReplayInOrder) {
  Variable acc(ops::zeros({3}), "acc");
  Function f = function([&](const std::vector<Tensor>& x) {
    acc.assign(ops::add(acc.value(), x[0]));
    acc.assign(ops::mul(acc.value(), ops::scalar(2.0)));  // reads the first assignment
    return std::vector<Tensor>{ops::sum(acc.value())};
  });
  Tensor one = make<float>({1, 2, 3}, {3});
  EXPECT_EQ(f({one})[0].item<double>(), 12.0);        // acc = (0 + x) * 2
  EXPECT_EQ(f({one})[0].item<double>(), 36.0);        // acc = (acc + x) * 2
  EXPECT_CLOSE(acc.peek(), make<float>({6, 12, 18}, {3}), 0, 0);
  const Graph& g = f.concrete({one}).graph();
  ASSERT_EQ(g.assignments.size(), 1u);  // the last assignment of acc wins
  EXPECT_EQ(g.count_ops("fused_elementwise"), 1);  // (acc + x) * 2 in one loop
  EXPECT_EQ(g.count_ops("mul"), 0);
}

TEST(FunctionTest, TracedTrainStepMatchesEagerSteps) {
  // Linear regression, one SGD step per call: forward, tape gradient, update.
  auto make_step = [](Variable& w, Variable& b) {
    return [&w, &b](const std::vector<Tensor>& xy) {
      GradientTape tape;
      Tensor pred = ops::add(ops::matmul(xy[0], w.value()), b.value());
      Tensor loss = ops::mean(ops::square(ops::sub(pred, xy[1])));
      std::vector<Tensor> g = tape.gradient(loss, {w, b});
      w.assign(ops::sub(w.peek(), ops::mul(g[0], ops::scalar(0.1))));
      b.assign(ops::sub(b.peek(), ops::mul(g[1], ops::scalar(0.1))));
      return std::vector<Tensor>{loss};
    };
  };
  Variable we(ops::zeros({3, 1}), "w"), be(ops::zeros({1}), "b");
  Variable wt(ops::zeros({3, 1}), "w"), bt(ops::zeros({1}), "b");
  auto eager = make_step(we, be);
  Function traced = function(make_step(wt, bt));
  Tensor x = rand_tensor({16, 3}, DType::kF32, -1, 1, 5);
  Tensor y = ops::add(ops::matmul(x, make<float>({1, -2, 0.5f}, {3, 1})), ops::scalar(0.3));
  std::vector<double> losses;
  for (int s = 0; s < 20; ++s) {
    const double le = eager({x, y})[0].item<double>();
    const double lt = traced({x, y})[0].item<double>();
    EXPECT_NEAR(lt, le, 1e-5 * (1 + le)) << "step " << s;
    losses.push_back(lt);
  }
  EXPECT_EQ(traced.num_traces(), 1);
  EXPECT_LT(losses.back(), 0.2 * losses.front());
  EXPECT_CLOSE(wt.peek(), we.peek(), 1e-5, 1e-6);
  EXPECT_CLOSE(bt.peek(), be.peek(), 1e-5, 1e-6);
  // Forward, backward and update are one graph; the forward matmul + bias is fused.
  const Graph& g = traced.concrete({x, y}).graph();
  EXPECT_EQ(g.count_ops("fused_matmul"), 1);
  EXPECT_GE(g.count_ops("matmul"), 1);  // the weight gradient
  EXPECT_EQ(g.assignments.size(), 2u);
}

TEST(FunctionTest, TracedReluNetworkTrainStepFusesAndMatchesEager) {
  auto make_step = [](std::vector<Variable>& v) {
    return [&v](const std::vector<Tensor>& xy) {
      GradientTape tape;
      Tensor h = ops::relu(ops::add(ops::matmul(xy[0], v[0].value()), v[1].value()));
      Tensor loss = ops::mean(ops::square(ops::sub(ops::add(ops::matmul(h, v[2].value()), v[3].value()), xy[1])));
      std::vector<Tensor> g = tape.gradient(loss, v);
      for (size_t i = 0; i < v.size(); ++i) v[i].assign(ops::sub(v[i].peek(), ops::mul(g[i], ops::scalar(0.05))));
      return std::vector<Tensor>{loss};
    };
  };
  auto vars = [] {
    return std::vector<Variable>{Variable(rand_tensor({4, 16}, DType::kF32, -1, 1, 1), "w1"),
                                 Variable(ops::zeros({16}), "b1"),
                                 Variable(rand_tensor({16, 2}, DType::kF32, -1, 1, 2), "w2"),
                                 Variable(ops::zeros({2}), "b2")};
  };
  std::vector<Variable> ve = vars(), vt = vars();
  auto eager = make_step(ve);
  Function traced = function(make_step(vt));
  Tensor x = rand_tensor({32, 4}, DType::kF32, -1, 1, 3), y = rand_tensor({32, 2}, DType::kF32, -1, 1, 4);
  for (int s = 0; s < 10; ++s) {
    const double le = eager({x, y})[0].item<double>(), lt = traced({x, y})[0].item<double>();
    EXPECT_NEAR(lt, le, 1e-5 * (1 + le)) << "step " << s;
  }
  for (size_t i = 0; i < ve.size(); ++i) EXPECT_CLOSE(vt[i].peek(), ve[i].peek(), 1e-5, 1e-6);
  const Graph& g = traced.concrete({x, y}).graph();
  EXPECT_EQ(g.count_ops("fused_matmul"), 2);  // the ReLU's backward reads its output, so the ReLU fuses too
  EXPECT_EQ(g.count_ops("relu"), 0);
}

// Random ops draw fresh numbers on every run of a trace (stateful, as in tf.function),
// in the eager order, so set_seed reproduces a sequence; an explicit seed is kept.
TEST(FunctionTest, RandomOpsDrawFreshNumbersEveryRun) {
  auto body = [](const std::vector<Tensor>& x) {
    Tensor u = ops::random_uniform(x[0].shape(), 0, 1);
    Tensor d = ops::dropout(ops::ones(x[0].shape()), 0.5, draw_seed(), true);
    Tensor fixed = ops::random_normal(x[0].shape(), 0, 1, DType::kF32, 3);
    return std::vector<Tensor>{ops::add(x[0], u), d, fixed, ops::add(u, ops::scalar(1.0f))};
  };
  Tensor x = ops::zeros({64});
  set_seed(5);
  std::vector<std::vector<Tensor>> eager;
  for (int i = 0; i < 3; ++i) eager.push_back(body({x}));
  set_seed(5);
  Function f = function(body);
  std::vector<std::vector<Tensor>> traced;
  for (int i = 0; i < 3; ++i) traced.push_back(f({x}));
  EXPECT_EQ(f.num_traces(), 1);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    for (size_t k = 0; k < 4; ++k) EXPECT_TRUE(array_equal(traced[i][k], eager[i][k])) << k;
  }
  EXPECT_FALSE(array_equal(traced[1][0], traced[2][0]));  // uniform: new numbers
  EXPECT_FALSE(array_equal(traced[1][1], traced[2][1]));  // dropout: a new mask
  EXPECT_TRUE(array_equal(traced[1][2], traced[2][2]));   // seeded: the same numbers
  // One draw feeds both uses of u (it is not duplicated or folded).
  EXPECT_CLOSE(traced[2][3], ops::add(traced[2][0], ops::scalar(1.0f)), 1e-6, 1e-6);
  const Graph& g = f.concrete({x}).graph();
  EXPECT_EQ(g.count_ops("random_uniform"), 1);
  EXPECT_EQ(g.count_ops("dropout"), 1);
  EXPECT_EQ(g.count_ops("random_normal"), 0);  // seeded: folded into a constant
}

TEST(FunctionTest, BadCallsAreClearErrors) {
  Function g = function([](const std::vector<Tensor>& x) { return std::vector<Tensor>{Tensor()}; });
  EXPECT_KILN_ERROR(g({ops::zeros({2})}), kInvalidArgument, "result 0 is undefined");
  EXPECT_KILN_ERROR(Function(nullptr), kInvalidArgument, "callable is empty");
  Function h = function([](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::exp(x[0])}; });
  EXPECT_KILN_ERROR(h({Tensor()}), kInvalidArgument, "argument 0 is undefined");
}

TEST(ExecutorTest, MemoryPlanReusesBuffersOfAChain) {
  // Ten elementwise ops in a chain (level 1: unfused, so the planner sees every
  // intermediate): the first result gets a buffer, every later one is written in place
  // over its input.
  FunctionOptions unfused;
  unfused.passes.level = 1;
  Function f = function([](const std::vector<Tensor>& x) {
    Tensor t = x[0];
    for (int i = 0; i < 10; ++i) t = i % 2 ? ops::exp(ops::neg(t)) : ops::tanh(t);
    return std::vector<Tensor>{t};
  }, unfused);
  Tensor x = rand_tensor({128, 128}, DType::kF32, -1, 1, 11);
  Tensor want = f({x})[0];
  Tensor got = f({x})[0];
  EXPECT_CLOSE(got, want, 1e-6, 1e-6);
  graph::MemoryPlanStats st = f.concrete({x}).executor().memory_stats({{x.shape(), x.dtype()}});
  const int64_t buf = 128 * 128 * 4;
  EXPECT_EQ(st.num_buffers, 14);  // 15 ops; the last result is pinned
  EXPECT_EQ(st.naive_bytes, 14 * buf);
  EXPECT_EQ(st.arena_bytes, buf);
  EXPECT_EQ(st.in_place, 13);
  EXPECT_EQ(st.pinned_bytes, buf);
  // Results of different runs do not share memory.
  Tensor again = f({x})[0];
  EXPECT_NE(again.raw_data(), got.raw_data());
  EXPECT_CLOSE(got, want, 1e-6, 1e-6);
}

TEST(ExecutorTest, OutputsAreGivenAsSoonAsMade) {
  // Output 1 (a) is made first, output 0 (c) last, output 2 is a constant: `ready` sees
  // each once, before run() returns, in the order they are made, with the tensors run()
  // returns (given all at the end, they would come in index order).
  FunctionOptions unfused;
  unfused.passes.level = 1;
  Function f = function([](const std::vector<Tensor>& x) {
    Tensor a = ops::tanh(x[0]);
    Tensor b = ops::exp(ops::matmul(a, a));
    Tensor c = ops::relu(ops::matmul(b, a));
    return std::vector<Tensor>{c, a, Tensor::from_vector<float>({1, 2}, {2})};
  }, unfused);
  Tensor x = rand_tensor({16, 16}, DType::kF32, -1, 1, 3);
  std::vector<size_t> order;
  std::vector<Tensor> given(3);
  auto ready = [&](size_t k, const Tensor& t) {
    order.push_back(k);
    given[k] = t;
  };
  // The first call traces: the results are given after its traced run.
  std::vector<Tensor> traced = f({x}, ready);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2}));
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(given[k].raw_data(), traced[k].raw_data());
  // A planned run: as each is made.
  order.clear();
  std::vector<Tensor> out = f({x}, ready);
  ASSERT_EQ(order.size(), 3u);
  const auto pos = [&](size_t k) { return std::find(order.begin(), order.end(), k) - order.begin(); };
  EXPECT_LT(pos(1), pos(0));  // a before c
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2}));  // once each
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(given[k].raw_data(), out[k].raw_data());
    EXPECT_CLOSE(out[k], traced[k], 1e-5, 1e-5);
  }
  // The constant is a copy, not the graph's own.
  EXPECT_NE(out[2].raw_data(), traced[2].raw_data());
  // What `ready` throws ends the run.
  EXPECT_KILN_ERROR(f({x}, [](size_t, const Tensor&) { throw InvalidArgumentError("stop here"); }), kInvalidArgument,
                    "stop here");
  EXPECT_CLOSE(f({x})[0], out[0], 1e-6, 1e-6);  // and the next run is whole
}

TEST(ExecutorTest, DumpsGraphsPerPass) {
  testing::TempDir dir("graph_dump");
  Graph g = graph::trace([](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::add(x[0], x[0])}; },
                         {ops::ones({2})});
  graph::PassOptions po;
  po.level = 1;
  po.name = "f";
  po.dump_dir = dir.path();
  graph::optimize(g, po);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/f.00-traced.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/f.05-dead_code_elimination.dot"));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(ProfilerTest, ChromeTraceHasOneEventPerExecutedOp) {
  FunctionOptions unfused;  // three ops, not one fused loop
  unfused.passes.level = 1;
  Function f = function([](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{ops::exp(ops::tanh(ops::add(x[0], x[0])))};
  }, unfused);
  Tensor x = testing::rand_tensor({3, 4}, DType::kF32);
  f({x});  // the tracing call runs eagerly: not in the profile
  graph::start_profiling();
  EXPECT_TRUE(graph::profiling());
  f({x});
  f({x});
  const std::string json = graph::stop_profiling();
  EXPECT_FALSE(graph::profiling());
  auto count = [&](const std::string& needle) {
    int c = 0;
    for (size_t pos = json.find(needle); pos != std::string::npos; pos = json.find(needle, pos + 1)) ++c;
    return c;
  };
  EXPECT_EQ(json.rfind("{\"traceEvents\":[", 0), 0u);
  EXPECT_EQ(count("\"ph\":\"X\""), 6);  // 3 ops x 2 runs
  EXPECT_EQ(count("\"name\":\"tanh\""), 2);
  EXPECT_EQ(count("\"shape\":\"f32[3, 4]\""), 6);
  EXPECT_EQ(graph::stop_profiling(), "{\"traceEvents\":[\n],\"kernelFallbacks\":[],\"displayTimeUnit\":\"ms\"}\n");  // cleared
}

// Kernel fallbacks counted while profiling are in the trace; earlier ones are not.
TEST(ProfilerTest, ChromeTraceCountsKernelFallbacksWhileProfiling) {
  note_kernel_fallback("test_profiled_op", "before profiling");
  graph::start_profiling();
  note_kernel_fallback("test_profiled_op", "while profiling");
  note_kernel_fallback("test_profiled_op", "while profiling");
  const std::string json = graph::stop_profiling();
  EXPECT_NE(json.find("{\"op\":\"test_profiled_op\",\"why\":\"while profiling\",\"count\":2}"), std::string::npos)
      << json;
  EXPECT_EQ(json.find("before profiling"), std::string::npos) << json;
}

}  // namespace
}  // namespace kiln
