// Softmax, log-softmax and layer normalisation written out of primitive ops become the
// fused ops (one pass over the rows instead of five to ten ops and their temporaries):
//   softmax:     e = exp(x - max(x, a)), e / sum(e, a)                  -> softmax(x, a)
//   log_softmax: s = x - max(x, a), s - log(sum(exp(s), a))             -> log_softmax(x, a)
//   layer_norm:  d = x - mean(x, A), v = mean(d * d | square(d), A) or var(x, A) (ddof 0),
//                d * rsqrt(v + eps) or d / sqrt(v + eps), then optionally * gamma and
//                + beta (of shape x.shape[A]: A the trailing axes)     -> layer_norm(x, gamma, beta, eps)
// Reductions over one axis (softmax) or the trailing axes (layer_norm), keepdims, floating
// dtypes; eps a one-element constant. Every intermediate must have no reader outside
// the pattern (else nothing is saved). A layer norm without gamma or beta gets constant
// ones or zeros. The fused kernels round differently from the op-by-op form (within a few
// ulps; softmax and layer_norm are the same formulas).
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "kiln/core/op_def.h"
#include "kiln/graph/passes.h"
#include "kiln/ops.h"
#include "pass_util.h"

namespace kiln::graph {
namespace {

using pass_util::is_op;

bool floating(DType t) { return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16; }

// One match attempt: the nodes it went through.
struct Match {
  const Graph& g;
  std::set<int> nodes;

  // The node producing v when it is op `name` (recorded), else null.
  const Node* op(ValueRef v, const char* name) {
    const Node& n = g.nodes[static_cast<size_t>(v.node)];
    if (v.index != 0 || !is_op(n, name)) return nullptr;
    nodes.insert(v.node);
    return &n;
  }
  // A keepdims reduction's axes, normalised and sorted (empty: not one).
  std::vector<int64_t> axes(const Node& r) const {
    if (!r.attrs.get_bool("keepdims", false)) return {};
    const int rank = g.meta(r.inputs[0]).shape.rank();
    std::vector<int64_t> a = r.attrs.get_ints("axes", {});
    if (a.empty())
      for (int k = 0; k < rank; ++k) a.push_back(k);
    for (int64_t& k : a) k = k < 0 ? k + rank : k;
    std::sort(a.begin(), a.end());
    return a;
  }
  // Every value of a matched node but `root` is read only inside the match.
  bool closed(int root, const std::map<ValueRef, int>& uses) const {
    std::map<ValueRef, int> inside;
    for (int m : nodes)
      for (ValueRef v : g.nodes[static_cast<size_t>(m)].inputs) ++inside[v];
    for (int m : nodes) {
      if (m == root) continue;
      for (size_t k = 0; k < g.nodes[static_cast<size_t>(m)].outputs.size(); ++k) {
        const ValueRef v{m, static_cast<int>(k)};
        auto u = uses.find(v);
        const int n_uses = u == uses.end() ? 0 : u->second;
        auto in = inside.find(v);
        if (n_uses != (in == inside.end() ? 0 : in->second)) return false;
      }
    }
    return true;
  }
};

struct Rewrite {
  const OpDef* op = nullptr;
  std::vector<ValueRef> inputs;
  Attrs attrs;
  std::vector<Tensor> missing;  // layer_norm: gamma/beta constants to insert (undefined: present)
};

// x - max(x, [a]) at sub node s: x and the axis.
std::optional<std::pair<ValueRef, int64_t>> shifted(Match& m, const Node& s) {
  const Node* mx = m.op(s.inputs[1], "max");
  if (!mx || mx->inputs[0] != s.inputs[0]) return std::nullopt;
  const std::vector<int64_t> a = m.axes(*mx);
  if (a.size() != 1) return std::nullopt;
  return std::make_pair(s.inputs[0], a[0]);
}

std::optional<Rewrite> softmax_at(Match& m, const Node& y) {
  if (is_op(y, "div")) {
    const Node* e = m.op(y.inputs[0], "exp");
    const Node* z = m.op(y.inputs[1], "sum");
    if (!e || !z || z->inputs[0] != y.inputs[0]) return std::nullopt;
    const Node* s = m.op(e->inputs[0], "sub");
    if (!s) return std::nullopt;
    auto xa = shifted(m, *s);
    if (!xa || m.axes(*z) != std::vector<int64_t>{xa->second}) return std::nullopt;
    return Rewrite{&OpRegistry::global().get("softmax"), {xa->first}, Attrs{{"axis", xa->second}}, {}};
  }
  if (is_op(y, "sub")) {
    const Node* s = m.op(y.inputs[0], "sub");
    const Node* l = m.op(y.inputs[1], "log");
    if (!s || !l) return std::nullopt;
    const Node* z = m.op(l->inputs[0], "sum");
    const Node* e = z ? m.op(z->inputs[0], "exp") : nullptr;
    if (!e || e->inputs[0] != y.inputs[0]) return std::nullopt;
    auto xa = shifted(m, *s);
    if (!xa || m.axes(*z) != std::vector<int64_t>{xa->second}) return std::nullopt;
    return Rewrite{&OpRegistry::global().get("log_softmax"), {xa->first}, Attrs{{"axis", xa->second}}, {}};
  }
  return std::nullopt;
}

// (x - mean(x, A)) normalised by the variance at node nv: x, eps, begin axis.
struct Normalized {
  ValueRef x;
  double eps;
  int64_t begin;
};
std::optional<Normalized> normalized(Match& m, ValueRef nv) {
  const Graph& g = m.g;
  const Node& n = g.nodes[static_cast<size_t>(nv.node)];
  if (nv.index != 0 || n.kind != NodeKind::kOp || n.inputs.size() != 2) return std::nullopt;
  // d * rsqrt(v + eps) (either order) or d / sqrt(v + eps).
  std::optional<ValueRef> d, ve;
  if (n.op->name == "mul") {
    for (int k = 0; k < 2 && !d; ++k)
      if (const Node* r = m.op(n.inputs[static_cast<size_t>(k)], "rsqrt")) {
        d = n.inputs[static_cast<size_t>(1 - k)];
        ve = r->inputs[0];
      }
  } else if (n.op->name == "div") {
    if (const Node* sq = m.op(n.inputs[1], "sqrt")) {
      d = n.inputs[0];
      ve = sq->inputs[0];
    }
  }
  if (!d) return std::nullopt;
  m.nodes.insert(nv.node);
  const Node* dn = m.op(*d, "sub");
  const Node* add = m.op(*ve, "add");
  if (!dn || !add) return std::nullopt;
  const ValueRef x = dn->inputs[0];
  const Node* mu = m.op(dn->inputs[1], "mean");
  if (!mu || mu->inputs[0] != x) return std::nullopt;
  const std::vector<int64_t> a = m.axes(*mu);
  const int rank = g.meta(x).shape.rank();
  if (a.empty() || a.back() != rank - 1 || a.front() != rank - static_cast<int64_t>(a.size())) return std::nullopt;
  // v + eps, either order.
  for (int k = 0; k < 2; ++k) {
    const Node& c = g.nodes[static_cast<size_t>(add->inputs[static_cast<size_t>(k)].node)];
    if (c.kind != NodeKind::kConstant || c.constant.numel() != 1) continue;
    const double eps = c.constant.get_double(0);
    if (!(eps >= 0)) continue;
    const ValueRef v = add->inputs[static_cast<size_t>(1 - k)];
    if (const Node* var = m.op(v, "var")) {
      if (var->inputs[0] == x && var->attrs.get_int("ddof", 0) == 0 && m.axes(*var) == a) return Normalized{x, eps, a[0]};
      continue;
    }
    const Node* mv = m.op(v, "mean");
    if (!mv || m.axes(*mv) != a) continue;
    const ValueRef q = mv->inputs[0];
    const Node* sq = m.op(q, "square");
    if ((sq && sq->inputs[0] == *d) ||
        (!sq && m.op(q, "mul") && g.nodes[static_cast<size_t>(q.node)].inputs[0] == *d &&
         g.nodes[static_cast<size_t>(q.node)].inputs[1] == *d))
      return Normalized{x, eps, a[0]};
  }
  return std::nullopt;
}

std::optional<Rewrite> layer_norm_at(Match& m, const Node& y, ValueRef yv) {
  const Graph& g = m.g;
  const TensorMeta& out = y.outputs[0];
  auto param = [&](ValueRef p, const Normalized& nz) {
    const TensorMeta& pm = g.meta(p);
    const Shape& xs = g.meta(nz.x).shape;
    if (pm.dtype != out.dtype || pm.shape.rank() != xs.rank() - nz.begin) return false;
    for (int k = 0; k < pm.shape.rank(); ++k)
      if (pm.shape[k] != xs[static_cast<int>(nz.begin) + k]) return false;
    return true;
  };
  // [add(.., beta)] over [mul(.., gamma)] over the normalised value, either operand
  // order; `tail` the add/mul nodes taken.
  auto attempt = [&](std::optional<ValueRef> g_in, std::optional<ValueRef> b_in, ValueRef core,
                     std::vector<int> tail) -> std::optional<Rewrite> {
    Match trial{g, {}};
    trial.nodes.insert(tail.begin(), tail.end());
    std::optional<Normalized> nz = normalized(trial, core);
    if (!nz || !floating(g.meta(nz->x).dtype) || g.meta(nz->x).shape != out.shape) return std::nullopt;
    if ((g_in && !param(*g_in, *nz)) || (b_in && !param(*b_in, *nz))) return std::nullopt;
    Rewrite r;
    r.op = &OpRegistry::global().get("layer_norm");
    r.attrs = Attrs{{"eps", nz->eps}, {"begin_axis", nz->begin}};
    r.inputs = {nz->x, g_in.value_or(ValueRef{}), b_in.value_or(ValueRef{})};
    Shape ps(std::vector<int64_t>(out.shape.dims().begin() + nz->begin, out.shape.dims().end()));
    r.missing = {g_in ? Tensor() : ops::ones(ps, out.dtype), b_in ? Tensor() : ops::zeros(ps, out.dtype)};
    m.nodes = std::move(trial.nodes);
    return r;
  };
  const int yi = yv.node;
  if (is_op(y, "add")) {
    for (int k = 0; k < 2; ++k) {
      const ValueRef inner = y.inputs[static_cast<size_t>(k)], b = y.inputs[static_cast<size_t>(1 - k)];
      const Node& in = g.nodes[static_cast<size_t>(inner.node)];
      if (is_op(in, "mul") && inner.index == 0)
        for (int j = 0; j < 2; ++j)
          if (auto r = attempt(in.inputs[static_cast<size_t>(1 - j)], b, in.inputs[static_cast<size_t>(j)], {yi, inner.node}))
            return r;
      if (auto r = attempt(std::nullopt, b, inner, {yi})) return r;
    }
    return std::nullopt;
  }
  if (is_op(y, "mul"))
    for (int j = 0; j < 2; ++j)
      if (auto r = attempt(y.inputs[static_cast<size_t>(1 - j)], std::nullopt, y.inputs[static_cast<size_t>(j)], {yi}))
        return r;
  return attempt(std::nullopt, std::nullopt, yv, {});
}

}  // namespace

void fuse_normalization_patterns(Graph& g) {
  // From the last node back, so that the outermost form matches first (a layer norm's
  // final add before its normalised core, which alone is a layer norm too); the nodes
  // a rewrite absorbed are not tried as roots again.
  std::map<ValueRef, int> uses = count_uses(g);
  std::set<int> absorbed;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& y = g.nodes[i];
    if (absorbed.count(static_cast<int>(i)) || y.kind != NodeKind::kOp || y.outputs.size() != 1 ||
        !floating(y.outputs[0].dtype))
      continue;
    const ValueRef yv{static_cast<int>(i), 0};
    Match m{g, {static_cast<int>(i)}};
    std::optional<Rewrite> r = softmax_at(m, y);
    if (r && g.meta(r->inputs[0]).shape != y.outputs[0].shape) r.reset();
    if (!r) {
      m.nodes = {static_cast<int>(i)};
      pass_util::Untraced compile_time;  // gamma/beta constants it may make
      r = layer_norm_at(m, y, yv);
      if (r) m.nodes.insert(static_cast<int>(i));
    }
    if (!r || !m.closed(static_cast<int>(i), uses)) continue;
    // Constants for a missing gamma or beta go right before the node, which moves, and
    // so do the nodes absorbed earlier that come after it (every input of the fused node
    // comes before it and stays).
    const int at = static_cast<int>(i);
    int inserted = 0;
    for (size_t k = 0; k < r->missing.size(); ++k)
      if (r->missing[k].defined()) {
        r->inputs[k + 1] = pass_util::insert_constant(g, at + inserted, r->missing[k]);
        ++inserted;
      }
    if (inserted > 0) {
      std::set<int> shifted;
      for (int a : absorbed) shifted.insert(a >= at ? a + inserted : a);
      absorbed = std::move(shifted);
      uses = count_uses(g);  // the inserts moved the keys
    }
    for (int n : m.nodes)
      if (n != at) absorbed.insert(n);  // all before the root: not moved
    Node& fused = g.nodes[static_cast<size_t>(at + inserted)];
    fused.op = r->op;
    fused.inputs = r->inputs;
    fused.attrs = r->attrs;
  }
}

}  // namespace kiln::graph
