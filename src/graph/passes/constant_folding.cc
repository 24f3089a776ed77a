// Constant folding: an op node whose inputs are all constants (or that has none) is
// computed once, now, with the eager kernels, and becomes a constant. Outputs over
// 64 MiB are left alone (they would bloat the graph), and so are random ops that draw
// new numbers each run.
#include "kiln/core/dispatch.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/passes.h"
#include "pass_util.h"

namespace kiln::graph {

void fold_constants(Graph& g) {
  constexpr size_t kMaxBytes = size_t{64} << 20;
  for (Node& n : g.nodes) {
    if (n.kind != NodeKind::kOp || n.outputs.size() != 1 || n.stateful()) continue;
    bool all_const = true;
    for (ValueRef v : n.inputs) all_const = all_const && g.nodes[static_cast<size_t>(v.node)].kind == NodeKind::kConstant;
    const TensorMeta& m = n.outputs[0];
    if (!all_const || static_cast<size_t>(m.shape.numel()) * dtype_size(m.dtype) > kMaxBytes) continue;
    std::vector<Tensor> in;
    for (ValueRef v : n.inputs) in.push_back(g.nodes[static_cast<size_t>(v.node)].constant);
    Tensor value;
    {
      pass_util::Untraced compile_time;
      value = call_op1(*n.op, in, n.attrs);
    }
    n.kind = NodeKind::kConstant;
    n.constant = value;
    n.inputs.clear();
    n.op = nullptr;
    n.attrs = Attrs();
  }
}

}  // namespace kiln::graph
