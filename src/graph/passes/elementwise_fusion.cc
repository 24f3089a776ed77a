// Elementwise fusion: a tree of f32 elementwise ops of one shape (kiln/ops/fused.h
// lists them) whose intermediate values have no reader outside the tree becomes one
// fused_elementwise node, which runs the tree as a program over L1-sized blocks: one
// pass over memory and one dispatch instead of one per op. Inputs of the tree may be
// of the output's shape, single elements (scalar constants) or broadcast along leading
// dims (a bias row, a per-channel scale in NHWC).
//
// Grouping: from the last node backwards, a fusable node not yet in a group roots a
// new one; producers are taken highest index first, and one joins when it is fusable,
// has the root's shape, is not a graph output or assignment, and every reader of its
// value is already in the group. The root becomes the fused node; the absorbed nodes
// lose their last reader and go to dead-code elimination.
#include <map>
#include <queue>
#include <set>

#include "kiln/core/op_def.h"
#include "kiln/graph/passes.h"
#include "kiln/ops/fused.h"

namespace kiln::graph {
namespace {

constexpr size_t kMaxOps = 32;  // bounds the kernel's per-thread scratch (a block per op)

bool fusable(const Graph& g, const Node& n) {
  bool binary = false;
  if (n.kind != NodeKind::kOp || n.outputs.size() != 1 || n.stateful() || !ops::fusable_elementwise(n.op->name, &binary))
    return false;
  const TensorMeta& out = n.outputs[0];
  if (out.dtype != DType::kF32 || n.inputs.size() != (binary ? 2u : 1u)) return false;
  for (ValueRef v : n.inputs) {
    const TensorMeta& m = g.meta(v);
    if (m.dtype != DType::kF32 || (m.shape != out.shape && !ops::broadcasts_along_leading_dims(m.shape, out.shape)))
      return false;
  }
  return true;
}

}  // namespace

void fuse_elementwise(Graph& g) {
  const size_t n = g.nodes.size();
  std::map<ValueRef, std::vector<int>> readers;  // op readers of each value (with repeats)
  for (size_t i = 0; i < n; ++i)
    for (ValueRef v : g.nodes[i].inputs) readers[v].push_back(static_cast<int>(i));
  std::set<ValueRef> escapes;  // graph outputs and assigned values
  for (ValueRef v : g.outputs) escapes.insert(v);
  for (const Assignment& a : g.assignments) escapes.insert(a.value);
  std::vector<bool> taken(n, false);
  const OpDef& fused = OpRegistry::global().get("fused_elementwise");

  for (size_t root = n; root-- > 0;) {
    if (taken[root] || !fusable(g, g.nodes[root])) continue;
    const Shape& shape = g.nodes[root].outputs[0].shape;
    std::set<int> group{static_cast<int>(root)};
    std::priority_queue<int> pending;  // producers to consider, highest index first
    auto push_producers = [&](int i) {
      for (ValueRef v : g.nodes[static_cast<size_t>(i)].inputs) pending.push(v.node);
    };
    push_producers(static_cast<int>(root));
    while (!pending.empty() && group.size() < kMaxOps) {
      const int p = pending.top();
      pending.pop();
      if (group.count(p) || taken[static_cast<size_t>(p)]) continue;
      const Node& pn = g.nodes[static_cast<size_t>(p)];
      const ValueRef pv{p, 0};
      if (!fusable(g, pn) || pn.outputs[0].shape != shape || escapes.count(pv)) continue;
      bool inside = true;
      for (int r : readers[pv]) inside = inside && group.count(r);
      if (!inside) continue;
      group.insert(p);
      push_producers(p);
    }
    if (group.size() < 2) continue;

    // Registers: the group's outside inputs, then one per member in node order.
    std::map<ValueRef, int> reg;
    std::vector<ValueRef> inputs;
    for (int m : group)
      for (ValueRef v : g.nodes[static_cast<size_t>(m)].inputs)
        if (!group.count(v.node) && !reg.count(v)) {
          reg[v] = static_cast<int>(inputs.size());
          inputs.push_back(v);
        }
    std::string ops;
    std::vector<int64_t> args;
    int next = static_cast<int>(inputs.size());
    for (int m : group) {
      const Node& mn = g.nodes[static_cast<size_t>(m)];
      ops += (ops.empty() ? "" : ",") + mn.op->name;
      args.push_back(reg.at(mn.inputs[0]));
      args.push_back(mn.inputs.size() > 1 ? reg.at(mn.inputs[1]) : -1);
      reg[{m, 0}] = next++;
    }
    for (int m : group) taken[static_cast<size_t>(m)] = true;
    Node& r = g.nodes[root];
    r.op = &fused;
    r.inputs = std::move(inputs);
    r.attrs = Attrs{{"ops", ops}, {"args", args}};
  }
}

}  // namespace kiln::graph
