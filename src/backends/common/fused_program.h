#pragma once
// The program of a fused_elementwise node as every backend reads it (internal,
// header-only; kiln/ops/fused.h defines the encoding): attr ops = "exp,add,..." and
// args = two register indices per instruction (-1 for a unary op's second).
#include <string>
#include <vector>

#include "kiln/core/attrs.h"

namespace kiln::backends {

struct FusedStep {
  std::string op;
  int a, b;
};

inline std::vector<FusedStep> fused_program(const Attrs& attrs) {
  const std::string& ops = attrs.get_string("ops");
  const std::vector<int64_t>& args = attrs.get_ints("args");
  std::vector<FusedStep> prog;
  size_t start = 0;
  for (size_t i = 0; i <= ops.size(); ++i)
    if (i == ops.size() || ops[i] == ',') {
      const size_t k = prog.size();
      prog.push_back({ops.substr(start, i - start), static_cast<int>(args[2 * k]), static_cast<int>(args[2 * k + 1])});
      start = i + 1;
    }
  return prog;
}

}  // namespace kiln::backends
