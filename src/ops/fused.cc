// Fused ops that graph passes create (kiln/ops/fused.h; fused_conv2d lives with
// conv2d in nn_conv.cc, it shares its attrs): one kernel for what eager mode runs as
// several ops.
#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/ops/fused.h"

#include "nn_util.h"
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

// fused_elementwise: see kiln/ops/fused.h.
// An op's arity as one instruction of fused_elementwise (its OpTraits, op_traits.cc).
ElementwiseArity arity_of(std::string_view op) {
  const OpDef* d = OpRegistry::global().find(op);
  return d ? d->traits.elementwise : ElementwiseArity::kNone;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

std::vector<TensorMeta> infer_fused_elementwise(std::span<const TensorMeta> in, const Attrs& attrs) {
  auto fail = [](const std::string& why) { throw InvalidArgumentError("fused_elementwise: " + why); };
  const std::vector<std::string> ops = split(attrs.get_string("ops"), ',');
  const std::vector<int64_t>& args = attrs.get_ints("args");
  if (in.empty() || ops.empty() || args.size() != 2 * ops.size())
    fail("needs inputs, ops and two args per op (got " + std::to_string(in.size()) + " inputs, " +
         std::to_string(ops.size()) + " ops, " + std::to_string(args.size()) + " args)");
  Shape shape = in[0].shape;  // the output's: the inputs broadcast together
  for (const TensorMeta& m : in) {
    if (m.dtype != DType::kF32) fail("inputs must be f32, got " + detail::dtype_str(m.dtype));
    try {
      shape = broadcast_shapes(shape, m.shape);
    } catch (const InvalidArgumentError& e) {
      fail(e.message());
    }
  }
  for (const TensorMeta& m : in)
    if (m.shape != shape && !broadcasts_along_leading_dims(m.shape, shape))
      fail("inputs must have the output's shape, one element, or its trailing dims (got " + m.shape.str() +
           " and " + shape.str() + ")");
  for (size_t k = 0; k < ops.size(); ++k) {
    const int64_t defined = static_cast<int64_t>(in.size() + k);  // registers before instruction k
    const ElementwiseArity arity = arity_of(ops[k]);
    const bool unary = arity == ElementwiseArity::kUnary, binary = arity == ElementwiseArity::kBinary;
    if (!unary && !binary) fail("op '" + ops[k] + "' cannot be fused");
    const int64_t a = args[2 * k], b = args[2 * k + 1];
    if (a < 0 || a >= defined || (binary && (b < 0 || b >= defined)) || (unary && b != -1))
      fail("instruction " + std::to_string(k) + " (" + ops[k] + ") reads registers " + std::to_string(a) + ", " +
           std::to_string(b) + " of " + std::to_string(defined));
  }
  return {{shape, DType::kF32}};
}

KILN_REGISTER_OP([] {
  OpDef d = detail::make_def("fused_elementwise", "a chain of f32 elementwise ops in one loop, made by graph fusion",
                             -1, infer_fused_elementwise,
                             {{"ops", AttrType::kString, "op names, comma-separated, one per instruction"},
                              {"args", AttrType::kInts, "two input registers per instruction (-1: none)"}},
                             Differentiable::kNo);
  d.overwritable = {{0, -1}};  // any input of the output's shape: each element is loaded before it is stored
  return d;
}());

}  // namespace

bool broadcasts_along_leading_dims(const Shape& in, const Shape& out) {
  if (in.rank() > out.rank()) return false;
  if (in.numel() == 1) return true;
  int r = in.rank();
  while (r > 0 && in[in.rank() - r] == 1) --r;  // leading 1s
  if (r > out.rank()) return false;
  for (int k = 1; k <= r; ++k)
    if (in[in.rank() - k] != out[out.rank() - k]) return false;
  return true;
}

bool fusable_elementwise(const std::string& op, bool* binary) {
  const ElementwiseArity arity = arity_of(op);
  *binary = arity == ElementwiseArity::kBinary;
  return arity != ElementwiseArity::kNone;
}

}  // namespace kiln::ops
