// The CUDA backend (plugin libkiln_cuda.so): what can be checked without a GPU (the
// plugin loads, explains why it sees no device, registers a CUDA kernel for every op
// the CPU has) runs everywhere; everything that needs a GPU is skipped with the reason
// when there is none. The op tables (tests/ops/*_test.cc, <Suite>OnCuda) compare every
// table op on CUDA with the CPU, forward and backward.
#include <map>
#include <set>

#include "kiln/autodiff/variable.h"
#include "kiln/core/allocator.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/dtype.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/graph/function.h"
#include "kiln/ops/creation.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/optim.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"
#include "test_util.h"

namespace kiln {
namespace {

const Device kGpu{DeviceType::kCUDA, 0};

// Skips the test unless a CUDA device exists.
#define REQUIRE_GPU()                                                                                   \
  do {                                                                                                  \
    Backend* b_ = find_backend(DeviceType::kCUDA);                                                      \
    if (!b_) GTEST_SKIP() << "no CUDA backend: " << backend_unavailable_reason(DeviceType::kCUDA);     \
    if (b_->device_count() == 0) GTEST_SKIP() << "no CUDA device: " << b_->no_device_reason();          \
  } while (0)

TEST(CudaPlugin, LoadsAndExplainsMissingDevices) {
  Backend* b = find_backend(DeviceType::kCUDA);
  ASSERT_NE(b, nullptr) << backend_unavailable_reason(DeviceType::kCUDA);
  EXPECT_EQ(backend_unavailable_reason(DeviceType::kCUDA), "");
  EXPECT_STREQ(b->name(), "cuda");
  const auto phys = config::list_physical_devices(DeviceType::kCUDA);
  if (b->device_count() == 0) {
    // This machine: the runtime finds no GPU, and says why.
    EXPECT_TRUE(phys.empty());
    EXPECT_NE(b->no_device_reason(), "");
    EXPECT_KILN_ERROR(Tensor::empty({4}, DType::kF32, kGpu), kNotFound, "cuda:0 does not exist");
    EXPECT_KILN_ERROR(ops::ones({4}).to(kGpu), kNotFound, "cuda:0 does not exist");
  } else {
    EXPECT_EQ(b->no_device_reason(), "");
    ASSERT_FALSE(phys.empty());
    EXPECT_GT(phys[0].properties.memory_bytes, 0);
    EXPECT_GT(phys[0].properties.compute_units, 0);
    EXPECT_NE(phys[0].properties.name.find("sm_"), std::string::npos) << phys[0].properties.name;
  }
}

// Ops with a CPU kernel and, on purpose, none on CUDA (reason in the comment).
const std::set<std::string> kCpuOnly = {
    // int8 inference (oneDNN VNNI on the CPU): GPU int8 would go through cuBLASLt/TensorRT-style
    // kernels, not written yet.
    "quantize_per_tensor", "dequantize_per_tensor", "qlinear_matmul", "qlinear_conv2d",
};
// (op, dtype) pairs likewise: u8 max pooling carries the int8 layers' activations.
const std::set<std::string> kCpuOnlyDtypes = {"max_pool2d:u8"};

TEST(CudaPlugin, RegistersAKernelForEveryCpuOpAndDtype) {
  ASSERT_NE(find_backend(DeviceType::kCUDA), nullptr) << backend_unavailable_reason(DeviceType::kCUDA);
  std::vector<std::string> missing;
  int covered = 0;
  for (const OpDef* op : OpRegistry::global().all()) {
    if (kCpuOnly.count(op->name)) continue;
    for (int d = 0; d < kNumDTypes; ++d) {
      const auto dt = static_cast<DType>(d);
      if (!op->kernel(DeviceType::kCPU, dt)) continue;
      const std::string pair = op->name + ":" + std::string(dtype_name(dt));
      if (op->kernel(DeviceType::kCUDA, dt)) ++covered;
      else if (!kCpuOnlyDtypes.count(pair)) missing.push_back(pair);
    }
  }
  std::string list;
  for (const auto& m : missing) list += m + " ";
  EXPECT_TRUE(missing.empty()) << missing.size() << " (op, dtype) pairs have a CPU kernel but no CUDA kernel: "
                               << list;
  EXPECT_GT(covered, 100);
}

TEST(CudaDevice, CopiesRoundTripThroughStagingBuffers) {
  REQUIRE_GPU();
  // Empty, one element, and sizes that cross the 8 MiB staging chunks.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{(8 << 20) / 4 + 3}, int64_t{9 << 20}}) {
    SCOPED_TRACE(n);
    Tensor x = ops::random_uniform({n}, -1, 1, DType::kF32, 7);
    Tensor g = x.to(kGpu);
    EXPECT_EQ(g.device(), kGpu);
    Tensor g2 = g.clone();  // device-to-device
    EXPECT_TRUE(array_equal(g2.to(Device::cpu()), x));
  }
}

TEST(CudaDevice, MemoryLimitGivesResourceExhaustedAndStaysUsable) {
  REQUIRE_GPU();
  const AllocatorStats before = config::memory_stats(kGpu);
  const int64_t total = config::list_physical_devices(DeviceType::kCUDA)[0].properties.memory_bytes;
  EXPECT_KILN_ERROR(Tensor::empty({total}, DType::kF32, kGpu), kResourceExhausted, "cuda:0");
  Tensor ok = Tensor::zeros({256}, DType::kF32, kGpu);
  EXPECT_EQ(ops::sum(ok).to(Device::cpu()).item<float>(), 0.0f);
  EXPECT_GE(config::memory_stats(kGpu).num_allocs, before.num_allocs + 1);
}

// Records the attrs of the ops a CPU call runs, to replay them on the GPU.
struct Recorder : OpObserver {
  std::vector<std::pair<const OpDef*, Attrs>> ops;
  void on_op(const OpDef& op, std::span<const Tensor>, std::span<const Tensor>, const Attrs& attrs) override {
    ops.emplace_back(&op, attrs);
  }
};

TEST(CudaDevice, RandomOpsDrawTheCpuNumbers) {
  REQUIRE_GPU();
  const Shape shape{3, 1001};
  std::vector<std::function<Tensor()>> draws = {
      [&] { return ops::random_uniform(shape, -2, 3, DType::kF32, 11); },
      [&] { return ops::random_normal(shape, 1, 2, DType::kF32, 12); },
      [&] { return ops::truncated_normal(shape, 0, 1, DType::kF32, 13); },
      [&] { return ops::bernoulli(shape, 0.3, 14); },
      [&] { return ops::random_uniform(shape, 0, 100, DType::kI32, 15); },
  };
  for (size_t i = 0; i < draws.size(); ++i) {
    SCOPED_TRACE(i);
    Recorder rec;
    OpObserver* prev = set_op_observer(&rec);
    Tensor cpu = draws[i]();
    set_op_observer(prev);
    ASSERT_EQ(rec.ops.size(), 1u);
    Tensor gpu = call_op1(*rec.ops[0].first, {}, rec.ops[0].second, kGpu);
    EXPECT_EQ(gpu.device(), kGpu);
    EXPECT_CLOSE(gpu.to(Device::cpu()), cpu, 1e-6, 1e-6);
  }
  // dropout: the same mask for the same seed.
  Tensor x = ops::random_uniform({4, 513}, 0.5, 1.5, DType::kF32, 3);
  EXPECT_CLOSE(ops::dropout(x.to(kGpu), 0.4, 99).to(Device::cpu()), ops::dropout(x, 0.4, 99), 1e-6, 1e-6);
}

TEST(CudaDevice, OptimizerUpdatesMatchTheCpu) {
  REQUIRE_GPU();
  Tensor p = ops::random_uniform({37, 11}, -1, 1, DType::kF32, 1), g = ops::random_uniform({37, 11}, -1, 1, DType::kF32, 2);
  Tensor m = ops::random_uniform({37, 11}, -1, 1, DType::kF32, 3), v = ops::random_uniform({37, 11}, 0, 1, DType::kF32, 4);
  auto on = [](const Tensor& t) { return t.to(kGpu); };
  auto sgd_c = ops::sgd_update(p, g, m, 0.1, 0.9, true, 0.01);
  auto sgd_g = ops::sgd_update(on(p), on(g), on(m), 0.1, 0.9, true, 0.01);
  EXPECT_CLOSE(sgd_g.param.to(Device::cpu()), sgd_c.param, 1e-6, 1e-6);
  EXPECT_CLOSE(sgd_g.momentum.to(Device::cpu()), sgd_c.momentum, 1e-6, 1e-6);
  auto adam_c = ops::adam_update(p, g, m, v, 0.01, 0.9, 0.999, 1e-7, 5, 0.004);
  auto adam_g = ops::adam_update(on(p), on(g), on(m), on(v), 0.01, 0.9, 0.999, 1e-7, 5, 0.004);
  EXPECT_CLOSE(adam_g.param.to(Device::cpu()), adam_c.param, 1e-5, 1e-6);
  EXPECT_CLOSE(adam_g.v.to(Device::cpu()), adam_c.v, 1e-5, 1e-6);
  // The hyper input (lr, step) read on the device: the traced optimizer's path.
  Tensor hyper = Tensor::from_vector<double>({0.02, 3}, {2});
  auto h_c = ops::adam_update(p, g, m, v, 0, 0.9, 0.999, 1e-7, 1, 0, hyper);
  auto h_g = ops::adam_update(on(p), on(g), on(m), on(v), 0, 0.9, 0.999, 1e-7, 1, 0, on(hyper));
  EXPECT_CLOSE(h_g.param.to(Device::cpu()), h_c.param, 1e-5, 1e-6);
}

TEST(CudaDevice, TracedFunctionRunsOnTheGpu) {
  REQUIRE_GPU();
  Variable w(ops::random_uniform({64, 32}, -0.2, 0.2, DType::kF32, 5).to(kGpu), "w");
  Variable b(Tensor::zeros({32}).to(kGpu), "b");
  auto step = [&](const std::vector<Tensor>& x) {
    Tensor h = ops::relu(ops::matmul(x[0], w.value()) + b.value());
    Tensor y = ops::softmax(ops::exp(h) * 0.5 + 1.0, -1);
    return std::vector<Tensor>{y, ops::sum(h * h)};
  };
  Function f = kiln::function(step);
  Tensor x = ops::random_uniform({16, 64}, -1, 1, DType::kF32, 6);
  std::vector<Tensor> eager = step({x.to(kGpu)});
  std::vector<Tensor> traced = f({x});  // a host input: copied to the variables' device
  traced = f({x.to(kGpu)});             // later calls run the plan
  ASSERT_EQ(traced.size(), 2u);
  EXPECT_EQ(traced[0].device(), kGpu);
  EXPECT_CLOSE(traced[0].to(Device::cpu()), eager[0].to(Device::cpu()), 1e-5, 1e-6);
  EXPECT_CLOSE(traced[1].to(Device::cpu()), eager[1].to(Device::cpu()), 1e-4, 1e-4);
}

TEST(CudaDevice, FusedElementwiseMatchesTheCpu) {
  REQUIRE_GPU();
  Tensor a = ops::random_uniform({1000, 37}, -2, 2, DType::kF32, 8), c = ops::random_uniform({1}, 0.5, 1, DType::kF32, 9);
  Attrs attrs{{"ops", std::string("exp,mul,tanh,add")}, {"args", std::vector<int64_t>{0, -1, 2, 1, 3, -1, 4, 0}}};
  const OpDef& op = OpRegistry::global().get("fused_elementwise");
  Tensor want = call_op1(op, std::vector<Tensor>{a, c}, attrs);
  Tensor got = call_op1(op, std::vector<Tensor>{a.to(kGpu), c.to(kGpu)}, attrs);
  EXPECT_CLOSE(got.to(Device::cpu()), want, 1e-5, 1e-6);
  // A row broadcast along the leading dim (element i reads row[i % 37]).
  Tensor row = ops::random_uniform({37}, -1, 1, DType::kF32, 10);
  Attrs with_row{{"ops", std::string("exp,mul,tanh,add,mul")}, {"args", std::vector<int64_t>{0, -1, 3, 1, 4, -1, 5, 0, 6, 2}}};
  want = call_op1(op, std::vector<Tensor>{a, c, row}, with_row);
  got = call_op1(op, std::vector<Tensor>{a.to(kGpu), c.to(kGpu), row.to(kGpu)}, with_row);
  EXPECT_CLOSE(got.to(Device::cpu()), want, 1e-5, 1e-6);
}

// max_pool2d_backward with the graph-only attrs (relu, bias_grad): dx and the
// per-channel sums match the CPU kernel's, NHWC and NCHW.
TEST(CudaDevice, MaxPoolBackwardBiasGradMatchesTheCpu) {
  REQUIRE_GPU();
  const OpDef& op = OpRegistry::global().get("max_pool2d_backward");
  for (const char* format : {"NHWC", "NCHW"}) {
    SCOPED_TRACE(format);
    const bool nhwc = std::string(format) == "NHWC";
    Tensor x = ops::random_uniform(nhwc ? Shape{4, 8, 8, 16} : Shape{4, 16, 8, 8}, -1, 1, DType::kF32, 11);
    Tensor dy = ops::random_uniform(nhwc ? Shape{4, 4, 4, 16} : Shape{4, 16, 4, 4}, -1, 1, DType::kF32, 12);
    Attrs a{{"ksize", std::vector<int64_t>{2, 2}},
            {"strides", std::vector<int64_t>{2, 2}},
            {"padding", std::string("valid")},
            {"data_format", std::string(format)},
            {"relu", true},
            {"bias_grad", true}};
    std::vector<Tensor> want = call_op(op, std::vector<Tensor>{x, dy}, a);
    std::vector<Tensor> got = call_op(op, std::vector<Tensor>{x.to(kGpu), dy.to(kGpu)}, a);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_CLOSE(got[0].to(Device::cpu()), want[0], 0, 0);
    EXPECT_CLOSE(got[1].to(Device::cpu()), want[1], 1e-5, 1e-5);
  }
}

TEST(CudaDevice, FusedConvBackwardFilterMatchesTheCpu) {
  REQUIRE_GPU();
  const OpDef& op = OpRegistry::global().get("fused_conv2d_backward_filter");
  Tensor x = ops::random_uniform({4, 12, 12, 1}, -1, 1, DType::kF32, 13);
  Tensor y = ops::relu(ops::random_uniform({4, 12, 12, 32}, -1, 1, DType::kF32, 14));
  Tensor dp = ops::random_uniform({4, 6, 6, 32}, -1, 1, DType::kF32, 15);
  Attrs a{{"filter_shape", std::vector<int64_t>{3, 3, 1, 32}},
          {"padding", std::string("same")},
          {"relu", true},
          {"bias_grad", true}};
  std::vector<Tensor> want = call_op(op, std::vector<Tensor>{x, y, dp}, a);
  std::vector<Tensor> got = call_op(op, std::vector<Tensor>{x.to(kGpu), y.to(kGpu), dp.to(kGpu)}, a);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_CLOSE(got[0].to(Device::cpu()), want[0], 1e-4, 1e-4);
  EXPECT_CLOSE(got[1].to(Device::cpu()), want[1], 1e-5, 1e-5);
}

// The pool mask (fused_conv2d pool_mask) and the gradients that read it, against the
// CPU kernels, on ties (quarter-step values) and the ReLU's zeros.
TEST(CudaDevice, PoolMaskAndItsGradientsMatchTheCpu) {
  REQUIRE_GPU();
  auto quarters = [](const Shape& s, uint64_t seed) {
    return ops::div(ops::floor(ops::mul(ops::random_uniform(s, -1, 1, DType::kF32, seed), ops::full({}, 4))),
                    ops::full({}, 4));
  };
  const Tensor x = quarters({4, 12, 12, 1}, 16), w = quarters({3, 3, 1, 32}, 17), b = quarters({32}, 18);
  const Tensor dp = ops::random_uniform({4, 6, 6, 32}, -1, 1, DType::kF32, 19);
  Attrs conv{{"padding", std::string("same")}, {"activation", std::string("relu")}, {"max_pool", int64_t{2}},
             {"pool_mask", true}};
  const OpDef& fwd = OpRegistry::global().get("fused_conv2d");
  const std::vector<Tensor> want = call_op(fwd, std::vector<Tensor>{x, w, b}, conv);
  const std::vector<Tensor> got = call_op(fwd, std::vector<Tensor>{x.to(kGpu), w.to(kGpu), b.to(kGpu)}, conv);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_CLOSE(got[0].to(Device::cpu()), want[0], 1e-5, 1e-5);
  EXPECT_TRUE(array_equal(got[1].to(Device::cpu()), want[1]));
  const OpDef& back = OpRegistry::global().get("max_pool2d_backward_mask");
  const std::vector<Tensor> dx = call_op(back, std::vector<Tensor>{want[1], dp}, Attrs{{"bias_grad", true}});
  const std::vector<Tensor> dx_gpu =
      call_op(back, std::vector<Tensor>{want[1].to(kGpu), dp.to(kGpu)}, Attrs{{"bias_grad", true}});
  EXPECT_TRUE(array_equal(dx_gpu[0].to(Device::cpu()), dx[0]));
  EXPECT_CLOSE(dx_gpu[1].to(Device::cpu()), dx[1], 1e-5, 1e-5);
  const OpDef& filter = OpRegistry::global().get("fused_conv2d_backward_filter");
  Attrs fa{{"filter_shape", std::vector<int64_t>{3, 3, 1, 32}}, {"padding", std::string("same")},
           {"bias_grad", true}, {"pool_mask", true}};
  const std::vector<Tensor> dw = call_op(filter, std::vector<Tensor>{x, want[1], dp}, fa);
  const std::vector<Tensor> dw_gpu = call_op(filter, std::vector<Tensor>{x.to(kGpu), want[1].to(kGpu), dp.to(kGpu)}, fa);
  EXPECT_CLOSE(dw_gpu[0].to(Device::cpu()), dw[0], 1e-4, 1e-4);
  EXPECT_CLOSE(dw_gpu[1].to(Device::cpu()), dw[1], 1e-5, 1e-5);
}

TEST(CudaDevice, ReportsReadings) {
  REQUIRE_GPU();
  auto r = find_backend(DeviceType::kCUDA)->readings(0);
  std::map<std::string, double> m;
  for (const auto& x : r) m[x.name] = x.value;
  // NVML comes with the driver: where the GPU runs, it is there.
  EXPECT_TRUE(m.count("memory_total_bytes")) << "no NVML readings";
  EXPECT_TRUE(m.count("gpu_utilization_ratio"));
}

}  // namespace
}  // namespace kiln
