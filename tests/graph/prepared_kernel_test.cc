// Two-phase kernels (kiln/core/kernel.h) in compiled graphs: a constant filter is
// re-laid-out once per node and shapes when the kernel is prepared, inputs and
// variables never are, and graphs stay equal to eager calls whatever changes between
// runs. The kernel-level tests write into a "constant" after preparing: a prepared
// kernel must still see the old data (that is what proves it kept it), one prepared
// without constants the new.
#include <cstring>

#include "kiln/autodiff/variable.h"
#include "kiln/core/device.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/kernel.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "test_util.h"

namespace kiln {
namespace {
using testing::rand_tensor;

ops::Conv2dOptions same() {
  ops::Conv2dOptions o;
  o.padding = "same";
  return o;
}

// The op node `name` of f's graph for `args` (its op and attrs as the passes made them).
const graph::Node& node_of(Function& f, const std::vector<Tensor>& args, const std::string& name) {
  for (const graph::Node& n : f.concrete(args).graph().nodes)
    if (n.kind == graph::NodeKind::kOp && n.op->name == name) return n;
  throw std::runtime_error("no " + name + " node");
}

// Node's CPU kernel prepared for `in`, the inputs whose bit is set in `constant` given
// as constants (0: none, as an eager call prepares it).
std::unique_ptr<const PreparedKernel> prepare_for(const graph::Node& node, const std::vector<Tensor>& in,
                                                  uint64_t constant, const PreparedKernel* previous = nullptr) {
  std::vector<TensorMeta> metas;
  std::vector<Tensor> constants(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    metas.push_back({in[i].shape(), in[i].dtype()});
    if ((constant >> i) & 1u) constants[i] = in[i];
  }
  const std::vector<TensorMeta> out = node.op->infer(metas, node.attrs);
  return prepare_kernel({*node.op, DeviceType::kCPU, metas, out, constants, node.attrs, previous});
}

// Runs a prepared kernel of node on `in`.
Tensor run_prepared(const graph::Node& node, const PreparedKernel& k, std::vector<Tensor> in) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : in) metas.push_back({t.shape(), t.dtype()});
  const TensorMeta out = node.op->infer(metas, node.attrs).at(0);
  std::vector<Tensor> outs{Tensor::empty(out.shape, out.dtype)};
  OpContext ctx{*node.op, in, outs, node.attrs};
  k.run(ctx);
  return outs[0];
}

// Runs node's CPU kernel on `in` as an eager call does (prepared and run at once).
Tensor run_eager(const graph::Node& node, std::vector<Tensor> in) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : in) metas.push_back({t.shape(), t.dtype()});
  const TensorMeta out = node.op->infer(metas, node.attrs).at(0);
  std::vector<Tensor> outs{Tensor::empty(out.shape, out.dtype)};
  OpContext ctx{*node.op, in, outs, node.attrs};
  node.op->kernel(DeviceType::kCPU, DType::kF32)(ctx);
  return outs[0];
}

void overwrite(Tensor& dst, const Tensor& src) { std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes()); }

TEST(PreparedKernelsInGraphs, ConstantFilterMatchesEagerOnEveryRun) {
  const Tensor w = rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, 1), b = rand_tensor({16}, DType::kF32, -1, 1, 2);
  auto model = [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::relu(ops::conv2d(x[0], w, same(), b))}; };
  Function f = function(model);
  for (uint64_t seed = 10; seed < 14; ++seed) {
    Tensor x = rand_tensor({2, 9, 9, 8}, DType::kF32, -1, 1, seed);
    EXPECT_CLOSE(f({x})[0], model({x})[0], 1e-5, 1e-5);
  }
  EXPECT_EQ(f.concrete({rand_tensor({2, 9, 9, 8}, DType::kF32)}).graph().count_ops("fused_conv2d"), 1);
  // One trace for every batch size: one plan per size, their kernels sharing the packed filter.
  FunctionOptions o;
  o.input_signature = std::vector<TensorSpec>{{{-1, 9, 9, 8}, DType::kF32}};
  Function pinned = function(model, o);
  for (int64_t batch : {1, 6, 1, 3, 64}) {
    Tensor x = rand_tensor({batch, 9, 9, 8}, DType::kF32, -1, 1, static_cast<uint64_t>(batch));
    EXPECT_CLOSE(pinned({x})[0], model({x})[0], 1e-5, 1e-5);
  }
  EXPECT_EQ(pinned.num_traces(), 1);
}

TEST(PreparedKernelsInGraphs, FiltersThatAreInputsOrVariablesAreReadOnEveryRun) {
  auto conv = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{ops::relu(ops::conv2d(a[0], a[1], same()))}; };
  Function by_input = function(conv);
  const Tensor x = rand_tensor({1, 7, 7, 8}, DType::kF32, -1, 1, 3);
  for (uint64_t seed = 20; seed < 23; ++seed) {
    Tensor w = rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, seed);
    EXPECT_CLOSE(by_input({x, w})[0], conv({x, w})[0], 1e-5, 1e-5);
  }
  Variable v(rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, 30), "w");
  Function by_variable = function([&](const std::vector<Tensor>& a) { return conv({a[0], v.value()}); });
  for (uint64_t seed = 31; seed < 34; ++seed) {
    EXPECT_CLOSE(by_variable({x})[0], conv({x, v.peek()})[0], 1e-5, 1e-5);
    v.assign(rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, seed));
  }
}

TEST(PreparedKernelsInGraphs, Conv2dKernelKeepsTheFilterOnlyWhenItIsConstant) {
  Tensor w = rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, 1);
  const Tensor w2 = rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, 2);
  const Tensor x = rand_tensor({1, 6, 6, 8}, DType::kF32, -1, 1, 3);
  Function f = function([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{ops::relu(ops::conv2d(a[0], w, same()))}; });
  const graph::Node& node = node_of(f, {x}, "fused_conv2d");
  const Tensor with_w = ops::relu(ops::conv2d(x, w, same())), with_w2 = ops::relu(ops::conv2d(x, w2, same()));
  // Both CPU routes: the direct kernel's packed filter and oneDNN's reordered one.
  for (const DirectConv direct : {DirectConv::kForceTile, DirectConv::kOff}) {
    testing::ScopedKernelPreferences prefs([&](KernelPreferences& k) { k.direct_conv = direct; });
    for (const bool constant : {true, false}) {
      SCOPED_TRACE(std::string(constant ? "constant filter" : "filter not constant") + ", direct_conv " +
                   testing::direct_conv_name(direct));
      Tensor filter = w.clone();
      const auto k = prepare_for(node, {x, filter}, constant ? 0b10 : 0b00);
      EXPECT_CLOSE(run_prepared(node, *k, {x, filter}), with_w, 1e-5, 1e-5);
      overwrite(filter, w2);
      EXPECT_CLOSE(run_prepared(node, *k, {x, filter}), constant ? with_w : with_w2, 1e-5, 1e-5);
      EXPECT_CLOSE(run_eager(node, {x, filter}), with_w2, 1e-5, 1e-5);
    }
  }
}

// A node prepared for a second batch size reuses what the first preparation derived from
// its constant filter (prepared while the filter held w, it still computes with w after
// the filter changed), and derives it anew without a previous preparation.
TEST(PreparedKernelsInGraphs, OtherShapesShareTheNodesPackedFilter) {
  Tensor w = rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, 1);
  const Tensor w2 = rand_tensor({3, 3, 8, 16}, DType::kF32, -1, 1, 2);
  const Tensor x1 = rand_tensor({1, 6, 6, 8}, DType::kF32, -1, 1, 3), x3 = rand_tensor({3, 6, 6, 8}, DType::kF32, -1, 1, 4);
  Function f = function([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{ops::relu(ops::conv2d(a[0], w, same()))}; });
  const graph::Node& node = node_of(f, {x1}, "fused_conv2d");
  for (const DirectConv direct : {DirectConv::kForceTile, DirectConv::kOff}) {
    SCOPED_TRACE(std::string("direct_conv ") + testing::direct_conv_name(direct));
    testing::ScopedKernelPreferences prefs([&](KernelPreferences& k) { k.direct_conv = direct; });
    Tensor filter = w.clone();
    const auto first = prepare_for(node, {x1, filter}, 0b10);
    overwrite(filter, w2);
    const auto shared = prepare_for(node, {x3, filter}, 0b10, first.get());
    const auto fresh = prepare_for(node, {x3, filter}, 0b10);
    EXPECT_CLOSE(run_prepared(node, *shared, {x3, filter}), ops::relu(ops::conv2d(x3, w, same())), 1e-5, 1e-5);
    EXPECT_CLOSE(run_prepared(node, *fresh, {x3, filter}), ops::relu(ops::conv2d(x3, w2, same())), 1e-5, 1e-5);
  }
}

// matmul / fused_matmul: a constant B is packed once per node for up to 512 rows (the
// small-M kernel for a few, src/backends/cpu/small_gemm.h, the 6x16 one for more,
// packed_gemm.h), and for any rows when it is tiny (<= 4096 floats); more rows against
// a larger B go to oneDNN, which reads B every call.
TEST(PreparedKernelsInGraphs, MatmulKernelPacksAConstantBUpTo512RowsOrATinyB) {
  for (const int64_t n : {20, 200}) {  // B 24x20 (tiny), 24x200 (4800 floats)
    const Tensor w = rand_tensor({24, n}, DType::kF32, -1, 1, 1), w2 = rand_tensor({24, n}, DType::kF32, -1, 1, 2);
    const Tensor bias = rand_tensor({n}, DType::kF32, -1, 1, 3);
    Function plain = function([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{ops::matmul(a[0], w)}; });
    Function fused = function([&](const std::vector<Tensor>& a) {
      return std::vector<Tensor>{ops::relu(ops::add(ops::matmul(a[0], w), bias))};
    });
    for (const int64_t rows : {1, 3, 64, 600}) {
      const Tensor x = rand_tensor({rows, 24}, DType::kF32, -1, 1, 4);
      const bool packs = rows <= 512 || n == 20;
      for (Function* f : {&plain, &fused}) {
        const bool is_fused = f == &fused;
        const graph::Node& node = node_of(*f, {x}, is_fused ? "fused_matmul" : "matmul");
        auto expected = [&](const Tensor& b) {
          const Tensor y = ops::matmul(x, b);
          return is_fused ? ops::relu(ops::add(y, bias)) : y;
        };
        for (const bool constant : {true, false}) {
          SCOPED_TRACE(std::string(is_fused ? "fused_matmul" : "matmul") + " B 24x" + std::to_string(n) + " rows " +
                       std::to_string(rows) + (constant ? " constant B" : " B not constant"));
          Tensor b = w.clone();
          std::vector<Tensor> in{x, b};
          if (is_fused) in.push_back(bias);
          const auto k = prepare_for(node, in, constant ? 0b110 : 0b000);
          EXPECT_CLOSE(run_prepared(node, *k, in), expected(w), 1e-5, 1e-5);
          overwrite(b, w2);
          EXPECT_CLOSE(run_prepared(node, *k, in), expected(constant && packs ? w : w2), 1e-5, 1e-5);
          EXPECT_CLOSE(run_eager(node, in), expected(w2), 1e-5, 1e-5);
        }
      }
    }
  }
}

// qlinear_conv2d: the f32 route (<= 3 input channels: the dequantised filter and its
// oneDNN layout are kept) and the int8 route (the reordered s8 filter is kept).
TEST(PreparedKernelsInGraphs, QlinearConv2dKernelKeepsConstantFilters) {
  for (const int64_t channels : {1, 8}) {
    SCOPED_TRACE("input channels " + std::to_string(channels));
    const Tensor x = rand_tensor({2, 8, 8, channels}, DType::kF32, 0, 1, 4);
    const Tensor wq = ops::cast(rand_tensor({3, 3, channels, 16}, DType::kF32, -60, 60, 5), DType::kI8);
    const Tensor wq2 = ops::cast(rand_tensor({3, 3, channels, 16}, DType::kF32, -60, 60, 6), DType::kI8);
    const Tensor ws = rand_tensor({16}, DType::kF32, 0.001, 0.01, 7), b = rand_tensor({16}, DType::kF32, -1, 1, 8);
    auto q = [&](const Tensor& xx, const Tensor& w) { return ops::qlinear_conv2d(xx, 1.0 / 127, 0, w, ws, same(), b, "relu"); };
    Function f = function([&](const std::vector<Tensor>& a) { return std::vector<Tensor>{q(a[0], wq)}; });
    for (uint64_t seed = 40; seed < 43; ++seed) {  // the graph, run after run
      const Tensor xs = rand_tensor({2, 8, 8, channels}, DType::kF32, 0, 1, seed);
      EXPECT_CLOSE(f({xs})[0], q(xs, wq), 1e-5, 1e-5);
    }
    const graph::Node& node = node_of(f, {x}, "qlinear_conv2d");
    for (const bool constant : {true, false}) {
      Tensor filter = wq.clone();
      std::vector<Tensor> in{x, filter, ws, b};
      const auto k = prepare_for(node, in, constant ? 0b110 : 0b000);
      EXPECT_CLOSE(run_prepared(node, *k, in), q(x, wq), 1e-5, 1e-5);
      overwrite(filter, wq2);
      EXPECT_CLOSE(run_prepared(node, *k, in), q(x, constant ? wq : wq2), 1e-5, 1e-5);
    }
  }
}

TEST(PreparedKernelsInGraphs, FusedElementwiseProgramIsPreparedOnceAndRunsOnNewData) {
  auto chain = [](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{ops::tanh(ops::add(ops::mul(ops::exp(a[0]), a[1]), ops::scalar(0.5f)))};
  };
  Function f = function(chain);
  for (uint64_t seed = 50; seed < 54; ++seed) {
    const Tensor a = rand_tensor({1000}, DType::kF32, -1, 1, seed), b = rand_tensor({1000}, DType::kF32, -1, 1, seed + 100);
    EXPECT_CLOSE(f({a, b})[0], chain({a, b})[0], 1e-6, 1e-6);
  }
  EXPECT_EQ(f.concrete({rand_tensor({1000}, DType::kF32), rand_tensor({1000}, DType::kF32)}).graph().count_ops(
                "fused_elementwise"),
            1);
}

// A bf16 conv2d is prepared per node too: a constant filter reordered once into oneDNN's
// layout (and shared by the node's other batch sizes) gives what the eager call, which
// reorders per call, gives, bit for bit, batch after batch (widened on CPUs without a
// native bf16 kernel: the same comparison holds).
TEST(PreparedKernelsInGraphs, Bf16ConvWithConstantFilterMatchesEagerCalls) {
  const Tensor w = rand_tensor({3, 3, 16, 32}, DType::kF32, -1, 1, 5).to(DType::kBF16);
  const Tensor b = rand_tensor({32}, DType::kF32, -1, 1, 6).to(DType::kBF16);
  auto model = [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{ops::conv2d(x[0], w, same(), b)}; };
  FunctionOptions fo;
  fo.input_signature = std::vector<TensorSpec>{{{-1, 10, 10, 16}, DType::kBF16}};
  Function f = function(model, fo);
  for (const int64_t batch : {3, 5, 3}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Tensor x =
        rand_tensor({batch, 10, 10, 16}, DType::kF32, -1, 1, static_cast<uint64_t>(batch)).to(DType::kBF16);
    const Tensor got = f({x})[0];
    ASSERT_EQ(got.dtype(), DType::kBF16);
    EXPECT_TRUE(array_equal(got.to(DType::kF32), ops::conv2d(x, w, same(), b).to(DType::kF32)));
  }
}

}  // namespace
}  // namespace kiln
