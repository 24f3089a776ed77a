// In-place writes in the executor's memory plan (kiln/graph/executor.h): an elementwise
// op takes over the buffer of an input read for the last time, never one that is read
// later, of another shape or dtype, or an input of the graph; the values are those of
// eager mode.
#include "kiln/graph/executor.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
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
  optimize(g, 1);
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

}  // namespace
}  // namespace kiln::graph
