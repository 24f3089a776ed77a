// Shape ops: reshape, transpose, expand_dims, squeeze, concat, stack, split, slice,
// strided_slice, pad, tile, broadcast_to (definitions, inference, eager entry points).
//
// The registered ops take canonical attributes (resolved shapes, explicit perms, sizes
// and per-dimension start/stride/count), so graph execution and kernels never redo
// Python-style index resolution; the eager functions below resolve user arguments.
#include "kiln/ops/shape.h"

#include <algorithm>
#include <numeric>

#include "kiln/core/dispatch.h"
#include "kiln/core/op_def.h"
#include "kiln/ops/elementwise.h"
#include "op_util.h"
#include "shape_util.h"

namespace kiln::ops {
namespace {
using detail::dtype_str;
using kiln::detail::str_cat;
using shape_detail::ints_str;

// ---- inference ---------------------------------------------------------------------

std::vector<TensorMeta> infer_reshape(std::span<const TensorMeta> in, const Attrs& a) {
  return {{shape_detail::resolve_reshape("reshape", in[0].shape, a.get_ints("shape")), in[0].dtype}};
}

std::vector<TensorMeta> infer_transpose(std::span<const TensorMeta> in, const Attrs& a) {
  std::vector<int> perm = shape_detail::resolve_perm(a.get_ints("perm", {}), in[0].shape.rank());
  Shape out = in[0].shape;
  for (size_t i = 0; i < perm.size(); ++i) out[static_cast<int>(i)] = in[0].shape[perm[i]];
  return {{out, in[0].dtype}};
}

// Shared by concat and split: shapes must agree except on `axis`.
void require_match_except(const char* op, const Shape& a, const Shape& b, int axis, size_t i) {
  bool ok = a.rank() == b.rank();
  for (int d = 0; ok && d < a.rank(); ++d) ok = d == axis || a[d] == b[d];
  if (!ok)
    throw InvalidArgumentError(str_cat(op, ": input ", i, " has shape ", b.str(), " but input 0 has ", a.str(),
                                       "; shapes must match except on axis ", axis));
}

std::vector<TensorMeta> infer_concat(std::span<const TensorMeta> in, const Attrs& a) {
  if (in.empty()) throw InvalidArgumentError("concat: needs at least one input, got none");
  detail::require_same_dtype("concat", in);
  if (in[0].shape.rank() == 0) throw InvalidArgumentError("concat: inputs must have rank >= 1, got a scalar (rank 0)");
  int axis = normalize_axis(a.get_int("axis"), in[0].shape.rank(), "concat axis");
  Shape out = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i) {
    require_match_except("concat", in[0].shape, in[i].shape, axis, i);
    out[axis] += in[i].shape[axis];
  }
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_stack(std::span<const TensorMeta> in, const Attrs& a) {
  if (in.empty()) throw InvalidArgumentError("stack: needs at least one input, got none");
  detail::require_same_dtype("stack", in);
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].shape != in[0].shape)
      throw InvalidArgumentError(str_cat("stack: input ", i, " has shape ", in[i].shape.str(), " but input 0 has ",
                                         in[0].shape.str(), "; all inputs must have one shape"));
  int axis = normalize_axis(a.get_int("axis"), in[0].shape.rank() + 1, "stack axis");
  Shape out = in[0].shape;
  out.insert(axis, static_cast<int64_t>(in.size()));
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_split(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape& s = in[0].shape;
  if (s.rank() == 0) throw InvalidArgumentError("split: input must have rank >= 1, got a scalar (rank 0)");
  int axis = normalize_axis(a.get_int("axis"), s.rank(), "split axis");
  const std::vector<int64_t>& sizes = a.get_ints("sizes");
  if (sizes.empty()) throw InvalidArgumentError("split: needs at least one part, got an empty size list");
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 0) throw InvalidArgumentError(str_cat("split: part sizes must be >= 0, got ", ints_str(sizes)));
    total += n;
  }
  if (total != s[axis])
    throw InvalidArgumentError(str_cat("split: part sizes ", ints_str(sizes), " add up to ", total,
                                       " but dimension ", axis, " of ", s.str(), " is ", s[axis]));
  std::vector<TensorMeta> out;
  for (int64_t n : sizes) {
    Shape o = s;
    o[axis] = n;
    out.push_back({o, in[0].dtype});
  }
  return out;
}

std::vector<TensorMeta> infer_strided_slice(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape& s = in[0].shape;
  const auto &begin = a.get_ints("begin"), &size = a.get_ints("size"), &strides = a.get_ints("strides");
  const size_t r = static_cast<size_t>(s.rank());
  if (begin.size() != r || size.size() != r || strides.size() != r)
    throw InvalidArgumentError(str_cat("strided_slice: begin, size and strides need ", r, " entries (the rank of ",
                                       s.str(), "), got ", begin.size(), ", ", size.size(), " and ", strides.size()));
  Shape out = s;
  for (int d = 0; d < s.rank(); ++d) {
    int64_t b = begin[d], n = size[d], st = strides[d];
    if (st == 0) throw InvalidArgumentError(str_cat("strided_slice: stride of dimension ", d, " is 0"));
    if (n < 0)
      throw InvalidArgumentError(str_cat("strided_slice: size of dimension ", d, " is ", n, ", expected >= 0"));
    if (n > 0) {
      int64_t last = b + (n - 1) * st;
      if (b < 0 || b >= s[d] || last < 0 || last >= s[d])
        throw OutOfRangeError(str_cat("strided_slice: dimension ", d, " of ", s.str(), " reads indices ", b, " to ",
                                      last, ", outside [0, ", s[d], ")"));
    }
    out[d] = n;
  }
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_pad(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape& s = in[0].shape;
  const std::vector<int64_t>& p = a.get_ints("paddings");
  const std::string& mode = a.get_string("mode");
  if (mode != "constant" && mode != "reflect" && mode != "edge")
    throw InvalidArgumentError("pad: mode must be \"constant\", \"reflect\" or \"edge\", got \"" + mode + "\"");
  if (p.size() != 2 * static_cast<size_t>(s.rank()))
    throw InvalidArgumentError(str_cat("pad: needs one (before, after) pair per dimension of ", s.str(), " (",
                                       s.rank(), "), got ", p.size() / 2 + p.size() % 2));
  Shape out = s;
  for (int d = 0; d < s.rank(); ++d) {
    int64_t lo = p[2 * d], hi = p[2 * d + 1];
    if (lo < 0 || hi < 0)
      throw InvalidArgumentError(str_cat("pad: paddings must be >= 0, got (", lo, ", ", hi, ") for dimension ", d));
    if (mode == "reflect" && (lo > s[d] - 1 || hi > s[d] - 1) && (lo || hi))
      throw InvalidArgumentError(str_cat("pad: reflect padding (", lo, ", ", hi, ") of dimension ", d, " of ",
                                         s.str(), " must be <= ", std::max<int64_t>(s[d] - 1, 0)));
    if (mode == "edge" && s[d] == 0 && (lo || hi))
      throw InvalidArgumentError(str_cat("pad: edge padding of dimension ", d, " of ", s.str(),
                                         " needs a nonempty dimension"));
    out[d] = s[d] + lo + hi;
  }
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_tile(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape& s = in[0].shape;
  const std::vector<int64_t>& reps = a.get_ints("reps");
  if (reps.size() != static_cast<size_t>(s.rank()))
    throw InvalidArgumentError(str_cat("tile: reps needs ", s.rank(), " entries (the rank of ", s.str(), "), got ",
                                       reps.size()));
  Shape out = s;
  for (int d = 0; d < s.rank(); ++d) {
    if (reps[d] < 0) throw InvalidArgumentError(str_cat("tile: reps must be >= 0, got ", ints_str(reps)));
    out[d] = s[d] * reps[d];
  }
  return {{out, in[0].dtype}};
}

std::vector<TensorMeta> infer_broadcast_to(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape& s = in[0].shape;
  Shape target(a.get_ints("shape"));
  bool ok = s.rank() <= target.rank();
  for (int i = 0; ok && i < s.rank(); ++i) {
    int64_t d = s[i], t = target[target.rank() - s.rank() + i];
    ok = d == t || d == 1;
  }
  if (!ok)
    throw InvalidArgumentError(str_cat("broadcast_to: cannot broadcast shape ", s.str(), " to ", target.str(),
                                       " (each dimension, aligned right, must be 1 or equal to the target)"));
  return {{target, in[0].dtype}};
}

// ---- registration ------------------------------------------------------------------

KILN_REGISTER_OP(detail::make_def("reshape", "same elements, new shape (one -1 inferred); eager calls share the buffer", 1,
                     infer_reshape, {{"shape", AttrType::kInts, "target shape, at most one -1"}}));
KILN_REGISTER_OP(detail::make_def("transpose", "out.shape[i] = x.shape[perm[i]]", 1, infer_transpose,
                     {{"perm", AttrType::kInts, "permutation of 0..rank-1 (empty: reverse)"}}));
KILN_REGISTER_OP(detail::make_def("concat", "join along an existing axis (one dtype)", -1, infer_concat,
                     {{"axis", AttrType::kInt, "join axis"}}));
KILN_REGISTER_OP(detail::make_def("stack", "join equal shapes along a new axis (one dtype)", -1, infer_stack,
                     {{"axis", AttrType::kInt, "new axis, in [-rank-1, rank]"}}));
KILN_REGISTER_OP(detail::make_def("split", "parts of the given sizes along axis", 1, infer_split,
                     {{"axis", AttrType::kInt, "split axis"}, {"sizes", AttrType::kInts, "part sizes (sum = dim)"}}));
KILN_REGISTER_OP(detail::make_def("strided_slice", "out[i..] = x[begin + i*strides ..] (resolved bounds, no clamping)", 1,
                     infer_strided_slice,
                     {{"begin", AttrType::kInts, "first index per dimension"},
                      {"size", AttrType::kInts, "output size per dimension"},
                      {"strides", AttrType::kInts, "nonzero step per dimension"}}));
KILN_REGISTER_OP(detail::make_def("pad", "pad with a constant, reflection or the edge", 1, infer_pad,
                     {{"paddings", AttrType::kInts, "before0, after0, before1, ..."},
                      {"mode", AttrType::kString, "constant | reflect | edge"},
                      {"value", AttrType::kFloat, "fill value for constant mode"}}));
KILN_REGISTER_OP(detail::make_def("tile", "repeat reps[i] times along dimension i", 1, infer_tile,
                     {{"reps", AttrType::kInts, "repeats per dimension (length = rank)"}}));
KILN_REGISTER_OP(detail::make_def("broadcast_to", "NumPy broadcast to a shape", 1, infer_broadcast_to,
                     {{"shape", AttrType::kInts, "target shape"}}));

const OpDef& reshape_op() { return KILN_OP("reshape"); }

void require_defined(const Tensor& x, const char* op) {
  if (!x.defined()) throw InvalidArgumentError(str_cat("op '", op, "': input 0 is undefined"));
}

// A buffer-sharing reshape that gradient tapes still see as a "reshape" op.
Tensor view(const Tensor& x, const Shape& shape) {
  Tensor out = x.reshape(shape);
  if (op_observer()) {
    Attrs attrs{{"shape", shape.vec()}};
    notify_op_observer(reshape_op(), std::span<const Tensor>(&x, 1), std::span<const Tensor>(&out, 1), attrs);
  }
  return out;
}

// Casts every input to the promoted dtype of all of them.
std::vector<Tensor> promoted(const std::vector<Tensor>& xs, const char* op) {
  if (xs.empty()) throw InvalidArgumentError(str_cat(op, ": needs at least one input, got none"));
  for (size_t i = 0; i < xs.size(); ++i)
    if (!xs[i].defined()) throw InvalidArgumentError(str_cat("op '", op, "': input ", i, " is undefined"));
  DType t = xs[0].dtype();
  for (const Tensor& x : xs) t = promote_types(t, x.dtype());
  std::vector<Tensor> out;
  out.reserve(xs.size());
  for (const Tensor& x : xs) out.push_back(x.dtype() == t ? x : cast(x, t));
  return out;
}

Tensor call(const OpDef& d, const Tensor& x, const Attrs& attrs) {
  return call_op1(d, std::span<const Tensor>(&x, 1), attrs);
}

}  // namespace

Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape) {
  require_defined(x, "reshape");
  Tensor out = x.reshape(shape_detail::resolve_reshape("reshape", x.shape(), shape));
  // Observers (tapes, traces) see the requested shape: a -1 stays open, so a traced
  // graph reshapes correctly at other batch sizes.
  if (op_observer()) {
    Attrs attrs{{"shape", shape}};
    notify_op_observer(reshape_op(), std::span<const Tensor>(&x, 1), std::span<const Tensor>(&out, 1), attrs);
  }
  return out;
}

Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm) {
  require_defined(x, "transpose");
  std::vector<int> p = shape_detail::resolve_perm(perm, x.rank());
  return call(KILN_OP("transpose"), x, {{"perm", std::vector<int64_t>(p.begin(), p.end())}});
}

Tensor expand_dims(const Tensor& x, int64_t axis) {
  require_defined(x, "expand_dims");
  Shape s = x.shape();
  s.insert(normalize_axis(axis, x.rank() + 1, "expand_dims axis"), 1);
  return view(x, s);
}

Tensor squeeze(const Tensor& x, const std::vector<int64_t>& axes) {
  require_defined(x, "squeeze");
  const Shape& s = x.shape();
  Shape out;
  if (axes.empty()) {
    for (int64_t d : s) if (d != 1) out.push_back(d);
  } else {
    std::vector<int> ax = detail::normalize_axes(axes, x.rank(), "squeeze");
    for (int a : ax)
      if (s[a] != 1)
        throw InvalidArgumentError(str_cat("squeeze: dimension ", a, " of ", s.str(), " has size ", s[a],
                                           ", expected 1"));
    for (int d = 0; d < s.rank(); ++d)
      if (!std::binary_search(ax.begin(), ax.end(), d)) out.push_back(s[d]);
  }
  return view(x, out);
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  std::vector<Tensor> in = promoted(xs, "concat");
  return call_op1(KILN_OP("concat"), in, {{"axis", axis}});
}

Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  std::vector<Tensor> in = promoted(xs, "stack");
  return call_op1(KILN_OP("stack"), in, {{"axis", axis}});
}

std::vector<Tensor> split(const Tensor& x, int64_t num, int64_t axis) {
  require_defined(x, "split");
  if (x.rank() == 0) throw InvalidArgumentError("split: input must have rank >= 1, got a scalar (rank 0)");
  int ax = normalize_axis(axis, x.rank(), "split axis");
  if (num <= 0) throw InvalidArgumentError(str_cat("split: number of parts must be >= 1, got ", num));
  if (x.dim(ax) % num != 0)
    throw InvalidArgumentError(str_cat("split: dimension ", ax, " of ", x.shape().str(), " (", x.dim(ax),
                                       ") is not divisible into ", num, " equal parts"));
  return split(x, std::vector<int64_t>(static_cast<size_t>(num), x.dim(ax) / num), axis);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  require_defined(x, "split");
  if (x.rank() == 0) throw InvalidArgumentError("split: input must have rank >= 1, got a scalar (rank 0)");
  int ax = normalize_axis(axis, x.rank(), "split axis");
  std::vector<int64_t> s = sizes;
  int64_t known = 0;
  int infer_at = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1 && infer_at < 0) {
      infer_at = static_cast<int>(i);
    } else if (s[i] < 0) {
      throw InvalidArgumentError(str_cat("split: part sizes must be >= 0 with at most one -1, got ", ints_str(sizes)));
    } else {
      known += s[i];
    }
  }
  if (infer_at >= 0) {
    if (known > x.dim(ax))
      throw InvalidArgumentError(str_cat("split: part sizes ", ints_str(sizes), " exceed dimension ", ax, " of ",
                                         x.shape().str(), " (", x.dim(ax), ")"));
    s[infer_at] = x.dim(ax) - known;
  }
  return call_op(KILN_OP("split"), std::span<const Tensor>(&x, 1), {{"axis", int64_t{ax}}, {"sizes", s}});
}

Tensor slice(const Tensor& x, const std::vector<int64_t>& begin, const std::vector<int64_t>& size) {
  require_defined(x, "slice");
  const Shape& s = x.shape();
  if (begin.size() != static_cast<size_t>(x.rank()) || size.size() != static_cast<size_t>(x.rank()))
    throw InvalidArgumentError(str_cat("slice: begin and size need ", x.rank(), " entries (the rank of ", s.str(),
                                       "), got ", begin.size(), " and ", size.size()));
  std::vector<int64_t> n(size.size());
  for (int d = 0; d < x.rank(); ++d) {
    if (begin[d] < 0 || begin[d] > s[d])
      throw OutOfRangeError(str_cat("slice: begin[", d, "] = ", begin[d], " is outside [0, ", s[d], "] for shape ",
                                    s.str()));
    n[d] = size[d] == -1 ? s[d] - begin[d] : size[d];
    if (n[d] < 0 || begin[d] + n[d] > s[d])
      throw OutOfRangeError(str_cat("slice: size[", d, "] = ", size[d], " with begin ", begin[d], " is outside [0, ",
                                    s[d] - begin[d], "] (or -1) for shape ", s.str()));
  }
  // Empty output dims get begin 0 so that the canonical form stays in range.
  std::vector<int64_t> b = begin;
  for (int d = 0; d < x.rank(); ++d)
    if (n[d] == 0) b[d] = 0;
  return call(KILN_OP("strided_slice"), x,
              {{"begin", b}, {"size", n}, {"strides", std::vector<int64_t>(begin.size(), 1)}});
}

Tensor strided_slice(const Tensor& x, const std::vector<int64_t>& begin, const std::vector<int64_t>& end,
                     const std::vector<int64_t>& strides) {
  require_defined(x, "strided_slice");
  const Shape& s = x.shape();
  std::vector<int64_t> st = strides.empty() ? std::vector<int64_t>(begin.size(), 1) : strides;
  if (begin.size() != end.size() || st.size() != begin.size())
    throw InvalidArgumentError(str_cat("strided_slice: begin, end and strides must have one length, got ",
                                       begin.size(), ", ", end.size(), " and ", strides.size()));
  if (begin.size() > static_cast<size_t>(x.rank()))
    throw InvalidArgumentError(str_cat("strided_slice: got ", begin.size(), " bounds for shape ", s.str(),
                                       " of rank ", x.rank()));
  std::vector<int64_t> b(x.rank(), 0), n(s.begin(), s.end()), step(x.rank(), 1);
  for (size_t d = 0; d < begin.size(); ++d) {
    if (st[d] == 0) throw InvalidArgumentError(str_cat("strided_slice: stride of dimension ", d, " is 0"));
    auto r = shape_detail::resolve_python_slice(begin[d], end[d], st[d], s[static_cast<int>(d)]);
    b[d] = r.count ? r.start : 0;
    n[d] = r.count;
    step[d] = st[d];
  }
  return call(KILN_OP("strided_slice"), x, {{"begin", b}, {"size", n}, {"strides", step}});
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& paddings, const std::string& mode,
           double value) {
  require_defined(x, "pad");
  std::vector<int64_t> p;
  for (auto& [lo, hi] : paddings) {
    p.push_back(lo);
    p.push_back(hi);
  }
  return call(KILN_OP("pad"), x, {{"paddings", p}, {"mode", mode}, {"value", value}});
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& reps) {
  require_defined(x, "tile");
  for (int64_t r : reps)
    if (r < 0) throw InvalidArgumentError(str_cat("tile: reps must be >= 0, got ", ints_str(reps)));
  std::vector<int64_t> r = reps;
  Shape s = x.shape();
  while (static_cast<int>(r.size()) < s.rank()) r.insert(r.begin(), 1);
  while (s.rank() < static_cast<int>(r.size())) s.insert(0, 1);
  Tensor xs = s == x.shape() ? x : view(x, s);
  return call(KILN_OP("tile"), xs, {{"reps", r}});
}

Tensor broadcast_to(const Tensor& x, const std::vector<int64_t>& shape) {
  require_defined(x, "broadcast_to");
  return call(KILN_OP("broadcast_to"), x, {{"shape", shape}});
}

}  // namespace kiln::ops
