// Vjp of matmul (the primitive: rank >= 2 operands, transpose flags, batch
// broadcasting). ops::matmul's 1-D operands are reshapes around the primitive, and
// einsum lowers to transpose/reshape/sum/matmul, so neither needs a vjp of its own.
//
// With C = op(A) op(B) (op = optional transpose of the last two dims) and G = dC:
//   dA = G op(B)^T, transposed back when A was transposed;
//   dB = op(A)^T G, likewise.
// Every case is one matmul with transpose flags (no transpose copies); broadcast
// batch dims are summed back with sum_to.
#include "grad_util.h"
#include "kiln/core/op_def.h"

namespace kiln::ops::grad {
namespace {

int64_t batch_count(const Shape& s) {
  int64_t n = 1;
  for (int i = 0; i + 2 < s.rank(); ++i) n *= s[i];
  return n;
}

std::vector<Tensor> matmul_vjp(const VjpContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  const Tensor& g = c.cotangents[0];
  const bool ta = c.attrs.get_bool("transpose_a", false), tb = c.attrs.get_bool("transpose_b", false);
  std::vector<Tensor> r(2);
  if (c.needs(0)) {
    Tensor da = ta ? ops::matmul(b, g, tb, true) : ops::matmul(g, b, false, !tb);
    r[0] = sum_to(da, a.shape());
  }
  if (c.needs(1)) {
    if (!ta && batch_count(b.shape()) == 1 && batch_count(g.shape()) > 1) {
      // A shared weight times batched activations (x @ W with x [..., M, K]): fold the
      // batch into the rows and do one [K, rows] x [rows, N] product instead of a
      // batched product followed by a sum over the batch.
      Tensor a2 = ops::reshape(a, {-1, a.dim(-1)});
      Tensor g2 = ops::reshape(g, {-1, g.dim(-1)});
      Tensor db = tb ? ops::matmul(g2, a2, true, false) : ops::matmul(a2, g2, true, false);
      r[1] = ops::reshape(db, b.shape().vec());
    } else {
      Tensor db = tb ? ops::matmul(g, a, true, ta) : ops::matmul(a, g, !ta, false);
      r[1] = sum_to(db, b.shape());
    }
  }
  return r;
}

KILN_REGISTER_VJP("matmul", matmul_vjp);

}  // namespace
}  // namespace kiln::ops::grad
