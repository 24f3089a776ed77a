// The pass pipeline: the ordered list, levels, dumps.
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/graph/auto_mixed_precision.h"
#include "kiln/graph/passes.h"

namespace kiln::graph {

const std::vector<Pass>& passes() {
  // Order: fold and simplify first (they expose duplicates and dead nodes), then
  // merge duplicates, then drop what nothing reads.
  static const std::vector<Pass> kPasses = {
      {"constant_folding", 1, fold_constants},
      {"shape_simplification", 1, simplify_shapes},
      {"algebraic_simplification", 1, simplify_algebra},
      {"common_subexpression_elimination", 1, eliminate_common_subexpressions},
      {"conv_batch_norm_folding", 2, fold_conv_batch_norm},
      {"normalization_pattern_fusion", 2, fuse_normalization_patterns},
      // Only with KILN_AUTO_MIXED_PRECISION set (kiln/graph/auto_mixed_precision.h);
      // before the fusions, whose fused kernels are f32.
      {"auto_mixed_precision", 2, auto_mixed_precision_from_env},
      {"matmul_bias_activation_fusion", 2, fuse_matmul_bias_activation},
      {"pool_backward_relu_fusion", 2, fuse_pool_backward_relu},
      {"pool_backward_bias_fusion", 2, fuse_pool_backward_bias},
      {"pool_backward_filter_fusion", 2, fuse_pool_backward_filter},
      {"conv_pool_fusion", 2, fuse_conv_pool},
      {"elementwise_fusion", 2, fuse_elementwise},
      {"dead_code_elimination", 1, eliminate_dead_code},
  };
  return kPasses;
}

namespace {
std::map<ValueRef, int> uses_of(const Graph& g, const std::vector<bool>* live) {
  std::map<ValueRef, int> uses;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!live || (*live)[i])
      for (ValueRef v : g.nodes[i].inputs) ++uses[v];
  for (ValueRef v : g.outputs) ++uses[v];
  for (const Assignment& a : g.assignments) ++uses[a.value];
  return uses;
}
}  // namespace

std::map<ValueRef, int> count_uses(const Graph& g) { return uses_of(g, nullptr); }

std::map<ValueRef, int> count_live_uses(const Graph& g) {
  const std::vector<bool> live = live_nodes(g);
  return uses_of(g, &live);
}

std::vector<bool> live_nodes(const Graph& g) {
  const size_t n = g.nodes.size();
  std::vector<bool> live(n, false);
  for (ValueRef v : g.outputs) live[static_cast<size_t>(v.node)] = true;
  for (const Assignment& a : g.assignments) live[static_cast<size_t>(a.value.node)] = true;
  for (size_t i = n; i-- > 0;) {
    if (g.nodes[i].kind == NodeKind::kInput) live[i] = true;
    if (!live[i]) continue;
    for (ValueRef v : g.nodes[i].inputs) live[static_cast<size_t>(v.node)] = true;
  }
  return live;
}

void replace_uses(Graph& g, ValueRef from, ValueRef to) {
  for (Node& n : g.nodes)
    for (ValueRef& v : n.inputs)
      if (v == from) v = to;
  for (ValueRef& v : g.outputs)
    if (v == from) v = to;
  for (Assignment& a : g.assignments)
    if (a.value == from) a.value = to;
}

namespace {
void dump(const std::string& dir, const std::string& name, int step, const std::string& what, const Graph& g) {
  std::filesystem::create_directories(dir);
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, ".%02d-", step);
  const std::string base = (std::filesystem::path(dir) / (name + prefix + what)).string();
  std::ofstream(base + ".txt") << g.str();
  std::ofstream(base + ".dot") << g.dot();
}
}  // namespace

void optimize(Graph& g, int level, const std::string& name, std::string dump_dir) {
  if (dump_dir.empty())
    if (const char* env = std::getenv("KILN_DUMP_GRAPH")) dump_dir = env;
  int step = 0;
  if (!dump_dir.empty()) dump(dump_dir, name, step++, "traced", g);
  for (const Pass& p : passes()) {
    if (p.level > level) continue;
    p.run(g);
    g.check();
    if (!dump_dir.empty()) dump(dump_dir, name, step++, p.name, g);
  }
}

}  // namespace kiln::graph
