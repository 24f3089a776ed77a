// Runs every registered finite-difference case and checks that every differentiable
// op in the registry is covered by at least one.
#include <set>

#include "gradcheck.h"
#include "kiln/core/op_def.h"

namespace kiln::testing {
namespace {

class GradCheck : public ::testing::TestWithParam<size_t> {};

TEST_P(GradCheck, MatchesCentralDifferences) { check_gradients(grad_cases().at(GetParam())); }

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string n = grad_cases().at(info.param).name;
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n + "_" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(Vjp, GradCheck, ::testing::Range<size_t>(0, grad_cases().size()), case_name);

TEST(GradCheckCoverage, EveryDifferentiableOpHasAVjpAndACase) {
  std::set<std::string> covered;
  for (const auto& c : grad_cases()) covered.insert(c.ops.begin(), c.ops.end());
  for (const OpDef* d : OpRegistry::global().all()) {
    if (d->differentiable == Differentiable::kNo) {
      EXPECT_EQ(d->vjp, nullptr) << d->name << " is declared non-differentiable but has a vjp";
      continue;
    }
    EXPECT_EQ(d->differentiable, Differentiable::kYes) << d->name << ": differentiability undeclared";
    EXPECT_NE(d->vjp, nullptr) << d->name << " is differentiable but has no vjp";
    EXPECT_TRUE(covered.count(d->name)) << d->name << " has no finite-difference case";
  }
}

}  // namespace
}  // namespace kiln::testing
