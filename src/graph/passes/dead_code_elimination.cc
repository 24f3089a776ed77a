// Dead-code elimination: keeps the inputs and every node an output or an assignment
// depends on; renumbers the rest.
#include "kiln/graph/passes.h"

namespace kiln::graph {

void eliminate_dead_code(Graph& g) {
  const size_t n = g.nodes.size();
  const std::vector<bool> live = live_nodes(g);
  std::vector<int> remap(n, -1);
  std::vector<Node> kept;
  for (size_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    remap[i] = static_cast<int>(kept.size());
    kept.push_back(std::move(g.nodes[i]));
  }
  auto fix = [&](ValueRef& v) { v.node = remap[static_cast<size_t>(v.node)]; };
  for (Node& node : kept)
    for (ValueRef& v : node.inputs) fix(v);
  for (ValueRef& v : g.outputs) fix(v);
  for (Assignment& a : g.assignments) fix(a.value);
  g.nodes = std::move(kept);
}

}  // namespace kiln::graph
