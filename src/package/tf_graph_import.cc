// TensorFlow graphs -> kiln graphs: an evaluator of GraphDefs over kiln's eager ops,
// run under kiln::graph::trace (tf_graph_import.h).
#include "tf_graph_import.h"

#include <cstring>

#include "kiln/core/error.h"
#include "kiln/graph/function.h"
#include "kiln/ops.h"
#include "tf_tensor_proto.h"
#include "tf_types.h"

namespace kiln::tf {
namespace {

using tensorflow::AttrValue;
using tensorflow::FunctionDef;
using tensorflow::NodeDef;

// One output of a TF node. A variable handle (VarHandleOp, or a resource argument of
// a function) carries the variable's value; ReadVariableOp unwraps it.
struct Value {
  Tensor t;
  bool resource = false;
};
using Values = std::vector<Value>;

// ---- node attributes ---------------------------------------------------------------

const AttrValue* find_attr(const NodeDef& n, const std::string& name) {
  auto it = n.attr().find(name);
  return it == n.attr().end() ? nullptr : &it->second;
}
std::string node_label(const NodeDef& n) { return "node '" + n.name() + "' (" + n.op() + ")"; }
int64_t attr_i(const NodeDef& n, const std::string& name, int64_t dflt) {
  const AttrValue* a = find_attr(n, name);
  return a && a->value_case() == AttrValue::kI ? a->i() : dflt;
}
double attr_f(const NodeDef& n, const std::string& name, double dflt) {
  const AttrValue* a = find_attr(n, name);
  return a && a->value_case() == AttrValue::kF ? a->f() : dflt;
}
bool attr_b(const NodeDef& n, const std::string& name, bool dflt) {
  const AttrValue* a = find_attr(n, name);
  return a && a->value_case() == AttrValue::kB ? a->b() : dflt;
}
std::string attr_s(const NodeDef& n, const std::string& name, const std::string& dflt) {
  const AttrValue* a = find_attr(n, name);
  return a && a->value_case() == AttrValue::kS ? a->s() : dflt;
}
std::vector<int64_t> attr_ints(const NodeDef& n, const std::string& name) {
  const AttrValue* a = find_attr(n, name);
  if (!a || a->value_case() != AttrValue::kList) return {};
  return {a->list().i().begin(), a->list().i().end()};
}
DType attr_type(const NodeDef& n, const std::string& name, DType dflt) {
  const AttrValue* a = find_attr(n, name);
  if (!a || a->value_case() != AttrValue::kType) return dflt;
  std::optional<DType> dt = from_tf_dtype(a->type());
  if (!dt)
    throw UnimplementedError(node_label(n) + ": attr '" + name + "' is " + tensorflow::DataType_Name(a->type()) +
                             ", which kiln has no tensors for");
  return *dt;
}

// ---- host values (shapes, axes, sizes: known while tracing) ------------------------

std::vector<int64_t> ints(const Value& v) { return v.t.to_vector<int64_t>(); }
int64_t int_scalar(const NodeDef& n, const Value& v, const char* what) {
  if (v.t.numel() != 1)
    throw InvalidArgumentError(node_label(n) + ": " + what + " must have one element, got " + v.t.desc());
  return v.t.to_vector<int64_t>()[0];
}
Tensor int_vector(const std::vector<int64_t>& v, DType dt) {
  Tensor t = Tensor::from_vector<int64_t>(v, Shape{static_cast<int64_t>(v.size())});
  return dt == DType::kI64 ? t : ops::cast(t, dt);
}

// ---- the op table ------------------------------------------------------------------

using OpFn = Values (*)(const NodeDef& n, const Values& in);

Values one(Tensor t) { return {Value{std::move(t)}}; }

template <Tensor (*F)(const Tensor&)>
Values unary(const NodeDef&, const Values& in) { return one(F(in[0].t)); }
template <Tensor (*F)(const Tensor&, const Tensor&)>
Values binary(const NodeDef&, const Values& in) { return one(F(in[0].t, in[1].t)); }

Values identity_n(const NodeDef&, const Values& in) {
  Values out;
  for (const Value& v : in) out.push_back(v);
  return out;
}

Values const_op(const NodeDef& n, const Values&) {
  const AttrValue* a = find_attr(n, "value");
  if (!a || a->value_case() != AttrValue::kTensor) throw DataLossError(node_label(n) + " has no tensor value");
  if (a->tensor().dtype() == tensorflow::DT_STRING)
    throw UnimplementedError(node_label(n) + " is a string constant (kiln has no string tensors)");
  return one(tensor_from_proto(a->tensor(), node_label(n)));
}

Values read_variable(const NodeDef& n, const Values& in) {
  if (!in[0].resource) throw InvalidArgumentError(node_label(n) + " reads something that is not a variable handle");
  return one(in[0].t);
}

Values resource_gather(const NodeDef& n, const Values& in) {
  if (!in[0].resource) throw InvalidArgumentError(node_label(n) + " gathers from something that is not a variable");
  return one(ops::gather(in[0].t, in[1].t, 0, attr_i(n, "batch_dims", 0)));
}

Values matmul(const NodeDef& n, const Values& in) {
  return one(ops::matmul(in[0].t, in[1].t, attr_b(n, "transpose_a", false), attr_b(n, "transpose_b", false)));
}
Values batch_matmul(const NodeDef& n, const Values& in) {
  return one(ops::matmul(in[0].t, in[1].t, attr_b(n, "adj_x", false), attr_b(n, "adj_y", false)));
}
Values einsum(const NodeDef& n, const Values& in) {
  std::vector<Tensor> xs;
  for (const Value& v : in) xs.push_back(v.t);
  return one(ops::einsum(attr_s(n, "equation", ""), xs));
}

// A per-channel vector [C] against x in data_format: NHWC/NDHWC broadcast as is,
// NCHW-like formats put C at axis 1.
Tensor channel_vector(const Tensor& v, const Tensor& x, const std::string& data_format) {
  if (data_format.size() < 2 || data_format[1] != 'C' || x.shape().rank() < 3) return v;
  std::vector<int64_t> dims(static_cast<size_t>(x.shape().rank() - 1), 1);
  dims[0] = -1;
  return ops::reshape(v, dims);
}
Values bias_add(const NodeDef& n, const Values& in) {
  return one(ops::add(in[0].t, channel_vector(in[1].t, in[0].t, attr_s(n, "data_format", "NHWC"))));
}

Tensor squared_difference(const Tensor& a, const Tensor& b) { return ops::square(ops::sub(a, b)); }
Tensor erfc(const Tensor& x) { return ops::sub(ops::scalar(1.0, x.dtype()), ops::erf(x)); }
Tensor softsign(const Tensor& x) { return ops::div(x, ops::add(ops::abs(x), ops::scalar(1.0, x.dtype()))); }
Tensor softmax_last(const Tensor& x) { return ops::softmax(x, -1); }
Tensor log_softmax_last(const Tensor& x) { return ops::log_softmax(x, -1); }
Tensor relu6(const Tensor& x) { return ops::relu6(x); }
Tensor elu(const Tensor& x) { return ops::elu(x, 1.0); }
Tensor selu(const Tensor& x) {
  return ops::mul(ops::scalar(1.0507009873554805, x.dtype()), ops::elu(x, 1.6732632423543772));
}
Tensor floor_div(const Tensor& a, const Tensor& b) { return ops::floor(ops::div(a, b)); }
Values leaky_relu(const NodeDef& n, const Values& in) {
  return one(ops::leaky_relu(in[0].t, attr_f(n, "alpha", 0.2)));
}
Values add_n(const NodeDef&, const Values& in) {
  Tensor s = in[0].t;
  for (size_t i = 1; i < in.size(); ++i) s = ops::add(s, in[i].t);
  return one(s);
}
Values clip_by_value(const NodeDef&, const Values& in) {
  return one(ops::minimum(ops::maximum(in[0].t, in[1].t), in[2].t));
}
Values cast(const NodeDef& n, const Values& in) { return one(ops::cast(in[0].t, attr_type(n, "DstT", DType::kF32))); }

// ---- convolution and pooling -------------------------------------------------------

// TF's per-dimension lists (strides, dilations, ksize: 4 entries in data_format
// order) -> kiln's {height, width}.
std::vector<int64_t> spatial(const NodeDef& n, const std::string& name, const std::string& fmt) {
  std::vector<int64_t> v = attr_ints(n, name);
  if (v.empty()) return {1, 1};
  if (v.size() != 4) throw InvalidArgumentError(node_label(n) + ": attr '" + name + "' must have 4 entries");
  const bool nchw = fmt == "NCHW";
  if (v[0] != 1 || v[nchw ? 1 : 3] != 1)
    throw UnimplementedError(node_label(n) + ": attr '" + name + "' moves over the batch or channel dimension");
  return nchw ? std::vector<int64_t>{v[2], v[3]} : std::vector<int64_t>{v[1], v[2]};
}
ops::Padding padding(const NodeDef& n, const std::string& fmt) {
  const std::string p = attr_s(n, "padding", "VALID");
  if (p == "SAME") return "same";
  if (p == "VALID") return "valid";
  if (p == "EXPLICIT") {
    std::vector<int64_t> e = attr_ints(n, "explicit_paddings");
    if (e.size() != 8) throw InvalidArgumentError(node_label(n) + ": explicit_paddings must have 8 entries");
    const size_t h = fmt == "NCHW" ? 4 : 2;
    return ops::Padding::explicit_pads({e[h], e[h + 1], e[h + 2], e[h + 3]});
  }
  throw UnimplementedError(node_label(n) + ": padding '" + p + "'");
}
std::string format_2d(const NodeDef& n) {
  const std::string f = attr_s(n, "data_format", "NHWC");
  if (f != "NHWC" && f != "NCHW") throw UnimplementedError(node_label(n) + ": data_format '" + f + "'");
  return f;
}
Values conv2d_impl(const NodeDef& n, const Tensor& x, Tensor w, bool depthwise) {
  const std::string fmt = format_2d(n);
  ops::Conv2dOptions o;
  o.strides = spatial(n, "strides", fmt);
  o.dilations = spatial(n, "dilations", fmt);
  o.padding = padding(n, fmt);
  o.data_format = fmt;
  if (x.shape().rank() != 4 || w.shape().rank() != 4)
    throw InvalidArgumentError(node_label(n) + ": input and filter must be rank 4, got " + x.desc() + " and " + w.desc());
  const int64_t c = x.shape().dim(fmt == "NCHW" ? 1 : 3);
  if (depthwise) {  // [KH, KW, C, m] -> HWIO [KH, KW, 1, C*m], one group per channel
    const Shape& s = w.shape();
    w = ops::reshape(w, {s.dim(0), s.dim(1), 1, s.dim(2) * s.dim(3)});
    o.groups = c;
  } else if (w.shape().dim(2) > 0 && c % w.shape().dim(2) == 0) {
    o.groups = c / w.shape().dim(2);
  }
  if (fmt == "NCHW") w = ops::transpose(w, {3, 2, 0, 1});  // HWIO -> OIHW
  return one(ops::conv2d(x, w, o));
}
Values conv2d(const NodeDef& n, const Values& in) { return conv2d_impl(n, in[0].t, in[1].t, false); }
Values depthwise_conv2d(const NodeDef& n, const Values& in) { return conv2d_impl(n, in[0].t, in[1].t, true); }
Values max_pool(const NodeDef& n, const Values& in) {
  const std::string fmt = format_2d(n);
  return one(ops::max_pool2d(in[0].t, spatial(n, "ksize", fmt), spatial(n, "strides", fmt), padding(n, fmt), fmt));
}
Values avg_pool(const NodeDef& n, const Values& in) {
  const std::string fmt = format_2d(n);
  return one(ops::avg_pool2d(in[0].t, spatial(n, "ksize", fmt), spatial(n, "strides", fmt), padding(n, fmt), fmt));
}
Values fused_batch_norm(const NodeDef& n, const Values& in) {
  const std::string fmt = attr_s(n, "data_format", "NHWC");
  const int64_t axis = fmt.size() >= 2 && fmt[1] == 'C' ? 1 : -1;
  const double eps = attr_f(n, "epsilon", 1e-3);
  if (attr_b(n, "is_training", true)) {
    // The batch's own statistics: what tf-keras 2's LayerNormalization exports (a
    // reshape to [1, N, ...] through fused_batch_norm). batch_variance is the biased one.
    ops::BatchNormTrainingResult r = ops::batch_norm_training(in[0].t, in[1].t, in[2].t, eps, axis);
    return {Value{r.y}, Value{r.mean}, Value{r.var}, Value{r.mean}, Value{r.var}, Value{r.mean}};
  }
  Tensor y = ops::batch_norm_inference(in[0].t, in[3].t, in[4].t, in[1].t, in[2].t, eps, axis);
  // y, batch_mean, batch_variance, reserve_space_1..3: the statistics given.
  return {Value{y}, in[3], in[4], in[3], in[4], in[3]};
}

// ---- reductions --------------------------------------------------------------------

template <Tensor (*F)(const Tensor&, const std::vector<int64_t>&, bool)>
Values reduce(const NodeDef& n, const Values& in) {
  const std::vector<int64_t> axes = ints(in[1]);
  if (axes.empty()) return {in[0]};  // TF reduces over no axis: the input
  return one(F(in[0].t, axes, attr_b(n, "keep_dims", false)));
}
template <Tensor (*F)(const Tensor&, int64_t, bool)>
Values arg_reduce(const NodeDef& n, const Values& in) {
  Tensor r = F(in[0].t, int_scalar(n, in[1], "the axis"), false);
  const DType want = attr_type(n, "output_type", DType::kI64);
  return one(r.dtype() == want ? r : ops::cast(r, want));
}

// ---- shapes ------------------------------------------------------------------------

Values shape_op(const NodeDef& n, const Values& in) {
  const auto d = in[0].t.shape().dims();
  return one(int_vector(std::vector<int64_t>(d.begin(), d.end()), attr_type(n, "out_type", DType::kI32)));
}
Values size_op(const NodeDef& n, const Values& in) {
  return one(ops::cast(Tensor::scalar<int64_t>(in[0].t.numel()), attr_type(n, "out_type", DType::kI32)));
}
Values rank_op(const NodeDef&, const Values& in) { return one(Tensor::scalar<int32_t>(in[0].t.shape().rank())); }
Values reshape(const NodeDef&, const Values& in) { return one(ops::reshape(in[0].t, ints(in[1]))); }
Values transpose(const NodeDef&, const Values& in) { return one(ops::transpose(in[0].t, ints(in[1]))); }
Values squeeze(const NodeDef& n, const Values& in) { return one(ops::squeeze(in[0].t, attr_ints(n, "squeeze_dims"))); }
Values expand_dims(const NodeDef& n, const Values& in) {
  return one(ops::expand_dims(in[0].t, int_scalar(n, in[1], "the axis")));
}
std::vector<Tensor> tensors(const Values& in, size_t from, size_t to) {
  std::vector<Tensor> t;
  for (size_t i = from; i < to; ++i) t.push_back(in[i].t);
  return t;
}
Values concat_v2(const NodeDef& n, const Values& in) {
  return one(ops::concat(tensors(in, 0, in.size() - 1), int_scalar(n, in.back(), "the axis")));
}
Values concat_v1(const NodeDef& n, const Values& in) {
  return one(ops::concat(tensors(in, 1, in.size()), int_scalar(n, in[0], "the axis")));
}
Values pack(const NodeDef& n, const Values& in) { return one(ops::stack(tensors(in, 0, in.size()), attr_i(n, "axis", 0))); }
Values unpack(const NodeDef& n, const Values& in) {
  const int64_t axis = attr_i(n, "axis", 0);
  Values out;
  for (const Tensor& t : ops::split(in[0].t, attr_i(n, "num", 1), axis)) out.push_back({ops::squeeze(t, {axis})});
  return out;
}
Values split(const NodeDef& n, const Values& in) {
  Values out;
  for (Tensor& t : ops::split(in[1].t, attr_i(n, "num_split", 1), int_scalar(n, in[0], "the axis")))
    out.push_back({std::move(t)});
  return out;
}
Values split_v(const NodeDef& n, const Values& in) {
  const Tensor& x = in[0].t;
  int64_t axis = int_scalar(n, in[2], "the axis");
  if (axis < 0) axis += x.shape().rank();
  std::vector<int64_t> sizes = ints(in[1]);
  int64_t known = 0, open = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) open = static_cast<int64_t>(i);
    else known += sizes[i];
  }
  if (open >= 0 && axis >= 0 && axis < x.shape().rank()) sizes[static_cast<size_t>(open)] = x.shape().dim(axis) - known;
  Values out;
  for (Tensor& t : ops::split(x, sizes, axis)) out.push_back({std::move(t)});
  return out;
}
Values slice(const NodeDef&, const Values& in) { return one(ops::slice(in[0].t, ints(in[1]), ints(in[2]))); }

// tf.strided_slice with its masks: an ellipsis expands to the dimensions the other
// entries leave, new_axis inserts a 1, shrink_axis takes one index and drops the
// dimension, begin/end masks take the whole range in the stride's direction.
Values strided_slice(const NodeDef& n, const Values& in) {
  const Tensor& x = in[0].t;
  const std::vector<int64_t> b = ints(in[1]), e = ints(in[2]), s = ints(in[3]);
  if (b.size() != e.size() || b.size() != s.size())
    throw InvalidArgumentError(node_label(n) + ": begin, end and strides differ in length");
  const int64_t begin_mask = attr_i(n, "begin_mask", 0), end_mask = attr_i(n, "end_mask", 0);
  const int64_t ellipsis = attr_i(n, "ellipsis_mask", 0), new_axis = attr_i(n, "new_axis_mask", 0);
  const int64_t shrink = attr_i(n, "shrink_axis_mask", 0);
  const int rank = x.shape().rank();
  int real = 0;  // entries that consume a dimension of x
  for (size_t i = 0; i < b.size(); ++i)
    if (!((ellipsis >> i) & 1) && !((new_axis >> i) & 1)) ++real;
  std::vector<int64_t> kb, ke, ks;
  std::vector<int64_t> out_dims_plan;  // -1: keep the sliced dim, -2: new axis, -3: drop
  int dim = 0;
  bool seen_ellipsis = false;
  for (size_t i = 0; i < b.size(); ++i) {
    if ((ellipsis >> i) & 1) {
      if (seen_ellipsis) throw InvalidArgumentError(node_label(n) + ": two ellipses");
      seen_ellipsis = true;
      for (int k = 0; k < rank - real; ++k, ++dim) {
        kb.push_back(0);
        ke.push_back(ops::kSliceMax);
        ks.push_back(1);
        out_dims_plan.push_back(-1);
      }
      continue;
    }
    if ((new_axis >> i) & 1) {
      out_dims_plan.push_back(-2);
      continue;
    }
    if (dim >= rank) throw InvalidArgumentError(node_label(n) + ": more slice entries than " + x.desc() + " has dimensions");
    if ((shrink >> i) & 1) {
      int64_t idx = b[i] < 0 ? b[i] + x.shape().dim(dim) : b[i];
      if (idx < 0 || idx >= x.shape().dim(dim))
        throw OutOfRangeError(node_label(n) + ": index " + std::to_string(b[i]) + " of dimension " + std::to_string(dim) +
                              " of " + x.desc());
      kb.push_back(idx);
      ke.push_back(idx + 1);
      ks.push_back(1);
      out_dims_plan.push_back(-3);
    } else {
      if (s[i] == 0) throw InvalidArgumentError(node_label(n) + ": a zero stride");
      kb.push_back(((begin_mask >> i) & 1) ? (s[i] > 0 ? 0 : ops::kSliceMax) : b[i]);
      ke.push_back(((end_mask >> i) & 1) ? (s[i] > 0 ? ops::kSliceMax : ops::kSliceMin) : e[i]);
      ks.push_back(s[i]);
      out_dims_plan.push_back(-1);
    }
    ++dim;
  }
  for (; dim < rank; ++dim) out_dims_plan.push_back(-1);
  Tensor r = ops::strided_slice(x, kb, ke, ks);
  std::vector<int64_t> dims;
  int src = 0;
  for (int64_t p : out_dims_plan) {
    if (p == -2) {
      dims.push_back(1);
    } else {
      if (p == -1) dims.push_back(r.shape().dim(src));
      ++src;
    }
  }
  if (static_cast<int>(dims.size()) == r.shape().rank() && Shape(dims) == r.shape()) return one(r);
  return one(ops::reshape(r, dims));
}

std::vector<std::pair<int64_t, int64_t>> pairs(const NodeDef& n, const Value& v, int rank) {
  std::vector<int64_t> p = ints(v);
  if (static_cast<int>(p.size()) != 2 * rank)
    throw InvalidArgumentError(node_label(n) + ": paddings must be [" + std::to_string(rank) + ", 2]");
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int i = 0; i < rank; ++i) out.emplace_back(p[2 * static_cast<size_t>(i)], p[2 * static_cast<size_t>(i) + 1]);
  return out;
}
Values pad(const NodeDef& n, const Values& in) {
  const double value = in.size() > 2 ? in[2].t.to_vector<double>().at(0) : 0.0;
  return one(ops::pad(in[0].t, pairs(n, in[1], in[0].t.shape().rank()), "constant", value));
}
Values mirror_pad(const NodeDef& n, const Values& in) {
  const std::string mode = attr_s(n, "mode", "REFLECT");
  if (mode != "REFLECT") throw UnimplementedError(node_label(n) + ": mode '" + mode + "' (kiln pads REFLECT)");
  return one(ops::pad(in[0].t, pairs(n, in[1], in[0].t.shape().rank()), "reflect"));
}
Values gather_v2(const NodeDef& n, const Values& in) {
  return one(ops::gather(in[0].t, in[1].t, int_scalar(n, in[2], "the axis"), attr_i(n, "batch_dims", 0)));
}
Values tile(const NodeDef&, const Values& in) { return one(ops::tile(in[0].t, ints(in[1]))); }
Values broadcast_to(const NodeDef&, const Values& in) { return one(ops::broadcast_to(in[0].t, ints(in[1]))); }
Values fill(const NodeDef& n, const Values& in) {
  if (in[1].t.numel() != 1) throw InvalidArgumentError(node_label(n) + ": the value must be a scalar");
  return one(ops::broadcast_to(ops::reshape(in[1].t, {}), ints(in[0])));
}
Values range(const NodeDef& n, const Values& in) {
  auto scalar = [&](const Value& v) { return v.t.to_vector<double>().at(0); };
  return one(ops::arange(scalar(in[0]), scalar(in[1]), scalar(in[2]), attr_type(n, "Tidx", in[0].t.dtype())));
}
Values zeros_like(const NodeDef&, const Values& in) { return one(ops::zeros_like(in[0].t)); }
Values ones_like(const NodeDef&, const Values& in) { return one(ops::ones_like(in[0].t)); }
Values select(const NodeDef&, const Values& in) {
  Tensor c = in[0].t;
  // Select (v1): a vector condition picks rows of higher-rank operands.
  if (c.shape().rank() == 1 && in[1].t.shape().rank() > 1) {
    std::vector<int64_t> dims(static_cast<size_t>(in[1].t.shape().rank()), 1);
    dims[0] = -1;
    c = ops::reshape(c, dims);
  }
  return one(ops::where(c, in[1].t, in[2].t));
}
Values select_v2(const NodeDef&, const Values& in) { return one(ops::where(in[0].t, in[1].t, in[2].t)); }
Values top_k(const NodeDef& n, const Values& in) {
  ops::TopK r = ops::top_k(in[0].t, int_scalar(n, in[1], "k"), attr_b(n, "sorted", true));
  return {Value{r.values}, Value{r.indices.dtype() == DType::kI32 ? r.indices : ops::cast(r.indices, DType::kI32)}};
}
Values one_hot(const NodeDef& n, const Values& in) {
  auto scalar = [&](const Value& v) { return v.t.to_vector<double>().at(0); };
  return one(ops::one_hot(in[0].t, int_scalar(n, in[1], "the depth"), scalar(in[2]), scalar(in[3]), in[2].t.dtype(),
                          attr_i(n, "axis", -1)));
}

const std::map<std::string, OpFn, std::less<>>& op_table() {
  static const std::map<std::string, OpFn, std::less<>> table = {
      {"Identity", identity_n}, {"IdentityN", identity_n}, {"StopGradient", identity_n}, {"Snapshot", identity_n},
      {"PreventGradient", identity_n}, {"EnsureShape", identity_n}, {"CheckNumerics", identity_n},
      {"PlaceholderWithDefault", identity_n},
      {"Const", const_op}, {"ReadVariableOp", read_variable}, {"ResourceGather", resource_gather},
      {"MatMul", matmul}, {"BatchMatMul", batch_matmul}, {"BatchMatMulV2", batch_matmul},
      {"BatchMatMulV3", batch_matmul}, {"Einsum", einsum}, {"BiasAdd", bias_add}, {"BiasAddV1", bias_add},
      {"Add", binary<ops::add>}, {"AddV2", binary<ops::add>}, {"Sub", binary<ops::sub>}, {"Mul", binary<ops::mul>},
      {"RealDiv", binary<ops::div>}, {"Div", binary<ops::div>}, {"FloorDiv", binary<floor_div>},
      {"Maximum", binary<ops::maximum>}, {"Minimum", binary<ops::minimum>}, {"Pow", binary<ops::pow>},
      {"SquaredDifference", binary<squared_difference>}, {"AddN", add_n}, {"ClipByValue", clip_by_value},
      {"Equal", binary<ops::equal>}, {"NotEqual", binary<ops::not_equal>}, {"Less", binary<ops::less>},
      {"LessEqual", binary<ops::less_equal>}, {"Greater", binary<ops::greater>},
      {"GreaterEqual", binary<ops::greater_equal>}, {"LogicalAnd", binary<ops::logical_and>},
      {"LogicalOr", binary<ops::logical_or>}, {"LogicalNot", unary<ops::logical_not>},
      {"Relu", unary<ops::relu>}, {"Relu6", unary<relu6>}, {"Elu", unary<elu>}, {"Selu", unary<selu>},
      {"LeakyRelu", leaky_relu}, {"Sigmoid", unary<ops::sigmoid>}, {"Tanh", unary<ops::tanh>},
      {"Softplus", unary<ops::softplus>}, {"Softsign", unary<softsign>}, {"Softmax", unary<softmax_last>},
      {"LogSoftmax", unary<log_softmax_last>}, {"Erf", unary<ops::erf>}, {"Erfc", unary<erfc>},
      {"Exp", unary<ops::exp>}, {"Log", unary<ops::log>}, {"Log1p", unary<ops::log1p>}, {"Sqrt", unary<ops::sqrt>},
      {"Rsqrt", unary<ops::rsqrt>}, {"Square", unary<ops::square>}, {"Neg", unary<ops::neg>}, {"Abs", unary<ops::abs>},
      {"Reciprocal", unary<ops::reciprocal>}, {"Inv", unary<ops::reciprocal>}, {"Floor", unary<ops::floor>},
      {"Ceil", unary<ops::ceil>}, {"Round", unary<ops::round>}, {"Sign", unary<ops::sign>}, {"Sin", unary<ops::sin>},
      {"Cos", unary<ops::cos>}, {"Cast", cast},
      {"Conv2D", conv2d}, {"DepthwiseConv2dNative", depthwise_conv2d}, {"MaxPool", max_pool}, {"AvgPool", avg_pool},
      {"FusedBatchNorm", fused_batch_norm}, {"FusedBatchNormV2", fused_batch_norm},
      {"FusedBatchNormV3", fused_batch_norm},
      {"Mean", reduce<ops::mean>}, {"Sum", reduce<ops::sum>}, {"Max", reduce<ops::max>}, {"Min", reduce<ops::min>},
      {"Prod", reduce<ops::prod>}, {"All", reduce<ops::all>}, {"Any", reduce<ops::any>},
      {"ArgMax", arg_reduce<ops::argmax>}, {"ArgMin", arg_reduce<ops::argmin>},
      {"Shape", shape_op}, {"Size", size_op}, {"Rank", rank_op}, {"Reshape", reshape}, {"Transpose", transpose},
      {"Squeeze", squeeze}, {"ExpandDims", expand_dims}, {"ConcatV2", concat_v2}, {"Concat", concat_v1},
      {"Pack", pack}, {"Unpack", unpack}, {"Split", split}, {"SplitV", split_v}, {"Slice", slice},
      {"StridedSlice", strided_slice}, {"Pad", pad}, {"PadV2", pad}, {"MirrorPad", mirror_pad},
      {"GatherV2", gather_v2}, {"Tile", tile}, {"BroadcastTo", broadcast_to}, {"Fill", fill}, {"Range", range},
      {"ZerosLike", zeros_like}, {"OnesLike", ones_like}, {"Select", select}, {"SelectV2", select_v2},
      {"TopKV2", top_k}, {"OneHot", one_hot},
  };
  return table;
}

// The fewest (data) inputs each op's function reads; 1 for ops not listed. A node with
// fewer is DataLossError before its function runs.
size_t min_inputs(const std::string& op) {
  static const std::map<std::string, size_t, std::less<>> m = [] {
    std::map<std::string, size_t, std::less<>> t;
    for (const char* o : {"Const", "IdentityN"}) t[o] = 0;
    for (const char* o :
         {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "BiasAdd", "BiasAddV1", "Add", "AddV2", "Sub",
          "Mul", "RealDiv", "Div", "FloorDiv", "Maximum", "Minimum", "Pow", "SquaredDifference", "Equal", "NotEqual",
          "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr", "Conv2D", "DepthwiseConv2dNative",
          "Mean", "Sum", "Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin", "Reshape", "Transpose", "ExpandDims",
          "ConcatV2", "Concat", "Split", "Pad", "MirrorPad", "Tile", "BroadcastTo", "Fill", "ResourceGather", "TopKV2"})
      t[o] = 2;
    for (const char* o : {"ClipByValue", "Select", "SelectV2", "SplitV", "Slice", "PadV2", "GatherV2", "Range"}) t[o] = 3;
    for (const char* o : {"StridedSlice", "OneHot"}) t[o] = 4;
    for (const char* o : {"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"}) t[o] = 5;
    return t;
  }();
  auto it = m.find(op);
  return it == m.end() ? 1 : it->second;
}

bool is_call(const std::string& op) { return op == "StatefulPartitionedCall" || op == "PartitionedCall"; }
// Nodes the evaluator handles itself: a node without outputs or a graph input.
bool is_structural(const std::string& op) { return op == "NoOp" || op == "Placeholder" || op == "VarHandleOp"; }

// The output arguments of ops with more than one (an input "node:arg:i" inside a
// function body names them); every other op has one, possibly a list.
const std::vector<std::string>* output_args(const std::string& op) {
  static const std::map<std::string, std::vector<std::string>, std::less<>> m = {
      {"FusedBatchNorm", {"y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"}},
      {"FusedBatchNormV2", {"y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"}},
      {"FusedBatchNormV3",
       {"y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2", "reserve_space_3"}},
      {"TopKV2", {"values", "indices"}},
  };
  auto it = m.find(op);
  return it == m.end() ? nullptr : &it->second;
}

// A node input: "^node" (control), "node" / "node:2" (top level), "arg" /
// "node:out_arg:2" (function bodies).
struct Ref {
  std::string node;
  std::string arg;  // function bodies only
  int index = 0;
  bool control = false;
};
Ref parse_ref(const std::string& s) {
  Ref r;
  std::string body = s;
  if (!body.empty() && body[0] == '^') {
    r.control = true;
    body = body.substr(1);
  }
  const size_t c1 = body.find(':');
  if (c1 == std::string::npos) {
    r.node = body;
    return r;
  }
  r.node = body.substr(0, c1);
  const size_t c2 = body.find(':', c1 + 1);
  std::string idx = body.substr(c1 + 1);
  if (c2 != std::string::npos) {
    r.arg = body.substr(c1 + 1, c2 - c1 - 1);
    idx = body.substr(c2 + 1);
  }
  try {
    size_t used = 0;
    r.index = std::stoi(idx, &used);
    if (used != idx.size() || r.index < 0) throw std::invalid_argument("index");
  } catch (const std::exception&) {
    throw DataLossError("input '" + s + "' has a malformed output index");
  }
  return r;
}

class Evaluator {
 public:
  Evaluator(const tensorflow::GraphDef& g, const VariableResolver* vars) : g_(g), vars_(vars) {
    for (const FunctionDef& f : g.library().function()) library_.emplace(f.signature().name(), &f);
  }

  // One graph or function body being evaluated.
  struct Scope {
    std::map<std::string, const NodeDef*> nodes;
    std::map<std::string, Values> done;
    std::map<std::string, Value> args;  // function arguments by name
    std::string where;                  // "graph" or "function 'f'"
    bool function = false;
  };

  Scope top_scope() const {
    Scope s;
    s.where = "the graph";
    for (const NodeDef& n : g_.node()) s.nodes.emplace(n.name(), &n);
    return s;
  }

  const FunctionDef* function_of(const NodeDef& n) const {
    std::string name = n.op();
    if (is_call(n.op())) {
      const AttrValue* f = find_attr(n, "f");
      if (!f || f->value_case() != AttrValue::kFunc) throw DataLossError(node_label(n) + " names no function");
      name = f->func().name();
    }
    auto it = library_.find(name);
    if (it == library_.end()) {
      if (is_call(n.op())) throw DataLossError(node_label(n) + " calls function '" + name + "', which is not in the library");
      return nullptr;
    }
    return it->second;
  }

  // The value an input string refers to (evaluated already).
  Value value(Scope& s, const std::string& input) {
    const Ref r = parse_ref(input);
    if (s.function && r.arg.empty() && s.args.count(r.node)) return s.args.at(r.node);
    auto it = s.done.find(r.node);
    if (it == s.done.end()) throw InternalError("'" + r.node + "' was not evaluated before its use");
    const NodeDef& n = *s.nodes.at(r.node);
    size_t index = static_cast<size_t>(r.index);
    if (!r.arg.empty()) index = output_index(n, r.arg, r.index, s);
    if (index >= it->second.size())
      throw DataLossError(s.where + ": input '" + input + "' refers to output " + std::to_string(index) + " of " +
                          node_label(n) + ", which has " + std::to_string(it->second.size()));
    return it->second[index];
  }

  // Evaluates `node` of scope s and every node it depends on (iteratively: graphs may
  // be thousands of nodes deep).
  void evaluate(Scope& s, const std::string& node) {
    // A node popped unexpanded while its own expansion is on the stack below is on a cycle.
    std::set<std::string> expanding;
    std::vector<std::pair<std::string, bool>> stack{{node, false}};
    while (!stack.empty()) {
      auto [name, expanded] = stack.back();
      stack.pop_back();
      if (s.done.count(name) || (s.function && s.args.count(name))) continue;
      auto nit = s.nodes.find(name);
      if (nit == s.nodes.end()) throw DataLossError(s.where + " refers to node '" + name + "', which it does not have");
      const NodeDef& n = *nit->second;
      if (!expanded) {
        if (!expanding.insert(name).second) throw DataLossError(s.where + " has a cycle through " + node_label(n));
        stack.push_back({name, true});
        for (const std::string& in : n.input()) {
          const Ref r = parse_ref(in);
          if (r.control) continue;  // side effects of an inference graph: variable reads only
          if (!s.done.count(r.node) && !(s.function && s.args.count(r.node))) stack.push_back({r.node, false});
        }
        continue;
      }
      Values in;
      for (const std::string& i : n.input())
        if (!parse_ref(i).control) in.push_back(value(s, i));
      s.done[name] = run_node(s, n, in);
      expanding.erase(name);
    }
  }

  Values run_function(const FunctionDef& f, const Values& args, int depth) {
    if (depth > 64) throw UnimplementedError("function '" + f.signature().name() + "' is nested over 64 calls deep");
    Scope s;
    s.function = true;
    s.where = "function '" + f.signature().name() + "'";
    if (args.size() != static_cast<size_t>(f.signature().input_arg_size()))
      throw DataLossError(s.where + " takes " + std::to_string(f.signature().input_arg_size()) + " arguments, got " +
                          std::to_string(args.size()));
    for (int i = 0; i < f.signature().input_arg_size(); ++i)
      s.args[f.signature().input_arg(i).name()] = args[static_cast<size_t>(i)];
    for (const NodeDef& n : f.node_def()) s.nodes.emplace(n.name(), &n);
    depth_ = depth;
    Values out;
    for (const auto& arg : f.signature().output_arg()) {
      auto it = f.ret().find(arg.name());
      if (it == f.ret().end()) throw DataLossError(s.where + " does not say what its output '" + arg.name() + "' is");
      const Ref r = parse_ref(it->second);
      if (!(r.arg.empty() && s.args.count(r.node))) evaluate(s, r.node);
      out.push_back(value(s, it->second));
    }
    return out;
  }

  Values run_node(Scope& s, const NodeDef& n, const Values& in) {
    try {
      if (n.op() == "NoOp") return {};
      if (const FunctionDef* f = function_of(n)) {
        const int depth = depth_;
        Values out = run_function(*f, in, depth + 1);
        depth_ = depth;
        return out;
      }
      if (n.op() == "VarHandleOp") {
        if (s.function || !vars_) throw UnimplementedError(node_label(n) + " inside a function body");
        return {Value{(*vars_)(n), true}};
      }
      if (n.op() == "Placeholder")
        throw InvalidArgumentError(node_label(n) + " is not an input of the signature: feed it");
      auto it = op_table().find(n.op());
      if (it == op_table().end()) throw UnimplementedError("op '" + n.op() + "' (" + node_label(n) + ")");
      if (in.size() < min_inputs(n.op()))
        throw DataLossError(node_label(n) + " has " + std::to_string(in.size()) + " inputs; it takes at least " +
                            std::to_string(min_inputs(n.op())));
      return it->second(n, in);
    } catch (const Error& e) {
      if (e.message().find(" (" + n.op() + ")") != std::string::npos) throw;  // names the node already
      throw_error(e.code(), s.where + ": " + node_label(n) + ": " + e.message());
    }
  }

  // Collects the unsupported ops reachable from `node` (no evaluation).
  void scan(const Scope& s, const std::string& node, std::set<std::string>& visited_functions,
            std::map<std::string, std::set<std::string>>& missing) const {
    std::set<std::string> seen;
    std::vector<std::string> stack{node};
    while (!stack.empty()) {
      const std::string name = stack.back();
      stack.pop_back();
      if (!seen.insert(name).second) continue;
      auto nit = s.nodes.find(name);
      if (nit == s.nodes.end()) continue;  // an argument, or reported when evaluated
      const NodeDef& n = *nit->second;
      for (const std::string& in : n.input()) {
        const Ref r = parse_ref(in);
        if (!r.control) stack.push_back(r.node);
      }
      if (const FunctionDef* f = function_of(n)) {  // DataLossError: a call to a missing function
        if (!visited_functions.insert(f->signature().name()).second) continue;
        Scope body;
        body.function = true;
        for (const NodeDef& m : f->node_def()) body.nodes.emplace(m.name(), &m);
        for (const auto& [_, ret] : f->ret()) scan(body, parse_ref(ret).node, visited_functions, missing);
        continue;
      }
      if (!is_structural(n.op()) && !op_table().count(n.op())) missing[n.op()].insert(n.name());
    }
  }

 private:
  size_t output_index(const NodeDef& n, const std::string& arg, int index, const Scope& s) const {
    if (is_call(n.op())) return static_cast<size_t>(index);  // one list output, "output"
    if (const FunctionDef* f = function_of(n)) {
      for (int k = 0; k < f->signature().output_arg_size(); ++k)
        if (f->signature().output_arg(k).name() == arg) return static_cast<size_t>(k + index);
    } else if (const std::vector<std::string>* args = output_args(n.op())) {
      for (size_t k = 0; k < args->size(); ++k)
        if ((*args)[k] == arg) return k + static_cast<size_t>(index);
    } else {
      return static_cast<size_t>(index);  // one output argument (or a list)
    }
    throw DataLossError(s.where + ": " + node_label(n) + " has no output '" + arg + "'");
  }

  const tensorflow::GraphDef& g_;
  const VariableResolver* vars_;
  std::map<std::string, const FunctionDef*> library_;
  int depth_ = 0;
};

// A trace of the graph with every open dimension of the inputs set to `probe`.
graph::Graph trace_with(const tensorflow::GraphDef& gd, const std::vector<GraphInput>& inputs,
                        const std::vector<std::string>& outputs, const VariableResolver& vars, int64_t probe) {
  std::vector<Tensor> args;
  for (const GraphInput& in : inputs) {
    std::vector<int64_t> dims = in.spec.shape;
    for (int64_t& d : dims)
      if (d < 0) d = probe;
    args.push_back(Tensor::zeros(Shape(dims), in.spec.dtype));
  }
  return graph::trace(
      [&](const std::vector<Tensor>& xs) {
        Evaluator ev(gd, &vars);
        Evaluator::Scope s = ev.top_scope();
        for (size_t i = 0; i < inputs.size(); ++i) {
          if (!s.nodes.count(inputs[i].node))
            throw DataLossError("the signature's input '" + inputs[i].node + "' is not a node of the graph");
          s.done[inputs[i].node] = {Value{xs[i]}};
        }
        std::vector<Tensor> out;
        for (const std::string& o : outputs) {
          ev.evaluate(s, parse_ref(o).node);
          Value v = ev.value(s, o);
          if (v.resource) throw UnimplementedError("output '" + o + "' is a variable handle, not a tensor");
          out.push_back(v.t);
        }
        return out;
      },
      args);
}

// The nodes the outputs depend on, in order.
std::vector<int> needed_nodes(const graph::Graph& g) {
  std::vector<char> live(g.nodes.size(), 0);
  for (graph::ValueRef v : g.outputs) live[static_cast<size_t>(v.node)] = 1;
  for (size_t i = g.nodes.size(); i-- > 0;)
    if (live[i])
      for (graph::ValueRef v : g.nodes[i].inputs) live[static_cast<size_t>(v.node)] = 1;
  std::vector<int> out;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (live[i] || g.nodes[i].kind == graph::NodeKind::kInput) out.push_back(static_cast<int>(i));
  return out;
}

bool same_constant(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.storage() == b.storage()) return true;
  return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

std::map<std::string, std::set<std::string>> unsupported_ops(const tensorflow::GraphDef& graph,
                                                             const std::vector<std::string>& outputs) {
  Evaluator ev(graph, nullptr);
  const Evaluator::Scope s = ev.top_scope();
  std::set<std::string> functions;
  std::map<std::string, std::set<std::string>> missing;
  for (const std::string& o : outputs) ev.scan(s, parse_ref(o).node, functions, missing);
  return missing;
}

graph::Graph import_graph(const tensorflow::GraphDef& gd, const std::vector<GraphInput>& inputs,
                          const std::vector<std::string>& outputs, const VariableResolver& vars) {
  const auto missing = unsupported_ops(gd, outputs);
  if (!missing.empty()) {
    std::string list;
    for (const auto& [op, nodes] : missing) {
      list += (list.empty() ? "" : "; ") + op + " (";
      int k = 0;
      for (const std::string& node : nodes) {
        if (k++ == 3) {
          list += ", ... " + std::to_string(nodes.size()) + " nodes";
          break;
        }
        list += (k > 1 ? ", " : "") + node;
      }
      list += ")";
    }
    throw UnimplementedError("kiln has no mapping for " + std::to_string(missing.size()) +
                             " TensorFlow op(s) the graph uses: " + list);
  }
  // Two traces, open dimensions 2 and 3: what differs depends on them.
  graph::Graph a = trace_with(gd, inputs, outputs, vars, 2);
  graph::Graph b = trace_with(gd, inputs, outputs, vars, 3);
  const std::vector<int> la = needed_nodes(a), lb = needed_nodes(b);
  auto dynamic = [&](const graph::Node& n, const std::string& why) {
    return UnimplementedError("the imported graph's " + n.label() + " depends on the size of an open input dimension (" +
                              why + "); kiln's graphs fix such values when they are built");
  };
  if (la.size() != lb.size()) throw UnimplementedError("the graph's structure depends on the size of an open input dimension");
  for (size_t k = 0; k < la.size(); ++k) {
    graph::Node& na = a.nodes[static_cast<size_t>(la[k])];
    const graph::Node& nb = b.nodes[static_cast<size_t>(lb[k])];
    if (na.kind != nb.kind || na.op != nb.op || na.inputs.size() != nb.inputs.size())
      throw UnimplementedError("the graph's structure depends on the size of an open input dimension (at " + na.label() +
                               ")");
    if (na.kind == graph::NodeKind::kConstant && !same_constant(na.constant, nb.constant))
      throw dynamic(na, "a constant computed from the input's shape");
    if (na.kind != graph::NodeKind::kOp) continue;
    for (const auto& [name, va] : na.attrs.items()) {
      const kiln::AttrValue* vb = nullptr;
      for (const auto& [nm, v] : nb.attrs.items())
        if (nm == name) vb = &v;
      if (!vb || *vb == va) continue;
      const auto* da = std::get_if<std::vector<int64_t>>(&va);
      const auto* db = std::get_if<std::vector<int64_t>>(vb);
      if (na.op->name == "reshape" && name == "shape" && da && db && da->size() == db->size()) {
        std::vector<int64_t> merged = *da;
        int open = 0;
        for (size_t d = 0; d < merged.size(); ++d)
          if ((*da)[d] != (*db)[d]) {
            merged[d] = -1;
            ++open;
          }
        bool had_minus_one = false;
        for (int64_t d : *da) had_minus_one |= d == -1;
        if (open == 1 && !had_minus_one) {
          na.attrs.set("shape", merged);
          continue;
        }
      }
      throw dynamic(na, "attr '" + name + "'");
    }
  }
  return a;
}

}  // namespace kiln::tf
