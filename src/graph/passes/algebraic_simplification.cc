// Algebraic simplification: rewrites that remove work without changing any value.
//   x * 1, 1 * x, x + 0, 0 + x, x - 0, x / 1   -> x   (when the constant does not
//                                                       broadcast x to a bigger shape or
//                                                       change its dtype)
//   reshape(x) to x's own shape, cast(x) to x's dtype, stop_gradient(x) -> x
//   reshape(reshape(x, s1), s2)                 -> reshape(x, s2)
//   transpose(transpose(x, p), q), q o p = id   -> x
//   cast(cast(x, wider), x.dtype), exact widening -> x
// Nodes left without readers go to dead-code elimination.
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/passes.h"

namespace kiln::graph {
namespace {

bool constant_all(const Graph& g, ValueRef v, double value) {
  const Node& n = g.nodes[static_cast<size_t>(v.node)];
  if (n.kind != NodeKind::kConstant) return false;
  const Tensor& c = n.constant;
  for (int64_t i = 0; i < c.numel(); ++i)
    if (c.get_double(i) != value) return false;
  return true;
}

// `wide` holds every value of `narrow` exactly.
bool exact_widening(DType narrow, DType wide) {
  switch (narrow) {
    case DType::kF16:
    case DType::kBF16: return wide == DType::kF32 || wide == DType::kF64;
    case DType::kF32: return wide == DType::kF64;
    case DType::kI8:
    case DType::kU8: return wide == DType::kI32 || wide == DType::kI64 || wide == DType::kF32 || wide == DType::kF64;
    case DType::kI32: return wide == DType::kI64 || wide == DType::kF64;
    default: return false;
  }
}

}  // namespace

void simplify_algebra(Graph& g) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.kind != NodeKind::kOp || n.outputs.size() != 1) continue;
    const ValueRef self{static_cast<int>(i), 0};
    const TensorMeta& out = n.outputs[0];
    const std::string& op = n.op->name;
    auto same_as_out = [&](ValueRef v) {
      const TensorMeta& m = g.meta(v);
      return m.shape == out.shape && m.dtype == out.dtype;
    };
    auto forward = [&](ValueRef to) { replace_uses(g, self, to); };
    if (n.inputs.size() == 2 && (op == "mul" || op == "add" || op == "sub" || op == "div")) {
      const double neutral = (op == "mul" || op == "div") ? 1.0 : 0.0;
      const bool commutes = op == "mul" || op == "add";
      if (constant_all(g, n.inputs[1], neutral) && same_as_out(n.inputs[0])) forward(n.inputs[0]);
      else if (commutes && constant_all(g, n.inputs[0], neutral) && same_as_out(n.inputs[1])) forward(n.inputs[1]);
      continue;
    }
    if (n.inputs.size() != 1) continue;
    const ValueRef x = n.inputs[0];
    const Node& src = g.nodes[static_cast<size_t>(x.node)];
    if ((op == "reshape" || op == "cast" || op == "stop_gradient") && same_as_out(x)) {
      forward(x);
    } else if (op == "reshape" && src.kind == NodeKind::kOp && src.op->name == "reshape") {
      n.inputs[0] = src.inputs[0];  // the outer reshape's attrs already name the final shape
    } else if (op == "transpose" && src.kind == NodeKind::kOp && src.op->name == "transpose") {
      const std::vector<int64_t>& p = src.attrs.get_ints("perm");
      const std::vector<int64_t>& q = n.attrs.get_ints("perm");
      bool identity = p.size() == q.size();
      for (size_t k = 0; identity && k < q.size(); ++k)
        identity = p[static_cast<size_t>(q[k])] == static_cast<int64_t>(k);
      if (identity) forward(src.inputs[0]);
    } else if (op == "cast" && src.kind == NodeKind::kOp && src.op->name == "cast") {
      const ValueRef orig = src.inputs[0];
      if (g.meta(orig).dtype == out.dtype && exact_widening(out.dtype, g.meta(x).dtype)) forward(orig);
    }
  }
}

}  // namespace kiln::graph
