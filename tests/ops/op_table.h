#pragma once
// Table-driven op tests against NumPy fixtures (ggml's test-backend-ops is the model).
//
// A case is fixtures/<family>/<case>.in<k>.npy (k = 0, 1, ...) and
// fixtures/<family>/<case>.out<k>.npy, written by scripts/fixtures/gen_<family>.py.
// Floating inputs are stored as f32 and references computed in f64 from them.
// For each dtype of the case:
//   f32, f64: run on inputs cast to that dtype, compare with the reference;
//   f16, bf16: run on inputs rounded to that dtype, compare with the f32 run on the
//              same rounded inputs (itself checked against NumPy), at that dtype's
//              tolerance;
//   integer dtypes: exact comparison.
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"

namespace kiln::testing {

using OpFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct OpCase {
  std::string name;                 // fixture case name
  OpFn fn;
  std::vector<DType> dtypes = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};
  double rtol_scale = 1.0;          // loosen for ill-conditioned cases
};

inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// The floating-point dtypes.
inline const std::vector<DType> kFloatDtypes = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};

std::vector<Tensor> load_inputs(const std::string& family, const std::string& name);
std::vector<Tensor> load_outputs(const std::string& family, const std::string& name);
// Runs one case for all its dtypes with gtest assertions.
void run_op_case(const std::string& family, const OpCase& c);

// Runs every case on the first CUDA device and compares with the same case on the CPU
// (itself checked against NumPy by run_op_case), forward for every dtype of the case
// and backward (tape gradients with a fixed random cotangent) for f32. Skipped, with
// the reason, when there is no CUDA device. One test per table: a process that asks
// for CUDA loads the plugin and its libraries (a fraction of a second).
void run_op_cases_cuda(const std::string& family, const std::vector<OpCase>& cases);

// The CUDA twin of a table test suite: TEST(<Suite>OnCuda, MatchesCpu).
#define KILN_CUDA_OP_TABLE(Suite, family, cases_expr) \
  TEST(Suite##OnCuda, MatchesCpu) { ::kiln::testing::run_op_cases_cuda(family, cases_expr); }

inline OpFn unary_fn(Tensor (*f)(const Tensor&)) {
  return [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; };
}
inline OpFn binary_fn(Tensor (*f)(const Tensor&, const Tensor&)) {
  return [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; };
}

}  // namespace kiln::testing
