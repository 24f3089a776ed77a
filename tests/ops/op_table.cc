#include "op_table.h"

#include <sys/stat.h>

#include "kiln/autodiff/tape.h"
#include "kiln/core/device.h"
#include "kiln/core/device_config.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/flags.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/random.h"
#include "kiln/ops/reduce.h"

namespace kiln::testing {
namespace {
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
std::vector<Tensor> load_series(const std::string& family, const std::string& name, const char* kind) {
  std::vector<Tensor> v;
  for (int k = 0;; ++k) {
    std::string rel = family + "/" + name + "." + kind + std::to_string(k) + ".npy";
    if (!exists(fixture(rel))) break;
    v.push_back(load(rel));
  }
  return v;
}
Tensor cast_floating(const Tensor& t, DType dt) { return is_floating(t.dtype()) ? ops::cast(t, dt) : t; }
}  // namespace

std::vector<Tensor> load_inputs(const std::string& family, const std::string& name) {
  return load_series(family, name, "in");
}
std::vector<Tensor> load_outputs(const std::string& family, const std::string& name) {
  return load_series(family, name, "out");
}

void run_op_case(const std::string& family, const OpCase& c) {
  SCOPED_TRACE("case " + family + "/" + c.name);
  std::vector<Tensor> in = load_inputs(family, c.name);
  std::vector<Tensor> ref = load_outputs(family, c.name);
  ASSERT_FALSE(ref.empty()) << "no fixture outputs for " << family << "/" << c.name
                            << " (run scripts/fixtures/gen_" << family << ".py)";
  for (DType dt : c.dtypes) {
    SCOPED_TRACE(std::string("dtype ") + std::string(dtype_name(dt)));
    std::vector<Tensor> args, expected;
    if (dt == DType::kF16 || dt == DType::kBF16) {
      for (auto& t : in) args.push_back(cast_floating(t, dt));
      std::vector<Tensor> widened;
      for (auto& t : args) widened.push_back(cast_floating(t, DType::kF32));
      expected = c.fn(widened);
    } else {
      for (auto& t : in) args.push_back(cast_floating(t, dt));
      expected = ref;
    }
    std::vector<Tensor> got = c.fn(args);
    ASSERT_EQ(got.size(), expected.size());
    Tol tol = tol_for(dt);
    for (size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE("output " + std::to_string(k));
      ASSERT_EQ(got[k].shape(), expected[k].shape()) << got[k].desc() << " vs " << expected[k].desc();
      if (is_floating(got[k].dtype())) {
        if (is_floating(dt)) {
          EXPECT_EQ(got[k].dtype(), dt) << "output dtype should follow the input dtype";
        }
        EXPECT_CLOSE(got[k], expected[k], tol.rtol * c.rtol_scale, tol.atol * c.rtol_scale);
      } else {
        EXPECT_CLOSE(got[k], expected[k], 0, 0);
      }
    }
  }
}

namespace {

// Tape gradients of sum_k sum(out_k * w_k) w.r.t. the floating inputs, w_k fixed
// pseudo-random cotangents (on the inputs' device). Empty when the case has no
// differentiable floating output.
std::vector<Tensor> gradients(const OpCase& c, const std::vector<Tensor>& args) {
  GradientTape tape;
  for (const Tensor& a : args)
    if (is_floating(a.dtype())) tape.watch(a);
  std::vector<Tensor> out = c.fn(args);
  Tensor total;
  for (size_t k = 0; k < out.size(); ++k) {
    if (!is_floating(out[k].dtype())) continue;
    Tensor w = ops::random_uniform(out[k].shape(), -1, 1, out[k].dtype(), 1000 + k).to(out[k].device());
    Tensor term = ops::sum(out[k] * w);
    total = total.defined() ? total + term : term;
  }
  if (!total.defined()) return {};
  std::vector<Tensor> sources;
  for (const Tensor& a : args)
    if (is_floating(a.dtype())) sources.push_back(a);
  return tape.gradient(total, sources, {}, UnconnectedGradients::kZero);
}

}  // namespace

void run_op_cases_cuda(const std::string& family, const std::vector<OpCase>& cases) {
  // Full f32 precision: the CPU reference is f32, TF32 (on by default) has a 10-bit mantissa.
  set_cuda_allow_tf32(false);
  Backend* b = find_backend(DeviceType::kCUDA);
  if (!b) GTEST_SKIP() << "no CUDA backend: " << backend_unavailable_reason(DeviceType::kCUDA);
  if (b->device_count() == 0) GTEST_SKIP() << "no CUDA device: " << b->no_device_reason();
  const Device gpu{DeviceType::kCUDA, 0};
  for (const OpCase& c : cases) {
    SCOPED_TRACE("case " + family + "/" + c.name + " on " + gpu.str());
    std::vector<Tensor> in = load_inputs(family, c.name);
    for (DType dt : c.dtypes) {
      SCOPED_TRACE(std::string("dtype ") + std::string(dtype_name(dt)));
      std::vector<Tensor> args, dargs;
      for (auto& t : in) args.push_back(cast_floating(t, dt));
      for (auto& t : args) dargs.push_back(t.to(gpu));
      std::vector<Tensor> want = c.fn(args);
      std::vector<Tensor> got;
      try {
        got = c.fn(dargs);
      } catch (const Error& e) {
        ADD_FAILURE() << "on CUDA: " << e.what();
        continue;
      }
      ASSERT_EQ(got.size(), want.size());
      const Tol tol = tol_for(dt);
      for (size_t k = 0; k < got.size(); ++k) {
        SCOPED_TRACE("output " + std::to_string(k));
        EXPECT_EQ(got[k].device(), gpu) << got[k].desc();
        ASSERT_EQ(got[k].shape(), want[k].shape());
        ASSERT_EQ(got[k].dtype(), want[k].dtype());
        const Tensor host = got[k].to(Device::cpu());
        if (is_floating(host.dtype())) EXPECT_CLOSE(host, want[k], tol.rtol * c.rtol_scale, tol.atol * c.rtol_scale);
        else EXPECT_CLOSE(host, want[k], 0, 0);
      }
      if (dt != DType::kF32) continue;
      std::vector<Tensor> gw;
      try {
        gw = gradients(c, args);
      } catch (const Error&) {
        continue;  // not differentiable on the CPU either
      }
      std::vector<Tensor> gg;
      try {
        gg = gradients(c, dargs);
      } catch (const Error& e) {
        ADD_FAILURE() << "gradient on CUDA: " << e.what();
        continue;
      }
      ASSERT_EQ(gg.size(), gw.size());
      for (size_t k = 0; k < gg.size(); ++k) {
        SCOPED_TRACE("gradient of input " + std::to_string(k));
        ASSERT_EQ(gg[k].defined(), gw[k].defined());
        if (gw[k].defined()) EXPECT_CLOSE(gg[k].to(Device::cpu()), gw[k], 10 * tol.rtol, 10 * tol.atol);
      }
    }
  }
}

}  // namespace kiln::testing
