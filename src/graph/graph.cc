#include "kiln/graph/graph.h"

#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/tensor_spec.h"

namespace kiln::graph {
namespace {
std::string meta_str(const TensorMeta& m) { return std::string(dtype_name(m.dtype)) + m.shape.str(); }
std::string ref_str(ValueRef v) { return "%" + std::to_string(v.node) + ":" + std::to_string(v.index); }
}  // namespace

std::string Node::label() const {
  switch (kind) {
    case NodeKind::kInput: return "input " + std::to_string(input_index);
    case NodeKind::kConstant: return "const " + meta_str(outputs.at(0));
    case NodeKind::kVariable: return "var " + variable.name();
    case NodeKind::kOp: return op->name;
  }
  return "?";
}

int Graph::add(Node n) {
  nodes.push_back(std::move(n));
  return static_cast<int>(nodes.size()) - 1;
}

int Graph::count_ops() const {
  int c = 0;
  for (const Node& n : nodes) c += n.kind == NodeKind::kOp;
  return c;
}

int Graph::count_ops(const std::string& op) const {
  int c = 0;
  for (const Node& n : nodes) c += n.kind == NodeKind::kOp && n.op->name == op;
  return c;
}

void Graph::check() const {
  auto bad = [&](int i, const std::string& why) {
    throw InternalError("graph: node %" + std::to_string(i) + " (" + nodes[static_cast<size_t>(i)].label() +
                        "): " + why);
  };
  auto valid = [&](ValueRef v, int before) {
    return v.node >= 0 && v.node < before && v.index >= 0 &&
           v.index < static_cast<int>(nodes[static_cast<size_t>(v.node)].outputs.size());
  };
  const int n = static_cast<int>(nodes.size());
  for (int i = 0; i < n; ++i) {
    const Node& node = nodes[static_cast<size_t>(i)];
    if (node.kind == NodeKind::kOp && !node.op) bad(i, "op node without an op");
    for (ValueRef in : node.inputs)
      if (!valid(in, i)) bad(i, "input " + ref_str(in) + " is not an earlier value");
  }
  for (ValueRef o : outputs)
    if (!valid(o, n)) throw InternalError("graph: output " + ref_str(o) + " does not exist");
  for (const Assignment& a : assignments)
    if (!valid(a.value, n)) throw InternalError("graph: assignment of " + a.variable.name() + " reads a bad value");
}

std::string Graph::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    os << "%" << i << " = " << n.label();
    if (n.kind == NodeKind::kOp) {
      os << "(";
      for (size_t j = 0; j < n.inputs.size(); ++j) os << (j ? ", " : "") << ref_str(n.inputs[j]);
      os << ")";
      if (!n.attrs.items().empty()) os << " " << n.attrs.str();
    }
    os << " ->";
    for (const TensorMeta& m : n.outputs) os << " " << meta_str(m);
    os << "\n";
  }
  os << "outputs:";
  for (ValueRef o : outputs) os << " " << ref_str(o);
  os << "\n";
  for (const Assignment& a : assignments) os << "assign " << a.variable.name() << " := " << ref_str(a.value) << "\n";
  return os.str();
}

std::string Graph::dot() const {
  std::ostringstream os;
  os << "digraph kiln {\n  node [shape=box, fontname=\"monospace\"];\n";
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const char* style = n.kind == NodeKind::kOp ? "" : ", style=filled, fillcolor=lightgrey";
    os << "  n" << i << " [label=\"%" << i << " " << n.label() << "\\n" << meta_str(n.outputs.at(0)) << "\"" << style
       << "];\n";
    for (ValueRef in : n.inputs) os << "  n" << in.node << " -> n" << i << ";\n";
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    os << "  out" << k << " [label=\"output " << k << "\", shape=oval];\n";
    os << "  n" << outputs[k].node << " -> out" << k << ";\n";
  }
  for (const Assignment& a : assignments) {
    os << "  \"" << a.variable.name() << "\" [shape=oval];\n";
    os << "  n" << a.value.node << " -> \"" << a.variable.name() << "\" [style=dashed];\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace kiln::graph
