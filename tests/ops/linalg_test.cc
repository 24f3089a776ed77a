#include "kiln/ops/linalg.h"

#include "op_table.h"

namespace kiln::testing {
namespace {

using namespace kiln::ops;

OpFn mm(bool ta = false, bool tb = false) {
  return [ta, tb](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1], ta, tb)}; };
}

std::vector<OpCase> linalg_cases() {
  const std::vector<DType> all = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16};
  return {
      {"mm_2d", mm(), all, 50}, {"mm_square", mm(), all, 50}, {"mm_rect", mm(), all, 50},
      {"mm_batch", mm(), all, 50}, {"mm_bcast", mm(), all, 50}, {"mm_bcast_b2d", mm(), all, 50},
      {"mm_ta", mm(true, false), all, 50}, {"mm_tb", mm(false, true), all, 50},
      {"mm_tab_batch", mm(true, true), all, 50}, {"mm_vec_mat", mm(), all, 50},
      {"mm_mat_vec", mm(), all, 50}, {"mm_vec_vec", mm(), all, 50},
      {"mm_k0", mm(), all}, {"mm_m0", mm(), all},
  };
}

OpFn es(const char* eq) {
  return [eq](const std::vector<Tensor>& in) { return std::vector<Tensor>{einsum(eq, in)}; };
}

std::vector<OpCase> einsum_cases() {
  return {
      {"einsum_ij_jk", es("ij,jk->ik"), {DType::kF32, DType::kF64}, 50},
      {"einsum_attn", es("bhqd,bhkd->bhqk"), {DType::kF32, DType::kF64}, 50},
      {"einsum_transpose", es("ij->ji"), {DType::kF32, DType::kF64}},
      {"einsum_sum", es("ij->i"), {DType::kF32, DType::kF64}, 10},
      {"einsum_outer", es("i,j->ij"), {DType::kF32, DType::kF64}},
      {"einsum_implicit", es("bij,jk"), {DType::kF32, DType::kF64}, 50},
  };
}

class EinsumOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(EinsumOps, MatchesNumpy) { run_op_case("linalg", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, EinsumOps, ::testing::ValuesIn(einsum_cases()), [](const auto& i) { return i.param.name; });
KILN_CUDA_OP_TABLE(EinsumOps, "linalg", einsum_cases());

TEST(Einsum, BadEquationsGiveTypedErrors) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  EXPECT_KILN_ERROR(einsum("ij,jk->ik", {a, b}), kInvalidArgument, "subscript 'j' has size 3 and 4");
  EXPECT_KILN_ERROR(einsum("ijk,jk->ik", {a, b}), kInvalidArgument, "has rank 2");
  EXPECT_KILN_ERROR(einsum("ij->iz", {a}), kInvalidArgument, "output subscript 'z'");
  EXPECT_KILN_ERROR(einsum("ii->i", {Tensor::zeros({3, 3})}), kInvalidArgument, "repeated subscript");
  EXPECT_KILN_ERROR(einsum("ij,jk->ik", {a}), kInvalidArgument, "operand subscripts");
}

class MatmulOps : public ::testing::TestWithParam<OpCase> {};
TEST_P(MatmulOps, MatchesNumpy) { run_op_case("linalg", GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, MatmulOps, ::testing::ValuesIn(linalg_cases()), [](const auto& i) { return i.param.name; });
KILN_CUDA_OP_TABLE(MatmulOps, "linalg", linalg_cases());

TEST(Matmul, IntegerIsExact) {
  Tensor a = make<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = make<int32_t>({7, 8, 9, 10, 11, 12}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<int32_t>(), (std::vector<int32_t>{58, 64, 139, 154}));
  EXPECT_EQ(matmul(a, b, true, true).to_vector<int32_t>(),
            (std::vector<int32_t>{39, 49, 59, 54, 68, 82, 69, 87, 105}));
}

TEST(Matmul, LargeF32MatchesF64) {
  Tensor a = rand_tensor({3, 96, 200}, DType::kF32, -1, 1, 7);
  Tensor b = rand_tensor({200, 80}, DType::kF32, -1, 1, 8);
  Tensor ref = matmul(a.to(DType::kF64), b.to(DType::kF64));
  EXPECT_CLOSE(matmul(a, b), ref, 1e-4, 1e-4);
}

TEST(Matmul, BadShapesGiveTypedErrors) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  EXPECT_KILN_ERROR(matmul(a, b), kInvalidArgument, "inner dimensions differ");
  EXPECT_KILN_ERROR(matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 2})), kInvalidArgument,
                    "not broadcast-compatible");
  EXPECT_KILN_ERROR(matmul(Tensor::scalar<float>(1), a), kInvalidArgument, "rank >= 1");
}

}  // namespace
}  // namespace kiln::testing
