#pragma once
// Helpers shared by the graph tests.
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/graph/executor.h"
#include "kiln/graph/graph.h"

namespace kiln::testing {

// Runs `g` once on `in` with a fresh executor.
inline std::vector<Tensor> run(const graph::Graph& g, const std::vector<Tensor>& in) { return graph::Executor(g).run(in); }

}  // namespace kiln::testing
