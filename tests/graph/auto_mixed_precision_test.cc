// The automatic mixed-precision pass (kiln/graph/auto_mixed_precision.h): which ops it
// moves to 16 bits (allow always; infer only between 16-bit ops; clear follows; deny
// never), the casts it inserts (one per value, constants converted once), dtypes kept
// at the graph's edges (outputs, variables, assignments), results close to f32, and
// the pipeline's PassOptions::auto_mixed_precision.

#include <set>
#include <string>

#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/graph/auto_mixed_precision.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/function.h"
#include "kiln/graph/passes.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/shape.h"
#include "scoped_env.h"
#include "graph_test_util.h"
#include "test_util.h"

namespace kiln::graph {
namespace {
using testing::rand_tensor;

using testing::run;

// The dtype of the first node running `op`.
DType dtype_of(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes)
    if (n.kind == NodeKind::kOp && n.op->name == op) return n.outputs[0].dtype;
  ADD_FAILURE() << "no " << op << " node";
  return DType::kF32;
}

const Tensor kW1 = rand_tensor({16, 32}, DType::kF32, -0.5, 0.5, 1);
const Tensor kW2 = rand_tensor({32, 8}, DType::kF32, -0.5, 0.5, 2);
const Tensor kW3 = rand_tensor({16, 32}, DType::kF32, -0.5, 0.5, 9);

// matmul -> relu -> matmul -> softmax, and a matmul -> relu feeding only a sum.
std::vector<Tensor> mlp(const std::vector<Tensor>& x) {
  Tensor h = ops::relu(ops::matmul(x[0], kW1));
  Tensor y = ops::softmax(ops::matmul(h, kW2), -1);
  Tensor side = ops::sum(ops::relu(ops::matmul(x[0], kW3)));
  return {y, side};
}

TEST(AutoMixedPrecision, AllowInferAndDenyOps) {
  for (DType low : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_name(low)));
    const Tensor x = rand_tensor({4, 16}, DType::kF32, -1, 1, 3);
    Graph g = trace(mlp, {x});
    const std::vector<Tensor> want = run(g, {x});
    const int converted = auto_mixed_precision(g, low);
    g.check();
    // The three matmuls (allow) and the relu between two of them (infer); not the
    // softmax (deny), not the sum, and not the relu that feeds only the sum.
    EXPECT_EQ(converted, 4);
    int low_relus = 0, f32_relus = 0;
    for (const Node& n : g.nodes) {
      if (n.kind != NodeKind::kOp) continue;
      if (n.op->name == "matmul") {
        EXPECT_EQ(n.outputs[0].dtype, low);
      }
      if (n.op->name == "relu") ++(n.outputs[0].dtype == low ? low_relus : f32_relus);
    }
    EXPECT_EQ(low_relus, 1);
    EXPECT_EQ(f32_relus, 1);
    EXPECT_EQ(dtype_of(g, "softmax"), DType::kF32);
    EXPECT_EQ(dtype_of(g, "sum"), DType::kF32);
    // Casts: x once to 16 bits (shared by the two matmuls that read it), the second
    // matmul's output back for the softmax, the third's for its f32 relu. The weights
    // are constants, converted at rewrite time: no cast node for them.
    EXPECT_EQ(g.count_ops("cast"), 3);
    int low_constants = 0;
    for (const Node& n : g.nodes) low_constants += n.kind == NodeKind::kConstant && n.constant.dtype() == low;
    EXPECT_EQ(low_constants, 3);
    // The outputs keep their dtypes and stay close to f32.
    const std::vector<Tensor> got = run(g, {x});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].dtype(), DType::kF32);
    EXPECT_EQ(got[1].dtype(), DType::kF32);
    const double tol = low == DType::kBF16 ? 3e-2 : 5e-3;
    EXPECT_CLOSE(got[0], want[0], tol, tol);
    EXPECT_CLOSE(got[1], want[1], tol, tol * std::abs(want[1].item<double>()) + tol);
    EXPECT_FALSE(allclose(got[0], want[0], 0, 0));  // it did compute in 16 bits
  }
}

TEST(AutoMixedPrecision, ClearOpsFollowTheirInputsAndNonF32GraphsAreLeftAlone) {
  const Tensor x = rand_tensor({4, 16}, DType::kF32, -1, 1, 4);
  Graph g = trace(
      [](const std::vector<Tensor>& a) {
        Tensor h = ops::reshape(ops::matmul(a[0], kW1), {4, 4, 8});
        return std::vector<Tensor>{ops::exp(ops::reshape(h, {4, 32}))};
      },
      {x});
  auto_mixed_precision(g);
  EXPECT_EQ(dtype_of(g, "matmul"), DType::kBF16);
  EXPECT_EQ(dtype_of(g, "reshape"), DType::kBF16);  // clear: follows the matmul
  EXPECT_EQ(dtype_of(g, "exp"), DType::kF32);        // deny
  EXPECT_EQ(run(g, {x})[0].dtype(), DType::kF32);

  // f64 matmuls are not touched.
  const Tensor x64 = x.to(DType::kF64);
  Graph g64 = trace([](const std::vector<Tensor>& a) { return std::vector<Tensor>{ops::matmul(a[0], a[0], false, true)}; },
                    {x64});
  EXPECT_EQ(auto_mixed_precision(g64), 0);
  EXPECT_EQ(g64.count_ops("cast"), 0);
}

// A training step: the forward/backward matmuls go to bf16, the gradients reach the
// (deny-listed) update in f32, the variable stays f32.
TEST(AutoMixedPrecision, TrainStepKeepsF32VariablesAndUpdates) {
  Variable w(rand_tensor({16, 8}, DType::kF32, -0.5, 0.5, 5), "w");
  const Tensor x = rand_tensor({8, 16}, DType::kF32, -1, 1, 6);
  auto step = [&](const std::vector<Tensor>& a) {
    GradientTape tape;
    Tensor loss = ops::mean(ops::square(ops::relu(ops::matmul(a[0], w.value()))));
    Tensor gw = tape.gradient(loss, {w})[0];
    w.assign(ops::sub(w.peek(), ops::mul(gw, ops::scalar(0.1))));
    return std::vector<Tensor>{loss};
  };
  const Tensor w0 = w.peek().clone();
  Graph g = trace(step, {x});
  w.assign(w0);  // tracing may have run the step
  Graph f32 = g;
  EXPECT_GE(auto_mixed_precision(g), 2);  // the forward matmul and the weight gradient's
  ASSERT_EQ(g.assignments.size(), 1u);
  EXPECT_EQ(g.meta(g.assignments[0].value).dtype, DType::kF32);
  EXPECT_EQ(run(g, {x})[0].dtype(), DType::kF32);
  const Tensor w_amp = w.peek().clone();
  w.assign(w0);
  run(f32, {x});
  EXPECT_EQ(w.peek().dtype(), DType::kF32);
  EXPECT_CLOSE(w_amp, w.peek(), 2e-2, 2e-2);
  EXPECT_FALSE(allclose(w_amp, w.peek(), 0, 0));
}

TEST(AutoMixedPrecision, PipelineOptionAndBadValues) {
  const Tensor x = rand_tensor({4, 16}, DType::kF32, -1, 1, 7);
  auto count_low = [&](DType amp, DType low_type) {
    Graph g = trace(mlp, {x});
    PassOptions o;
    o.auto_mixed_precision = amp;
    optimize(g, o);
    int low = 0;
    for (const Node& n : g.nodes) low += n.kind == NodeKind::kOp && n.outputs[0].dtype == low_type;
    return low;
  };
  EXPECT_EQ(count_low(DType::kF32, DType::kBF16), 0);  // the default: off
  EXPECT_GT(count_low(DType::kBF16, DType::kBF16), 0);
  EXPECT_GT(count_low(DType::kF16, DType::kF16), 0);
  EXPECT_KILN_ERROR(count_low(DType::kI8, DType::kI8), kInvalidArgument,
                    "PassOptions::auto_mixed_precision must be f32 (off), bf16 or f16, got i8");
  {  // the environment variable of earlier versions does nothing now
    testing::ScopedEnv env("KILN_AUTO_MIXED_PRECISION", "bf16");
    EXPECT_EQ(count_low(DType::kF32, DType::kBF16), 0);
  }
  Graph g = trace(mlp, {x});
  EXPECT_KILN_ERROR(auto_mixed_precision(g, DType::kF32), kInvalidArgument, "must be bf16 or f16");
}

}  // namespace
// The default lists are the ops' traits (OpTraits::amp); these are the lists the pass
// was written and measured with.
TEST(AutoMixedPrecision, DefaultListsComeFromOpTraits) {
  const AmpLists& l = default_amp_lists();
  EXPECT_EQ(l.allow, (std::set<std::string>{"matmul", "conv2d", "conv2d_backward_data", "conv2d_backward_filter"}));
  EXPECT_EQ(l.infer, (std::set<std::string>{"add", "sub", "mul", "neg", "maximum", "minimum", "relu", "relu_grad",
                                            "leaky_relu", "gelu", "tanh", "sigmoid", "max_pool2d",
                                            "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward"}));
  EXPECT_EQ(l.clear, (std::set<std::string>{"reshape", "transpose", "concat", "pad", "stop_gradient"}));
}

}  // namespace kiln::graph
