// Vjps of convolution and pooling. conv2d and its two backward ops are bilinear and
// adjoint to one another, so each one's vjp is another of the three (or conv2d);
// average pooling and its backward op are adjoint too.
#include <initializer_list>

#include "../op_util.h"
#include "grad_util.h"
#include "kiln/core/op_def.h"
#include "backends/common/nn_geometry.h"

namespace kiln::ops::grad {
namespace {

using V = std::vector<Tensor>;
using detail::call1;

// `a` without the named attributes (the shape attrs of one backward op must not
// leak into the other's attrs).
Attrs without(const Attrs& a, std::initializer_list<const char*> drop) {
  Attrs r;
  for (const auto& [name, value] : a.items()) {
    bool keep = true;
    for (const char* d : drop) keep = keep && name != d;
    if (keep) r.set(name, value);
  }
  return r;
}

Attrs with_shape(const Attrs& conv, const char* name, const Shape& s) {
  Attrs r = conv;
  r.set(name, s.vec());
  return r;
}

// Cotangents come in the output's dtype; be explicit for mixed-dtype callers.
Tensor as(const Tensor& g, const Tensor& like) { return ops::cast(g, like.dtype()); }

// ---- conv2d (x, w[, bias]) ------------------------------------------------------------

V conv2d_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  const Tensor g = as(c.cotangents[0], x);
  const Attrs& a = c.attrs;
  V r(c.inputs.size());
  if (c.needs(0)) r[0] = call1(KILN_OP("conv2d_backward_data"), {g, w}, with_shape(a, "input_shape", x.shape()));
  if (c.needs(1)) r[1] = call1(KILN_OP("conv2d_backward_filter"), {x, g}, with_shape(a, "filter_shape", w.shape()));
  if (c.inputs.size() == 3 && c.needs(2)) {
    const bool nchw = nn_geometry::parse_data_format("conv2d", a);
    r[2] = ops::sum(g, nchw ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{0, 1, 2});
  }
  return r;
}

// dx = B(dy, w): <B(dy, w), g> = <conv2d(g, w), dy> = <g, ...>, so
// d/d(dy) = conv2d(g, w) and d/dw = conv2d_backward_filter(g, dy).
V conv2d_backward_data_vjp(const VjpContext& c) {
  const Tensor &dy = c.inputs[0], &w = c.inputs[1];
  const Tensor g = as(c.cotangents[0], dy);
  const Attrs a = without(c.attrs, {"input_shape"});
  V r(2);
  if (c.needs(0)) r[0] = call1(KILN_OP("conv2d"), {g, w}, a);
  if (c.needs(1)) r[1] = call1(KILN_OP("conv2d_backward_filter"), {g, dy}, with_shape(a, "filter_shape", w.shape()));
  return r;
}

// dw = F(x, dy): <F(x, dy), g> = <conv2d(x, g), dy> = <x, B(dy, g)>.
V conv2d_backward_filter_vjp(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &dy = c.inputs[1];
  const Tensor g = as(c.cotangents[0], x);
  const Attrs a = without(c.attrs, {"filter_shape"});
  V r(2);
  if (c.needs(0)) r[0] = call1(KILN_OP("conv2d_backward_data"), {dy, g}, with_shape(a, "input_shape", x.shape()));
  if (c.needs(1)) r[1] = call1(KILN_OP("conv2d"), {x, g}, a);
  return r;
}

// ---- pooling --------------------------------------------------------------------------

V max_pool2d_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {call1(KILN_OP("max_pool2d_backward"), {x, as(c.cotangents[0], x)}, c.attrs)};
}

V avg_pool2d_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {
      call1(KILN_OP("avg_pool2d_backward"), {as(c.cotangents[0], x)}, with_shape(c.attrs, "input_shape", x.shape()))};
}

V avg_pool2d_backward_vjp(const VjpContext& c) {
  return {call1(KILN_OP("avg_pool2d"), {as(c.cotangents[0], c.inputs[0])}, without(c.attrs, {"input_shape"}))};
}

// g [N, C] (or keepdims) as [N, 1, 1, C] / [N, C, 1, 1].
Tensor kept(const Tensor& g, const Tensor& x, bool nchw) {
  const int64_t n = x.dim(0), ch = nchw ? x.dim(1) : x.dim(3);
  return ops::reshape(g, nchw ? std::vector<int64_t>{n, ch, 1, 1} : std::vector<int64_t>{n, 1, 1, ch});
}

V global_avg_pool2d_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const bool nchw = nn_geometry::parse_data_format("global_avg_pool2d", c.attrs);
  const int64_t hw = nchw ? x.dim(2) * x.dim(3) : x.dim(1) * x.dim(2);
  if (x.numel() == 0) return {ops::zeros_like(x)};
  Tensor g = ops::mul(kept(as(c.cotangents[0], x), x, nchw), scalar_like(x, 1.0 / static_cast<double>(hw)));
  return {ops::broadcast_to(g, x.shape().vec())};
}

// The whole plane is one max-pooling window: the gradient goes to the first maximum
// in row-major order (like max_pool2d; not split between ties).
V global_max_pool2d_vjp(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const bool nchw = nn_geometry::parse_data_format("global_max_pool2d", c.attrs);
  if (x.numel() == 0) return {ops::zeros_like(x)};
  const int64_t h = nchw ? x.dim(2) : x.dim(1), w = nchw ? x.dim(3) : x.dim(2);
  Attrs a{{"ksize", std::vector<int64_t>{h, w}},
          {"strides", std::vector<int64_t>{1, 1}},
          {"padding", std::string("valid")},
          {"data_format", std::string(nchw ? "NCHW" : "NHWC")}};
  return {call1(KILN_OP("max_pool2d_backward"), {x, kept(as(c.cotangents[0], x), x, nchw)}, a)};
}

KILN_REGISTER_VJP("conv2d", conv2d_vjp);
KILN_REGISTER_VJP("conv2d_backward_data", conv2d_backward_data_vjp);
KILN_REGISTER_VJP("conv2d_backward_filter", conv2d_backward_filter_vjp);
KILN_REGISTER_VJP("max_pool2d", max_pool2d_vjp);
KILN_REGISTER_VJP("avg_pool2d", avg_pool2d_vjp);
KILN_REGISTER_VJP("avg_pool2d_backward", avg_pool2d_backward_vjp);
KILN_REGISTER_VJP("global_avg_pool2d", global_avg_pool2d_vjp);
KILN_REGISTER_VJP("global_max_pool2d", global_max_pool2d_vjp);

}  // namespace
}  // namespace kiln::ops::grad
