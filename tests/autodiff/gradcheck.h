#pragma once
// Finite-difference gradient checks (central differences in f64) for the vjp table.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln::testing {

struct GradCase {
  std::string name;                                       // test label, e.g. "matmul/ta"
  std::vector<std::string> ops;                           // the ops whose vjps this case covers
  std::vector<Tensor> inputs;                             // f64 for the inputs to check
  std::function<Tensor(const std::vector<Tensor>&)> fn;   // builds the output from the inputs
  std::vector<int> check = {};                            // inputs to check; empty = every f64 input
  double eps = 1e-6;
  double rtol = 1e-5, atol = 1e-6;
};

// Checks tape gradients of sum(fn(inputs) * w) (w random) against central differences.
void check_gradients(const GradCase& c);

// Every case registered by the table files (for coverage and parametrised tests).
std::vector<GradCase>& grad_cases();
struct GradCaseRegistration {
  explicit GradCaseRegistration(std::vector<GradCase> cases);
};
#define KILN_GRAD_CASES(...) \
  static ::kiln::testing::GradCaseRegistration KILN_CONCAT(kiln_grad_cases_, __COUNTER__)(__VA_ARGS__)

// An f64 tensor from values.
inline Tensor f64(std::vector<double> v, Shape s) { return Tensor::from_vector<double>(v, s); }

// d/dx sum(f(x)^3 * w) (w random from `seed`) computed with an inner tape: nonlinear in
// x through f's vjp, so a gradcheck of it checks that the vjp is itself differentiable.
Tensor inner_gradient(const Tensor& x, const std::function<Tensor(const Tensor&)>& f, uint64_t seed);

// Counts the ops run while it lives, by name (replaces the op observer; restores it).
class OpCounter : public OpObserver {
 public:
  OpCounter() : prev_(set_op_observer(this)) {}
  ~OpCounter() override { set_op_observer(prev_); }
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  void on_op(const OpDef& op, std::span<const Tensor>, std::span<const Tensor>, const Attrs&) override {
    ++counts[op.name];
    ++total;
  }
  std::map<std::string, int> counts;
  int total = 0;

 private:
  OpObserver* prev_;
};

// f64 test data in [lo, hi), deterministic per seed.
Tensor rnd(const Shape& s, uint64_t seed, double lo = -1, double hi = 1);
// f64 test data with |x| in [lo, hi) and random sign (away from kinks at 0).
Tensor rnd_away(const Shape& s, uint64_t seed, double lo = 0.2, double hi = 1);

}  // namespace kiln::testing
