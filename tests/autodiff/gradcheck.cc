#include "gradcheck.h"

#include <cmath>

#include "kiln/autodiff/tape.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"

namespace kiln::testing {

std::vector<GradCase>& grad_cases() {
  static std::vector<GradCase> cases;
  return cases;
}

GradCaseRegistration::GradCaseRegistration(std::vector<GradCase> cases) {
  for (auto& c : cases) grad_cases().push_back(std::move(c));
}

Tensor rnd(const Shape& s, uint64_t seed, double lo, double hi) { return rand_tensor(s, DType::kF64, lo, hi, seed); }

Tensor rnd_away(const Shape& s, uint64_t seed, double lo, double hi) {
  Tensor mag = rand_tensor(s, DType::kF64, lo, hi, seed);
  Tensor sgn = rand_tensor(s, DType::kF64, -1, 1, seed + 7919);
  std::vector<double> m = mag.to_vector<double>(), g = sgn.to_vector<double>();
  for (size_t i = 0; i < m.size(); ++i) m[i] = g[i] < 0 ? -m[i] : m[i];
  return Tensor::from_vector<double>(m, s);
}

Tensor inner_gradient(const Tensor& x, const std::function<Tensor(const Tensor&)>& f, uint64_t seed) {
  GradientTape tape;
  tape.watch(x);
  Tensor y = f(x);
  Tensor w = rnd(y.shape(), seed);
  return tape.gradient(ops::sum(ops::mul(ops::mul(y, ops::square(y)), w)), {x}, {}, UnconnectedGradients::kZero)[0];
}

namespace {
double weighted_sum(const Tensor& y, const std::vector<double>& w) {
  std::vector<double> v = y.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}
}  // namespace

void check_gradients(const GradCase& c) {
  SCOPED_TRACE(c.name);
  std::vector<int> check = c.check;
  if (check.empty())
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (c.inputs[i].dtype() == DType::kF64) check.push_back(static_cast<int>(i));

  // Analytic: one tape, output_gradient = w.
  Tensor y0 = c.fn(c.inputs);
  ASSERT_EQ(y0.dtype(), DType::kF64) << "gradcheck cases compute in f64";
  Tensor w = rand_tensor(y0.shape(), DType::kF64, -1, 1, 4242);
  std::vector<double> wv = w.to_vector<double>();
  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    std::vector<Tensor> srcs;
    for (int i : check) {
      tape.watch(c.inputs[i]);
      srcs.push_back(c.inputs[i]);
    }
    Tensor y = c.fn(c.inputs);
    analytic = tape.gradient(y, srcs, w, UnconnectedGradients::kZero);
  }
  ASSERT_EQ(analytic.size(), check.size());

  for (size_t k = 0; k < check.size(); ++k) {
    const int i = check[k];
    SCOPED_TRACE("input " + std::to_string(i));
    ASSERT_TRUE(analytic[k].defined());
    ASSERT_EQ(analytic[k].shape(), c.inputs[i].shape());
    std::vector<double> base = c.inputs[i].to_vector<double>();
    std::vector<double> num(base.size());
    for (size_t e = 0; e < base.size(); ++e) {
      std::vector<Tensor> in = c.inputs;
      std::vector<double> p = base;
      p[e] = base[e] + c.eps;
      in[i] = Tensor::from_vector<double>(p, c.inputs[i].shape());
      double fp = weighted_sum(c.fn(in), wv);
      p[e] = base[e] - c.eps;
      in[i] = Tensor::from_vector<double>(p, c.inputs[i].shape());
      double fm = weighted_sum(c.fn(in), wv);
      num[e] = (fp - fm) / (2 * c.eps);
    }
    Tensor numeric = Tensor::from_vector<double>(num, c.inputs[i].shape());
    EXPECT_CLOSE(analytic[k].to(DType::kF64), numeric, c.rtol, c.atol);
  }
}

}  // namespace kiln::testing
