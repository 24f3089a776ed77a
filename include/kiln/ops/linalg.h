#pragma once
// Linear algebra.
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::ops {

// NumPy matmul semantics: a is [..., M, K], b is [..., K, N]; leading batch dims
// broadcast; a 1-d a is a row vector and a 1-d b a column vector (that dim is
// dropped from the result). transpose_a/transpose_b swap the last two dims of that
// operand first (free: no copy). Dtypes promote; f32 runs on oneDNN, bf16/f16 on
// oneDNN where the CPU has native support and otherwise compute in f32 and round;
// f64 and integer types use kiln's own loops. Errors: rank 0 operands, K mismatch.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

// Einstein summation for the common contractions: "ij,jk->ik", "bij,bjk->bik",
// "bhqd,bhkd->bhqk", "ij->ji", "ii->i"-free forms: every operand's subscripts are
// distinct letters, at most two operands, the output subscripts explicit (after
// "->") or implicit (letters appearing once, sorted). Lowers to transpose, reshape,
// reductions and one batched matmul.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);

}  // namespace kiln::ops
