#pragma once
// Fused ops that graph passes create (kiln/graph/passes.h); eager code does not call
// them. Not differentiable: graphs are differentiated before they are fused.
//   fused_matmul(a, b, bias)        activation(a @ b + bias)
//   fused_conv2d(x, w[, bias])      conv2d with a ReLU post-op (attr activation) and,
//       with attr max_pool = 2 (NHWC), a 2x2 max pool with stride 2 and no padding on
//       that: output [N, OH/2, OW/2, O], and with attr conv_output (even OH and OW) a
//       second output, the convolution's [N, OH, OW, O] (nn_conv.cc); or with attr
//       pool_mask (f32, even OH and OW) a second output u8 [N, OH/2, OW/2, O], what the
//       pool's gradient needs: each window's winning cell 0-3 (row-major; the first
//       maximum, or the first NaN), or 4 where the gradient stops (with the ReLU: the
//       maximum is not > 0)
//   max_pool2d_backward_mask(mask, dy)  that pool's gradient from the mask: dx
//       [N, OH, OW, O] holds dy at each winning cell, zeros elsewhere; attr bias_grad
//       as max_pool2d_backward's (nn_grad_ops.cc)
//   fused_conv2d_backward_filter(x, y, dp)  conv2d_backward_filter(x, dy) where dy is
//       max_pool2d_backward(y, dp) for a 2x2 pool with stride 2 (NHWC), zero where
//       y <= 0 with attr relu; attr bias_grad adds dy summed per channel as a second
//       output; attr pool_mask: input 1 is the pool's mask instead of y (no relu attr:
//       it is in the mask). dy is never written whole (nn_conv.cc; CPU kernel
//       conv_pool_backward_kernels.cc)
//   fused_elementwise(x0, x1, ...)  a chain or tree of f32 elementwise ops in one loop:
//       attrs ops = "exp,add,..." (one op per instruction) and args = two register
//       indices per instruction (-1 for the second of a unary op). Registers are the
//       inputs, then one per instruction; the last is the output. Every input has the
//       output's shape, one element, or the output's trailing dims (broadcast along
//       the leading ones, as a bias row; leading 1s allowed); the output's shape is
//       the inputs' broadcast shape. Each instruction computes exactly
//       what the op's own kernel computes (same expression, in f32).
#include <string>

#include "kiln/core/shape.h"

namespace kiln::ops {

// Whether fused_elementwise can run `op`; *binary tells its arity.
bool fusable_elementwise(const std::string& op, bool* binary);
// `in` broadcasts to `out` along leading dims only: rank at most out's and one
// element, or (leading 1s aside) out's trailing dims. Element i of the broadcast is in[i % in.numel()].
bool broadcasts_along_leading_dims(const Shape& in, const Shape& out);

}  // namespace kiln::ops
