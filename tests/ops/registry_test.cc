// The op registry's self-test (OpRegistry::verify), run over every op this build
// registers: a kernel or a vjp registered under a name no op defines (a misspelling that
// would never run) is reported, every op has shape inference and a CPU kernel, and the
// ops without an f32 CPU kernel are exactly the ones listed here, each for its reason.
#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/dispatch.h"
#include "kiln/core/kernel.h"
#include "kiln/core/op_def.h"
#include "test_util.h"

namespace kiln {
namespace {

// A kernel whose op name is misspelt on purpose: verify() must report it, and nothing
// else may find it.
void k_never_runs(OpContext&) {}
KILN_REGISTER_KERNEL("registry_test_mispelt_op", DeviceType::kCPU, DType::kF32, k_never_runs);

TEST(OpRegistry, VerifyReportsOnlyTheMisspeltKernel) {
  const std::vector<std::string> problems = OpRegistry::global().verify();
  ASSERT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0], "a cpu kernel is registered for 'registry_test_mispelt_op', which no op defines");
  EXPECT_EQ(OpRegistry::global().find("registry_test_mispelt_op"), nullptr);
  EXPECT_KILN_ERROR(OpRegistry::global().get("registry_test_mispelt_op"), kNotFound,
                    "no op named 'registry_test_mispelt_op' is registered");
}

TEST(OpRegistry, VerifyChecksNamesOthersRelyOn) {
  const std::string_view names[] = {"matmul", "fused_conv2d", "no_such_op_anywhere"};
  const std::vector<std::string> problems = OpRegistry::global().verify(names);
  EXPECT_NE(std::find(problems.begin(), problems.end(), "op 'no_such_op_anywhere' is named but not defined"),
            problems.end());
  EXPECT_EQ(std::count_if(problems.begin(), problems.end(),
                          [](const std::string& p) { return p.find("is named but not defined") != std::string::npos; }),
            1);
}

TEST(OpRegistry, OpsWithoutAnF32CpuKernelAreTheListedOnes) {
  // Ops whose kernel is chosen by a dtype that is never f32.
  const std::set<std::string> expected = {
      "logical_and", "logical_not", "logical_or",  // bool inputs
      "bernoulli",                                 // bool output (no inputs: output 0's dtype)
      "dequantize_per_tensor",                     // i8/u8 input
      "one_hot",                                   // integer indices
  };
  std::set<std::string> got;
  for (const OpDef* d : OpRegistry::global().all())
    if (!d->kernel(DeviceType::kCPU, DType::kF32)) got.insert(d->name);
  EXPECT_EQ(got, expected);
}

TEST(OpRegistry, EveryOpIsListedOnceWithItsSchema) {
  const std::vector<const OpDef*> ops = OpRegistry::global().all();
  EXPECT_GT(ops.size(), 100u);
  std::set<std::string> names;
  for (const OpDef* d : ops) {
    EXPECT_TRUE(names.insert(d->name).second) << d->name;
    EXPECT_NE(d->infer, nullptr) << d->name;
    EXPECT_FALSE(d->doc.empty()) << d->name << " has no doc";
    EXPECT_NE(d->differentiable, Differentiable::kUnknown) << d->name;
  }
}

// Every op whose traits say fused_elementwise can run it does, and computes what the
// op computes (the same expression, f32).
TEST(OpRegistry, ElementwiseTraitsHoldForFusedElementwise) {
  const OpDef& fused = OpRegistry::global().get("fused_elementwise");
  const Tensor a = Tensor::from_vector<float>({0.5f, -1.25f, 2.0f, 0.75f}, Shape{4});
  const Tensor b = Tensor::from_vector<float>({1.5f, 0.25f, -3.0f, 0.75f}, Shape{4});
  int checked = 0;
  for (const OpDef* d : OpRegistry::global().all()) {
    if (d->traits.elementwise == ElementwiseArity::kNone) continue;
    SCOPED_TRACE(d->name);
    const bool binary = d->traits.elementwise == ElementwiseArity::kBinary;
    // Positive inputs for the ops with a restricted domain (log, sqrt, ...).
    const Tensor x = binary ? a : Tensor::from_vector<float>({0.5f, 1.25f, 2.0f, 0.75f}, Shape{4});
    std::vector<Tensor> in{x};
    if (binary) in.push_back(b);
    const Attrs attrs{{"ops", d->name}, {"args", std::vector<int64_t>{0, binary ? 1 : -1}}};
    const Tensor got = call_op1(fused, in, attrs);
    const Tensor want = call_op1(*d, in, {});
    EXPECT_TRUE(allclose(got, want, 1e-6, 1e-6)) << describe_mismatch(got, want, 1e-6, 1e-6);
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

}  // namespace
}  // namespace kiln
