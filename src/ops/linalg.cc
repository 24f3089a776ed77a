#include "kiln/ops/linalg.h"
#include "kiln/ops/shape.h"

#include "kiln/core/op_def.h"
#include "kiln/ops/elementwise.h"
#include "op_util.h"

namespace kiln::ops {
namespace {

std::vector<TensorMeta> infer_matmul(std::span<const TensorMeta> in, const Attrs& attrs) {
  detail::require_same_dtype("matmul", in);
  const Shape &a = in[0].shape, &b = in[1].shape;
  if (a.rank() < 2 || b.rank() < 2)
    throw InvalidArgumentError("matmul: the primitive needs rank >= 2 operands, got " + a.str() + " and " + b.str());
  bool ta = attrs.get_bool("transpose_a", false), tb = attrs.get_bool("transpose_b", false);
  int64_t m = ta ? a[a.rank() - 1] : a[a.rank() - 2];
  int64_t ka = ta ? a[a.rank() - 2] : a[a.rank() - 1];
  int64_t kb = tb ? b[b.rank() - 1] : b[b.rank() - 2];
  int64_t n = tb ? b[b.rank() - 2] : b[b.rank() - 1];
  if (ka != kb)
    throw InvalidArgumentError("matmul: inner dimensions differ: a is " + a.str() + (ta ? " (transposed)" : "") +
                               " with K=" + std::to_string(ka) + ", b is " + b.str() + (tb ? " (transposed)" : "") +
                               " with K=" + std::to_string(kb));
  Shape ab(std::span<const int64_t>(a.begin(), a.rank() - 2));
  Shape bb(std::span<const int64_t>(b.begin(), b.rank() - 2));
  Shape out = broadcast_shapes(ab, bb);
  out.push_back(m);
  out.push_back(n);
  return {{out, in[0].dtype}};
}

KILN_REGISTER_OP([] {
  OpDef o;
  o.name = "matmul";
  o.doc = "batched matrix product with broadcasting and transpose flags";
  o.num_inputs = 2;
  o.attrs = {{"transpose_a", AttrType::kBool, "transpose the last two dims of a"},
             {"transpose_b", AttrType::kBool, "transpose the last two dims of b"}};
  o.infer = infer_matmul;
  o.differentiable = Differentiable::kYes;
  return o;
}());

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  KILN_CHECK_ARG(a.defined() && b.defined(), "matmul: undefined operand");
  KILN_CHECK_ARG(a.rank() >= 1 && b.rank() >= 1, "matmul: operands must have rank >= 1, got ", a.shape().str(),
                 " and ", b.shape().str());
  DType t = promote_types(a.dtype(), b.dtype());
  Tensor x = a.dtype() == t ? a : cast(a, t), y = b.dtype() == t ? b : cast(b, t);
  bool vec_a = x.rank() == 1, vec_b = y.rank() == 1;
  if (vec_a) {
    x = reshape(x, {1, x.dim(0)});  // ops::reshape: gradient tapes see it
    transpose_a = false;
  }
  if (vec_b) {
    y = reshape(y, {y.dim(0), 1});
    transpose_b = false;
  }
  Tensor out = detail::call1(KILN_OP("matmul"), {x, y}, {{"transpose_a", transpose_a}, {"transpose_b", transpose_b}});
  if (vec_a || vec_b) {
    Shape s = out.shape();
    if (vec_b) s.erase(s.rank() - 1);
    if (vec_a) s.erase(s.rank() - (vec_b ? 1 : 2));
    out = reshape(out, s.vec());
  }
  return out;
}

}  // namespace kiln::ops
