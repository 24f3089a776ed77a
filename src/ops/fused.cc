// Fused ops that graph passes create (src/graph/passes/; fused_conv2d lives with
// conv2d in nn_conv.cc, it shares its attrs): one kernel for what eager
// mode runs as several ops. Not differentiable: graphs are differentiated before they
// are fused (a traced train step already holds its backward ops).
#include "op_util.h"

namespace kiln::ops {
namespace {

// fused_matmul(a [M, K], b [K, N], bias [N]) = activation(a @ b + bias), with the
// matmul's transpose flags; activation "" (none) or "relu".
std::vector<TensorMeta> infer_fused_matmul(std::span<const TensorMeta> in, const Attrs& attrs) {
  detail::require_same_dtype("fused_matmul", in);
  const Shape &a = in[0].shape, &b = in[1].shape, &bias = in[2].shape;
  if (a.rank() != 2 || b.rank() != 2 || bias.rank() != 1)
    throw InvalidArgumentError("fused_matmul: needs a and b of rank 2 and a bias of rank 1, got " + a.str() + ", " +
                               b.str() + ", " + bias.str());
  const bool ta = attrs.get_bool("transpose_a", false), tb = attrs.get_bool("transpose_b", false);
  const int64_t m = ta ? a[1] : a[0], ka = ta ? a[0] : a[1], kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  if (ka != kb || bias[0] != n)
    throw InvalidArgumentError("fused_matmul: shapes do not chain: a " + a.str() + ", b " + b.str() + ", bias " +
                               bias.str());
  const std::string act = attrs.get_string("activation", "");
  if (act != "" && act != "relu")
    throw InvalidArgumentError("fused_matmul: unknown activation '" + act + "' (expected none or relu)");
  return {{Shape{m, n}, in[0].dtype}};
}

KILN_REGISTER_OP(detail::make_def("fused_matmul", "activation(a @ b + bias), made by graph fusion", 3,
                                  infer_fused_matmul,
                                  {{"transpose_a", AttrType::kBool, "transpose a"},
                                   {"transpose_b", AttrType::kBool, "transpose b"},
                                   {"activation", AttrType::kString, "\"\" or \"relu\""}},
                                  Differentiable::kNo));

}  // namespace
}  // namespace kiln::ops
