#pragma once
// Helpers the rewriting passes share (internal to src/graph/passes/).
#include <map>

#include "kiln/graph/graph.h"

namespace kiln::graph::pass_util {

inline bool is_op(const Node& n, const char* name) { return n.kind == NodeKind::kOp && n.op->name == name; }

// How many times each value is read: by node inputs, graph outputs and assignments.
inline std::map<ValueRef, int> count_uses(const Graph& g) {
  std::map<ValueRef, int> uses;
  for (const Node& n : g.nodes)
    for (ValueRef v : n.inputs) ++uses[v];
  for (ValueRef v : g.outputs) ++uses[v];
  for (const Assignment& a : g.assignments) ++uses[a.value];
  return uses;
}

}  // namespace kiln::graph::pass_util
