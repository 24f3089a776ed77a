// The pass pipeline: the ordered list, levels, dumps.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/core/flags.h"
#include "kiln/graph/auto_mixed_precision.h"
#include "kiln/graph/passes.h"

namespace kiln::graph {

const std::vector<Pass>& passes() {
  // Order: fold and simplify first (they expose duplicates and dead nodes), then
  // merge duplicates, then drop what nothing reads.
  // Passes that need no options take the graph alone.
#define KILN_PASS(fn) [](Graph& g, const PassOptions&) { fn(g); }
  static const std::vector<Pass> kPasses = {
      {"constant_folding", 1, KILN_PASS(fold_constants)},
      {"shape_simplification", 1, KILN_PASS(simplify_shapes)},
      {"algebraic_simplification", 1, KILN_PASS(simplify_algebra)},
      {"common_subexpression_elimination", 1, KILN_PASS(eliminate_common_subexpressions)},
      {"conv_batch_norm_folding", 2, KILN_PASS(fold_conv_batch_norm)},
      {"normalization_pattern_fusion", 2, KILN_PASS(fuse_normalization_patterns)},
      // Only when PassOptions::auto_mixed_precision asks (kiln/graph/auto_mixed_precision.h);
      // before the fusions, whose fused kernels are f32.
      {"auto_mixed_precision", 2,
       [](Graph& g, const PassOptions& o) {
         if (o.auto_mixed_precision != DType::kF32) auto_mixed_precision(g, o.auto_mixed_precision);
       }},
      {"matmul_bias_activation_fusion", 2, KILN_PASS(fuse_matmul_bias_activation)},
      {"pool_backward_relu_fusion", 2, KILN_PASS(fuse_pool_backward_relu)},
      {"pool_backward_bias_fusion", 2, KILN_PASS(fuse_pool_backward_bias)},
      {"pool_backward_filter_fusion", 2, KILN_PASS(fuse_pool_backward_filter)},
      {"conv_pool_fusion", 2, [](Graph& g, const PassOptions& o) { fuse_conv_pool(g, o.pool_mask); }},
      {"elementwise_fusion", 2, KILN_PASS(fuse_elementwise)},
      {"dead_code_elimination", 1, KILN_PASS(eliminate_dead_code)},
  };
#undef KILN_PASS
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

void optimize(Graph& g, const PassOptions& options) {
  const std::string& dump_dir = options.dump_dir.empty() ? flags().dump_graph : options.dump_dir;
  if (options.auto_mixed_precision != DType::kF32 && options.auto_mixed_precision != DType::kBF16 &&
      options.auto_mixed_precision != DType::kF16)
    throw InvalidArgumentError(detail::str_cat("PassOptions::auto_mixed_precision must be f32 (off), bf16 or f16, got ",
                                               dtype_name(options.auto_mixed_precision)));
  int step = 0;
  if (!dump_dir.empty()) dump(dump_dir, options.name, step++, "traced", g);
  for (const Pass& p : passes()) {
    if (p.level > options.level) continue;
    p.run(g, options);
    g.check();
    if (!dump_dir.empty()) dump(dump_dir, options.name, step++, p.name, g);
  }
}

}  // namespace kiln::graph
