#pragma once
// Backward (gradient) ops of the nn family that have no forward counterpart in
// kiln/ops/nn.h. conv2d's are there (conv2d_backward_data/_filter); these are the
// pooling ones. The vjps of the nn ops use them; they are public so that graph
// code and tests can call them directly.
//
// Attributes and errors are those of the forward op (see max_pool2d/avg_pool2d in
// kiln/ops/nn.h; the geometry is src/backends/common/nn_geometry.h), plus InvalidArgumentError when dy does
// not have the forward op's output shape or x's dtype.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/ops/nn.h"

namespace kiln::ops {

// Gradient of max_pool2d(x, ...) with respect to x, given dy (max_pool2d's output
// shape): each window passes its dy to the one input cell holding the window's
// maximum and dx sums what its cells receive. Ties go to the first maximal cell in
// row-major (top-to-bottom, then left-to-right) order within the window, as in
// TensorFlow and PyTorch; a window containing NaN passes dy to its first NaN.
// Padded cells never receive anything. Not differentiable itself (a tape stops
// here; max pooling's second derivative is zero almost everywhere in x, and the
// dy-linear part is not provided).
Tensor max_pool2d_backward(const Tensor& x, const Tensor& dy, const std::vector<int64_t>& ksize,
                           const std::vector<int64_t>& strides, const Padding& padding = "valid",
                           const std::string& data_format = "NHWC");

// Gradient of avg_pool2d with respect to its input of shape `input_shape`: each
// window spreads dy / (number of real, unpadded cells) over its real cells; dx sums
// what its cells receive. Linear in dy and the adjoint of avg_pool2d
// (<avg_pool2d(x), dy> == <x, avg_pool2d_backward(dy)>), which is its own vjp.
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& input_shape, const std::vector<int64_t>& ksize,
                           const std::vector<int64_t>& strides, const Padding& padding = "valid",
                           const std::string& data_format = "NHWC");

}  // namespace kiln::ops
