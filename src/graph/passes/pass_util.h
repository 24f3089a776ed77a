#pragma once
// Helpers the rewriting passes share (internal to src/graph/passes/).
#include "kiln/core/dispatch.h"
#include "kiln/graph/passes.h"

namespace kiln::graph::pass_util {

inline bool is_op(const Node& n, const char* name) { return n.kind == NodeKind::kOp && n.op->name == name; }

// Whether a node strictly between `from` and `to` reads v: a node put in `to`'s place
// that redefines v for its readers would then come after one of them.
inline bool read_between(const Graph& g, ValueRef v, size_t from, size_t to) {
  for (size_t j = from + 1; j < to; ++j)
    for (ValueRef in : g.nodes[j].inputs)
      if (in == v) return true;
  return false;
}

// While alive, ops run by a pass (folding, new constants) are compile-time work: no
// enclosing trace or tape records them.
class Untraced {
 public:
  Untraced() : prev_(set_op_observer(nullptr)) {}
  ~Untraced() { set_op_observer(prev_); }
  Untraced(const Untraced&) = delete;
  Untraced& operator=(const Untraced&) = delete;

 private:
  OpObserver* prev_;
};

// Inserts a constant node before node `pos`; every reference to a node at or after
// `pos` moves up by one.
inline ValueRef insert_constant(Graph& g, int pos, Tensor value) {
  auto shift = [&](ValueRef& v) {
    if (v.node >= pos) ++v.node;
  };
  for (Node& n : g.nodes)
    for (ValueRef& v : n.inputs) shift(v);
  for (ValueRef& v : g.outputs) shift(v);
  for (Assignment& a : g.assignments) shift(a.value);
  Node c;
  c.kind = NodeKind::kConstant;
  c.outputs = {{value.shape(), value.dtype()}};
  c.constant = std::move(value);
  g.nodes.insert(g.nodes.begin() + pos, std::move(c));
  return {pos, 0};
}

}  // namespace kiln::graph::pass_util
