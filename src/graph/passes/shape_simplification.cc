// Shape simplification with the traced shapes: ops that, at these shapes, move no data
// or copy it unchanged are removed or become reshapes (views: no copy in the executor).
//   broadcast_to(x, x.shape), tile(x, 1...), pad(x, 0...), concat(x), split(x) into
//   one part                                         -> x
//   stack(x), a transpose that keeps the order of the dims larger than 1, a reduction
//   (sum, mean, max, min, prod) over dims of size 1 that keeps the dtype
//                                                    -> reshape(x) to the output shape
//   binary(broadcast_to(b, s), a) with a of shape s  -> binary(b, a): the op broadcasts
//                                                       b itself (no s-sized copy)
// A strided_slice that takes everything is kept: its bounds are resolved at trace
// time, so at another size of a dimension the signature leaves open (-1) it selects
// part of the input. The other rewrites either keep their meaning at other sizes or
// fix the traced shape in a reshape, which rejects other sizes (and a function with a
// pinned signature traces that shape again).
#include <algorithm>

#include "kiln/core/op_def.h"
#include "kiln/graph/passes.h"
#include "pass_util.h"

namespace kiln::graph {
namespace {

using pass_util::is_op;

bool all_equal(const std::vector<int64_t>& v, int64_t x) {
  return std::all_of(v.begin(), v.end(), [x](int64_t e) { return e == x; });
}

// The transpose keeps every dim larger than 1 in its order: the same elements in the
// same memory order.
bool moves_only_unit_dims(const Shape& in, std::vector<int64_t> perm) {
  if (perm.empty())
    for (int i = in.rank() - 1; i >= 0; --i) perm.push_back(i);
  int64_t last = -1;
  for (int64_t p : perm) {
    if (p < 0 || p >= in.rank()) return false;
    if (in[static_cast<int>(p)] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

// The reduction reduces only dims of size 1 (or nothing).
bool reduces_only_unit_dims(const Shape& in, const std::vector<int64_t>& axes) {
  if (axes.empty()) return in.numel() == 1;  // empty: every axis
  for (int64_t a : axes) {
    const int64_t k = a < 0 ? a + in.rank() : a;
    if (k < 0 || k >= in.rank() || in[static_cast<int>(k)] != 1) return false;
  }
  return true;
}

bool is_broadcasting_binary(const Node& n) {
  static const char* const kOps[] = {"add",  "sub",   "mul",        "div",     "maximum",       "minimum",
                                     "pow",  "equal", "not_equal",  "less",    "less_equal",    "greater",
                                     "greater_equal", "logical_and", "logical_or"};
  if (n.kind != NodeKind::kOp || n.inputs.size() != 2) return false;
  return std::any_of(std::begin(kOps), std::end(kOps), [&](const char* op) { return n.op->name == op; });
}

}  // namespace

void simplify_shapes(Graph& g) {
  const OpDef& reshape = OpRegistry::global().get("reshape");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.kind != NodeKind::kOp) continue;
    const std::string& op = n.op->name;

    if (is_broadcasting_binary(n)) {
      // A broadcast_to operand whose partner already has the output's shape.
      for (int k = 0; k < 2; ++k) {
        const ValueRef b = n.inputs[static_cast<size_t>(k)];
        const Node& bn = g.nodes[static_cast<size_t>(b.node)];
        const ValueRef other = n.inputs[static_cast<size_t>(1 - k)];
        if (is_op(bn, "broadcast_to") && g.meta(other).shape == n.outputs[0].shape &&
            g.meta(b).shape == n.outputs[0].shape)
          n.inputs[static_cast<size_t>(k)] = bn.inputs[0];
      }
      continue;
    }
    if (n.outputs.size() == 1 && n.inputs.size() == 1) {
      const ValueRef x = n.inputs[0];
      const TensorMeta& in = g.meta(x);
      const TensorMeta& out = n.outputs[0];
      const ValueRef self{static_cast<int>(i), 0};
      const bool same = in.shape == out.shape && in.dtype == out.dtype;
      if (same && (op == "broadcast_to" || (op == "tile" && all_equal(n.attrs.get_ints("reps"), 1)) ||
                   (op == "pad" && all_equal(n.attrs.get_ints("paddings"), 0)) || op == "concat" || op == "split")) {
        replace_uses(g, self, x);
        continue;
      }
      const bool to_view =
          in.dtype == out.dtype && in.shape.numel() == out.shape.numel() &&
          (op == "stack" || (op == "transpose" && moves_only_unit_dims(in.shape, n.attrs.get_ints("perm", {}))) ||
           ((op == "sum" || op == "mean" || op == "max" || op == "min" || op == "prod") &&
            reduces_only_unit_dims(in.shape, n.attrs.get_ints("axes", {}))));
      if (to_view) {
        n.op = &reshape;
        n.attrs = Attrs{{"shape", out.shape.vec()}};
      }
    }
  }
}

}  // namespace kiln::graph
