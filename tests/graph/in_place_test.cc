// In-place writes in the executor's memory plan (kiln/graph/executor.h): an elementwise
// op takes over the buffer of an input read for the last time, never one that is read
// later, of another shape or dtype, or an input of the graph; an optimizer update
// writes over the variable it assigns when nothing else reads or holds its value; the
// values are those of eager mode.
#include "kiln/autodiff/variable.h"
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/optim.h"
#include "kiln/ops/reduce.h"
#include "test_util.h"

namespace kiln::graph {
namespace {
using testing::rand_tensor;

MemoryPlanStats stats_of(const Executor& e, const std::vector<Tensor>& in) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : in) metas.push_back({t.shape(), t.dtype()});
  return const_cast<Executor&>(e).memory_stats(metas);
}

// Runs fn traced at level 1 (no fusion: the planner sees every op) and eagerly.
MemoryPlanStats check(const TracedFn& fn, const std::vector<Tensor>& in) {
  Graph g = trace(fn, in);
  PassOptions cleanups_only;
  cleanups_only.level = 1;
  optimize(g, cleanups_only);
  Executor e(std::move(g));
  const std::vector<Tensor> want = fn(in);
  for (int run = 0; run < 2; ++run) {  // the arena is reused from run to run
    const std::vector<Tensor> got = e.run(in);
    EXPECT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size() && k < got.size(); ++k) EXPECT_CLOSE(got[k], want[k], 1e-6, 1e-6);
  }
  return stats_of(e, in);
}

TEST(InPlaceTest, ValuesReadLaterAreNotOverwritten) {
  const Tensor x = rand_tensor({64, 33}, DType::kF32, -2, 2, 1);
  const MemoryPlanStats st = check(
      [](const std::vector<Tensor>& in) {
        Tensor t = ops::exp(in[0]);         // a new buffer (the input is the caller's)
        Tensor u = ops::neg(t);             // not over t: the add reads t
        Tensor v = ops::add(u, t);          // over u (or t): both read for the last time
        Tensor w = ops::relu_grad(v, in[0]);  // over v
        return std::vector<Tensor>{ops::tanh(w)};
      },
      {x});
  EXPECT_EQ(st.num_buffers, 4);
  EXPECT_EQ(st.in_place, 2);
  EXPECT_EQ(st.arena_bytes, 2 * 64 * 33 * 4);  // t and u (a multiple of the alignment)
}

TEST(InPlaceTest, OtherShapesAndDtypesGetTheirOwnBuffers) {
  const Tensor col = rand_tensor({16, 1}, DType::kF32, -1, 1, 2), row = rand_tensor({16, 24}, DType::kF32, -1, 1, 3);
  const MemoryPlanStats st = check(
      [](const std::vector<Tensor>& in) {
        Tensor a = ops::exp(in[0]);                        // [16, 1]
        Tensor b = ops::add(a, in[1]);                     // [16, 24]: not over a
        Tensor c = ops::cast(ops::neg(b), DType::kF64);    // neg over b; the cast changes the dtype
        Tensor d = ops::greater(c, ops::scalar(0.0));      // bool: not over c
        return std::vector<Tensor>{ops::where(d, c, ops::sqrt(ops::abs(c)))};  // abs not over c (where reads it)
      },
      {col, row});
  EXPECT_EQ(st.in_place, 2);  // neg over b; sqrt over abs
}

// Integer and 16-bit kernels in place (their loops convert in chunks).
TEST(InPlaceTest, IntegerAnd16BitKernels) {
  for (DType t : {DType::kI32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = ops::cast(rand_tensor({1000}, DType::kF32, -8, 8, 4), t);
    const MemoryPlanStats st = check(
        [](const std::vector<Tensor>& in) {
          Tensor a = ops::abs(in[0]);
          Tensor b = ops::mul(a, a);
          return std::vector<Tensor>{ops::neg(ops::add(b, in[0]))};
        },
        {x});
    EXPECT_EQ(st.in_place, 2);  // mul over a, add over b
  }
}

// An Adam update of w, its slots m and v; `extra` reads w's old value before (a
// gradient-like product) and returns what the test asks for. Variables are created by
// the caller so that eager and traced runs start equal.
struct AdamStep {
  Variable w, m, v;
  bool read_old_after = false;  // also return 2 * (w's old value), computed after the update
  std::vector<Tensor> operator()(const std::vector<Tensor>& in) const {
    const Tensor old = w.value();
    const Tensor g = ops::mul(in[0], old);
    const ops::AdamUpdate r = ops::adam_update(w.peek(), g, m.peek(), v.peek(), 0, 0.9, 0.999, 1e-7, 1, 0, in[1]);
    w.assign(r.param);
    m.assign(r.m);
    v.assign(r.v);
    std::vector<Tensor> out{ops::sum(g)};
    if (read_old_after) out.push_back(ops::mul(old, ops::scalar(2.0f)));
    return out;
  }
};

AdamStep adam_step(uint64_t seed) {
  return {Variable(rand_tensor({37, 19}, DType::kF32, -1, 1, seed), "w"), Variable(ops::zeros({37, 19}), "m"),
          Variable(ops::zeros({37, 19}), "v")};
}

std::vector<Tensor> step_inputs(int step) {
  return {rand_tensor({37, 19}, DType::kF32, -1, 1, 100 + static_cast<uint64_t>(step)),
          testing::make<double>({0.01, static_cast<double>(step)}, {2})};
}

TEST(InPlaceTest, OptimizerUpdatesWriteOverTheirVariables) {
  AdamStep eager = adam_step(7), traced = adam_step(7);
  Graph g = trace(traced, step_inputs(1));  // runs step 1 eagerly on `traced`
  eager(step_inputs(1));
  Executor e(std::move(g));
  const MemoryPlanStats st = stats_of(e, step_inputs(2));
  EXPECT_EQ(st.updated_in_place, 3);  // w, m, v
  EXPECT_EQ(st.pinned_bytes, 4);      // the loss only
  const void* at[3] = {traced.w.peek().raw_data(), traced.m.peek().raw_data(), traced.v.peek().raw_data()};
  for (int step = 2; step <= 4; ++step) {
    const std::vector<Tensor> in = step_inputs(step);
    EXPECT_CLOSE(e.run(in)[0], eager(in)[0], 1e-5, 1e-5);
    EXPECT_EQ(traced.w.peek().raw_data(), at[0]);
    EXPECT_EQ(traced.m.peek().raw_data(), at[1]);
    EXPECT_EQ(traced.v.peek().raw_data(), at[2]);
  }
  EXPECT_TRUE(array_equal(traced.w.peek(), eager.w.peek()));
  EXPECT_TRUE(array_equal(traced.m.peek(), eager.m.peek()));
  EXPECT_TRUE(array_equal(traced.v.peek(), eager.v.peek()));

  // A value someone kept is not written over: that run updates into a new buffer.
  const Tensor kept = traced.w.peek(), before = kept.clone();
  e.run(step_inputs(5));
  eager(step_inputs(5));
  EXPECT_TRUE(array_equal(kept, before));
  EXPECT_NE(traced.w.peek().raw_data(), kept.raw_data());
  EXPECT_EQ(traced.m.peek().raw_data(), at[1]);  // the slots were still exclusive
  EXPECT_TRUE(array_equal(traced.w.peek(), eager.w.peek()));
}

TEST(InPlaceTest, AVariableReadAfterItsUpdateKeepsItsOldValue) {
  AdamStep eager = adam_step(8), traced = adam_step(8);
  eager.read_old_after = traced.read_old_after = true;
  Graph g = trace(traced, step_inputs(1));
  eager(step_inputs(1));
  Executor e(std::move(g));
  EXPECT_EQ(stats_of(e, step_inputs(2)).updated_in_place, 2);  // m and v; w is read after its update
  const std::vector<Tensor> in = step_inputs(2);
  const Tensor old_w = traced.w.peek().clone();
  const std::vector<Tensor> got = e.run(in), want = eager(in);
  EXPECT_TRUE(array_equal(got[1], ops::mul(old_w, ops::scalar(2.0f))));
  EXPECT_TRUE(array_equal(got[1], want[1]));
  EXPECT_TRUE(array_equal(traced.w.peek(), eager.w.peek()));
}

TEST(InPlaceTest, AVariableReturnedByTheGraphIsNotWrittenOver) {
  AdamStep traced = adam_step(9);
  Graph g = trace(
      [&](const std::vector<Tensor>& in) {
        const Tensor old = traced.w.value();
        std::vector<Tensor> out = traced(in);
        out.push_back(old);
        return out;
      },
      step_inputs(1));
  Executor e(std::move(g));
  EXPECT_EQ(stats_of(e, step_inputs(2)).updated_in_place, 2);
  const Tensor before = traced.w.peek().clone();
  const std::vector<Tensor> got = e.run(step_inputs(2));
  EXPECT_TRUE(array_equal(got.back(), before));
  EXPECT_FALSE(array_equal(traced.w.peek(), before));
}

}  // namespace
}  // namespace kiln::graph
