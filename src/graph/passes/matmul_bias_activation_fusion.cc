// Fusion: matmul(x, w) -> add(., bias) [-> relu] becomes one fused_matmul node (one
// oneDNN call with the bias and the ReLU as post-ops) when the intermediates have no
// other reader (f32, rank-2 operands, a rank-1 bias of the output's width); and
// conv2d(x, w[, bias]) -> relu becomes fused_conv2d (a ReLU post-op).
#include <map>

#include "kiln/core/op_def.h"
#include "kiln/graph/passes.h"
#include "pass_util.h"

namespace kiln::graph {

using pass_util::is_op;

void fuse_matmul_bias_activation(Graph& g) {
  std::map<ValueRef, int> uses = count_uses(g);
  std::map<ValueRef, int> reader;  // the single op reader of a value, if any
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueRef v : g.nodes[i].inputs) reader[v] = static_cast<int>(i);
  const OpDef& fused = OpRegistry::global().get("fused_matmul");

  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& mm = g.nodes[i];
    if (!is_op(mm, "matmul") || mm.outputs[0].dtype != DType::kF32 || mm.outputs[0].shape.rank() != 2) continue;
    if (g.meta(mm.inputs[0]).shape.rank() != 2 || g.meta(mm.inputs[1]).shape.rank() != 2) continue;
    const ValueRef mv{static_cast<int>(i), 0};
    if (uses[mv] != 1 || !reader.count(mv)) continue;
    Node& add = g.nodes[static_cast<size_t>(reader[mv])];
    if (!is_op(add, "add") || add.outputs[0].shape != mm.outputs[0].shape) continue;
    const ValueRef bias = add.inputs[0] == mv ? add.inputs[1] : add.inputs[0];
    const TensorMeta& bm = g.meta(bias);
    if (bm.dtype != DType::kF32 || bm.shape.rank() != 1 || bm.shape[0] != mm.outputs[0].shape[1]) continue;
    // Absorb a ReLU that is the only reader of the sum.
    const ValueRef av{reader[mv], 0};
    Node* target = &add;
    std::string activation;
    if (uses[av] == 1 && reader.count(av) && is_op(g.nodes[static_cast<size_t>(reader[av])], "relu")) {
      target = &g.nodes[static_cast<size_t>(reader[av])];
      activation = "relu";
    }
    // The fused node takes the place of the last node it replaces (its inputs all come
    // earlier); the matmul and the add are left for dead-code elimination.
    Node f;
    f.kind = NodeKind::kOp;
    f.op = &fused;
    f.inputs = {mm.inputs[0], mm.inputs[1], bias};
    f.attrs.set("transpose_a", mm.attrs.get_bool("transpose_a", false));
    f.attrs.set("transpose_b", mm.attrs.get_bool("transpose_b", false));
    f.attrs.set("activation", activation);
    f.outputs = target->outputs;
    *target = std::move(f);
    uses[mv] = 0;
  }

  // conv2d (+ its bias input) -> relu, the ReLU the conv's only reader.
  const OpDef& fused_conv = OpRegistry::global().get("fused_conv2d");
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& conv = g.nodes[i];
    if (!is_op(conv, "conv2d") || conv.outputs[0].dtype != DType::kF32) continue;
    const ValueRef cv{static_cast<int>(i), 0};
    if (uses[cv] != 1 || !reader.count(cv)) continue;
    Node& relu = g.nodes[static_cast<size_t>(reader[cv])];
    if (!is_op(relu, "relu")) continue;
    Node f;
    f.kind = NodeKind::kOp;
    f.op = &fused_conv;
    f.inputs = conv.inputs;
    f.attrs = conv.attrs;
    f.attrs.set("activation", std::string("relu"));
    f.outputs = relu.outputs;
    relu = std::move(f);
    uses[cv] = 0;
  }
}

}  // namespace kiln::graph
