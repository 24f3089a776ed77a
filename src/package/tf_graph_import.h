#pragma once
// TensorFlow graphs -> kiln graphs (the SavedModel importer's core, tf_saved_model.cc).
//
// A TensorFlow graph is evaluated node by node with kiln's eager ops under
// kiln::graph::trace, so the traced graph is kiln's own IR (the ops validate their
// arguments and infer shapes as they do for any kiln program). Function calls
// (StatefulPartitionedCall, PartitionedCall, or a node whose op is a library function)
// are inlined; variable handles (VarHandleOp) read the bundle's tensors as constants;
// control edges are dropped (an inference graph's only side effects are variable
// reads); Shape and the integer arithmetic on it run on the host at trace time.
// What depends on an open dimension (the batch) is found by tracing twice with
// different sizes for the open dimensions: a reshape whose target differs becomes -1 in
// that place; any other difference is an UnimplementedError.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"
#include "kiln/graph/graph.h"
#include "tensorflow/core/framework/graph.pb.h"

namespace kiln::tf {

// The value of a VarHandleOp of the top-level graph (by node name): the variable's
// tensor, read once.
using VariableResolver = std::function<Tensor(const tensorflow::NodeDef& handle)>;

struct GraphInput {
  std::string node;  // the Placeholder's name
  TensorSpec spec;   // -1: open
};

// Every op (with the names of the nodes that use it) reachable from `outputs` ("node"
// or "node:index" of the top-level graph) that the importer cannot map, through the
// functions they call. Empty: the graph can be imported. Throws DataLossError for a
// call of a function the library lacks.
std::map<std::string, std::set<std::string>> unsupported_ops(const tensorflow::GraphDef& graph,
                                                             const std::vector<std::string>& outputs);

// The kiln graph computing `outputs` from `inputs` (graph inputs in that order).
// Throws UnimplementedError listing every unsupported op, or naming a node whose shape
// logic depends on an open dimension in a way kiln cannot express; InvalidArgumentError
// naming the TF node whose kiln op rejected its arguments; DataLossError for a graph
// that refers to missing nodes, functions or outputs.
graph::Graph import_graph(const tensorflow::GraphDef& graph, const std::vector<GraphInput>& inputs,
                          const std::vector<std::string>& outputs, const VariableResolver& variables);

}  // namespace kiln::tf
