#pragma once
// The graph IR: what kiln::function traces a computation into (function.h), what the
// passes rewrite (passes.h) and what the executor runs (executor.h).
//
// A Graph is a list of nodes in a topological order (every node's inputs come from
// earlier nodes). A node is one of:
//   - an input (argument `input_index` of the function),
//   - a constant (a tensor captured by value at trace time),
//   - a variable read (a Variable captured by reference: its value at run time),
//   - an op (an OpDef from the registry with its attrs; one entry per output).
// Values are (node, output index) pairs. `outputs` are the function's results;
// `assignments` are its side effects on variables (optimizer updates, batch-norm
// statistics), applied in order after every output is computed; a variable read
// after an assignment in the traced code reads the assigned value directly, so the
// order is explicit in the data flow.
//
// Shapes are those of the trace (concrete); the executor re-infers them for calls
// whose input shapes differ in dimensions the signature leaves unknown.
//
// Thread-safety: a Graph is a value; concurrent reads are safe.
#include <string>
#include <vector>

#include "kiln/autodiff/variable.h"
#include "kiln/core/op_def.h"

namespace kiln::graph {

struct ValueRef {
  int node = -1;
  int index = 0;
  bool operator==(const ValueRef&) const = default;
  bool operator<(const ValueRef& o) const { return node != o.node ? node < o.node : index < o.index; }
};

enum class NodeKind : uint8_t { kInput, kConstant, kVariable, kOp };

struct Node {
  NodeKind kind = NodeKind::kOp;
  const OpDef* op = nullptr;  // kOp
  Attrs attrs;                // kOp
  std::vector<ValueRef> inputs;
  std::vector<TensorMeta> outputs;  // one per output (inputs, constants, variables: one)
  int input_index = -1;             // kInput
  Tensor constant;                  // kConstant
  Variable variable;                // kVariable
  std::string name;                 // kConstant: its weight name in a model package (may be empty)
  std::string label() const;        // "matmul", "input 0", "const f32[3]", "var dense/kernel"
  // A random op that draws fresh numbers on every run (OpDef::redraw; not one the
  // caller seeded): passes must not fold, merge or duplicate it.
  bool stateful() const { return kind == NodeKind::kOp && op->redraw && !attrs.get_bool("seeded", false); }
};

struct Assignment {
  Variable variable;
  ValueRef value;
};

class Graph {
 public:
  std::vector<Node> nodes;
  std::vector<ValueRef> outputs;
  std::vector<Assignment> assignments;
  int num_inputs = 0;

  int add(Node n);
  const TensorMeta& meta(ValueRef v) const { return nodes.at(v.node).outputs.at(v.index); }
  // Op nodes, in total or of one op.
  int count_ops() const;
  int count_ops(const std::string& op) const;
  // Throws InternalError naming the node when an input refers forward or out of range.
  void check() const;
  // One line per node: "%3 = add(%1:0, %2:0) {..} -> f32[4]"; then outputs and assignments.
  std::string str() const;
  // Graphviz DOT.
  std::string dot() const;
};

}  // namespace kiln::graph
