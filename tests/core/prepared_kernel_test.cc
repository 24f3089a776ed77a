// Two-phase kernels at the registry and dispatch level (kiln/core/kernel.h): an op whose
// CPU kernel is prepared. Eager calls prepare and run at once; prepare_kernel prepares
// once for many runs, sees constants and lends what it derived to the next shapes; an
// op without a kernel is a typed error; kernel fallbacks are counted.
#include <atomic>
#include <vector>

#include "kiln/core/dispatch.h"
#include "kiln/core/error.h"
#include "kiln/core/kernel.h"
#include "kiln/core/op_def.h"
#include "kiln/core/tensor.h"
#include "test_util.h"

namespace kiln {
namespace {

std::atomic<int> g_prepares{0};

std::vector<TensorMeta> infer_same(std::span<const TensorMeta> in, const Attrs&) { return {in[0]}; }

// y = x * factor + c, where c (input 1, one element) is read at prepare time when it is
// a constant and at run time otherwise.
class ScaleShift final : public PreparedKernel {
 public:
  explicit ScaleShift(const PrepareContext& pc) : factor_(static_cast<float>(pc.attrs.get_float("factor"))) {
    ++g_prepares;
    if (const Tensor* c = pc.constant(1)) shift_ = c->data<float>()[0], constant_ = true;
    if (const auto* prev = dynamic_cast<const ScaleShift*>(pc.previous); prev && constant_) shift_ = prev->shift_;
  }
  void run(OpContext& ctx) const override {
    const float shift = constant_ ? shift_ : ctx.in[1].data<float>()[0];
    const float* x = ctx.in[0].data<float>();
    float* y = ctx.out[0].data<float>();
    for (int64_t i = 0; i < ctx.in[0].numel(); ++i) y[i] = x[i] * factor_ + shift;
  }

 private:
  float factor_;
  float shift_ = 0.0f;
  bool constant_ = false;
};

std::unique_ptr<const PreparedKernel> prepare_scale_shift(const PrepareContext& pc) {
  return std::make_unique<ScaleShift>(pc);
}

OpDef scale_shift_def() {
  OpDef d;
  d.name = "test_prepared_scale_shift";
  d.num_inputs = 2;
  d.attrs = {{"factor", AttrType::kFloat, "multiplier"}};
  d.infer = infer_same;
  return d;
}
KILN_REGISTER_OP(scale_shift_def());
KILN_REGISTER_PREPARED_KERNEL("test_prepared_scale_shift", DeviceType::kCPU, DType::kF32, prepare_scale_shift);

OpDef no_kernel_def() {
  OpDef d;
  d.name = "test_prepared_no_kernel";
  d.num_inputs = 1;
  d.infer = infer_same;
  return d;
}
KILN_REGISTER_OP(no_kernel_def());

Tensor vec(std::vector<float> v) { return Tensor::from_vector(v, Shape{static_cast<int64_t>(v.size())}); }

TEST(PreparedKernels, EagerCallsPrepareAndRunAtOnce) {
  const OpDef& op = OpRegistry::global().get("test_prepared_scale_shift");
  ASSERT_NE(op.prepare(DeviceType::kCPU, DType::kF32), nullptr);
  ASSERT_NE(op.kernel(DeviceType::kCPU, DType::kF32), nullptr);
  EXPECT_EQ(op.prepare(DeviceType::kCPU, DType::kF64), nullptr);
  const int before = g_prepares;
  const Tensor y = call_op1(op, std::vector<Tensor>{vec({1, 2, 3}), vec({0.5f})}, Attrs{{"factor", 2.0}});
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2.5f, 4.5f, 6.5f}));
  EXPECT_EQ(g_prepares - before, 1);
}

TEST(PreparedKernels, PreparedOnceRunManyTimesWithConstantsKept) {
  const OpDef& op = OpRegistry::global().get("test_prepared_scale_shift");
  const Attrs attrs{{"factor", 3.0}};
  Tensor shift = vec({1.0f});
  const std::vector<TensorMeta> in{{Shape{2}, DType::kF32}, {Shape{1}, DType::kF32}}, out{{Shape{2}, DType::kF32}};
  const int before = g_prepares;
  const std::vector<Tensor> constants{Tensor(), shift};
  const auto k = prepare_kernel({op, DeviceType::kCPU, in, out, constants, attrs});
  const auto plain = prepare_kernel({op, DeviceType::kCPU, in, out, {}, attrs});
  EXPECT_EQ(g_prepares - before, 2);
  shift.data<float>()[0] = 10.0f;  // the constant changes behind the prepared kernel's back
  for (int run = 0; run < 3; ++run) {
    std::vector<Tensor> ins{vec({1, 2}), shift}, outs{Tensor::empty(Shape{2}, DType::kF32)};
    OpContext ctx{op, ins, outs, attrs};
    k->run(ctx);
    EXPECT_EQ(outs[0].to_vector<float>(), (std::vector<float>{4.0f, 7.0f}));  // kept: 1
    plain->run(ctx);
    EXPECT_EQ(outs[0].to_vector<float>(), (std::vector<float>{13.0f, 16.0f}));  // read: 10
  }
  EXPECT_EQ(g_prepares - before, 2);
  // Another shape, lent the first preparation: it shares what that derived.
  const std::vector<TensorMeta> in4{{Shape{4}, DType::kF32}, {Shape{1}, DType::kF32}}, out4{{Shape{4}, DType::kF32}};
  const auto k4 = prepare_kernel({op, DeviceType::kCPU, in4, out4, constants, attrs, k.get()});
  std::vector<Tensor> ins{vec({0, 0, 0, 1}), shift}, outs{Tensor::empty(Shape{4}, DType::kF32)};
  OpContext ctx{op, ins, outs, attrs};
  k4->run(ctx);
  EXPECT_EQ(outs[0].to_vector<float>(), (std::vector<float>{1.0f, 1.0f, 1.0f, 4.0f}));
}

TEST(PreparedKernels, AMissingKernelIsATypedError) {
  const OpDef& op = OpRegistry::global().get("test_prepared_no_kernel");
  const std::vector<TensorMeta> in{{Shape{2}, DType::kF32}};
  EXPECT_THROW(prepare_kernel({op, DeviceType::kCPU, in, in, {}, Attrs{}}), UnimplementedError);
  const OpDef& scale = OpRegistry::global().get("test_prepared_scale_shift");
  const std::vector<TensorMeta> f64{{Shape{2}, DType::kF64}, {Shape{1}, DType::kF64}};
  EXPECT_THROW(prepare_kernel({scale, DeviceType::kCPU, f64, f64, {}, Attrs{{"factor", 1.0}}}), UnimplementedError);
}

TEST(KernelFallbacks, AreCountedByOpAndReason) {
  auto count = [](const char* op, const char* why) {
    for (const KernelFallback& f : kernel_fallbacks())
      if (f.op == op && f.why == why) return f.count;
    return int64_t{0};
  };
  const int64_t before = count("test_op", "no primitive");
  note_kernel_fallback("test_op", "no primitive");
  note_kernel_fallback("test_op", "no primitive");
  note_kernel_fallback("test_op", "another reason");
  EXPECT_EQ(count("test_op", "no primitive") - before, 2);
  EXPECT_GE(count("test_op", "another reason"), 1);
}

}  // namespace
}  // namespace kiln
