// Common-subexpression elimination: an op node with the same op, attrs and inputs as
// an earlier one, or a small constant equal to an earlier one, is replaced by it (the
// duplicate is left for dead-code elimination). Random ops that draw each run are
// never merged.
#include <cstring>
#include <map>

#include "kiln/graph/passes.h"

namespace kiln::graph {

void eliminate_common_subexpressions(Graph& g) {
  std::map<std::string, int> seen;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::string key;
    if (n.stateful()) {
      continue;
    } else if (n.kind == NodeKind::kOp) {
      key = "op|" + n.op->name + "|" + n.attrs.str();
      for (ValueRef v : n.inputs) key += "|" + std::to_string(v.node) + ":" + std::to_string(v.index);
    } else if (n.kind == NodeKind::kConstant && n.constant.numel() <= 64) {
      const Tensor c = n.constant.to(Device::cpu());  // bytes read on the host
      key = "const|" + n.constant.device().str() + "|" + std::string(dtype_name(c.dtype())) + c.shape().str() + "|" +
            std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
    } else {
      continue;
    }
    auto [it, fresh] = seen.emplace(key, static_cast<int>(i));
    if (fresh) continue;
    for (size_t k = 0; k < n.outputs.size(); ++k)
      replace_uses(g, {static_cast<int>(i), static_cast<int>(k)}, {it->second, static_cast<int>(k)});
  }
}

}  // namespace kiln::graph
