#pragma once
// Fused ops that graph passes create (kiln/graph/passes.h); eager code does not call
// them. Not differentiable: graphs are differentiated before they are fused.
//   fused_matmul(a, b, bias)        activation(a @ b + bias)
//   fused_conv2d(x, w[, bias])      conv2d with a ReLU post-op (nn_conv.cc)
//   fused_elementwise(x0, x1, ...)  a chain or tree of f32 elementwise ops in one loop:
//       attrs ops = "exp,add,..." (one op per instruction) and args = two register
//       indices per instruction (-1 for the second of a unary op). Registers are the
//       inputs, then one per instruction; the last is the output. Every input has the
//       output's shape or one element (broadcast). Each instruction computes exactly
//       what the op's own kernel computes (same expression, in f32).
#include <string>

namespace kiln::ops {

// Whether fused_elementwise can run `op`; *binary tells its arity.
bool fusable_elementwise(const std::string& op, bool* binary);

}  // namespace kiln::ops
