// Fusion: relu_grad(max_pool2d_backward(x, dy), x) -> max_pool2d_backward(x, dy) with
// attr relu (one pass over dx instead of two). The pattern is a training graph's
// backward through relu -> max_pool2d: x is the ReLU's output, which both gradients
// read. The max_pool2d_backward must have no other live reader; it is left for dead-code
// elimination. Level 2, before elementwise fusion (which would absorb the relu_grad).
#include <map>

#include "kiln/graph/passes.h"
#include "pass_util.h"

namespace kiln::graph {

void fuse_pool_backward_relu(Graph& g) {
  using pass_util::is_op;
  std::map<ValueRef, int> uses = count_live_uses(g);  // a dead reader does not block it
  for (Node& r : g.nodes) {
    if (!is_op(r, "relu_grad") || r.inputs.size() != 2) continue;
    const ValueRef pv = r.inputs[0];
    const Node& pool = g.nodes[static_cast<size_t>(pv.node)];
    if (!is_op(pool, "max_pool2d_backward") || uses[pv] != 1 || pool.inputs[0] != r.inputs[1] ||
        pool.attrs.get_bool("relu", false) || pool.outputs[0].shape != r.outputs[0].shape ||
        pool.outputs[0].dtype != r.outputs[0].dtype)
      continue;
    Node fused = pool;
    fused.attrs.set("relu", true);
    r = std::move(fused);  // in the relu_grad's place: every input comes earlier
  }
}

}  // namespace kiln::graph
