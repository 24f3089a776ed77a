#pragma once
// Helpers shared by the shape and indexing op tests.
#include <vector>

#include "test_util.h"
#include "kiln/core/dtype.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln::testing {

// Shape ops move bytes: every dtype that holds the fixtures' small integers exactly,
// and all dtypes.
inline const std::vector<DType> kMoveDtypes = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                       DType::kI32, DType::kI64, DType::kI8,  DType::kU8};
inline const std::vector<DType> kAllDtypes = {DType::kBool, DType::kU8,   DType::kI8,  DType::kI32, DType::kI64,
                                       DType::kF16,  DType::kBF16, DType::kF32, DType::kF64};

// Values 0, 1, 2, ... (bool: alternating), as dtype dt.
inline Tensor seq(const Shape& s, DType dt) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = dt == DType::kBool ? static_cast<double>(i % 3 == 1) : double(i % 100);
  return Tensor::from_vector<double>(v, s).to(dt);
}
// The elements of `base` at the given flat positions, as doubles.
inline std::vector<double> pick(const Tensor& base, std::vector<int64_t> pos) {
  std::vector<double> all = base.to_vector<double>(), out;
  for (int64_t p : pos) out.push_back(all[p]);
  return out;
}
inline void expect_picks(const Tensor& got, const Tensor& base, const Shape& shape, std::vector<int64_t> pos) {
  EXPECT_EQ(got.dtype(), base.dtype());
  EXPECT_EQ(got.shape(), shape);
  EXPECT_EQ(got.to_vector<double>(), pick(base, pos));
}

}  // namespace kiln::testing
