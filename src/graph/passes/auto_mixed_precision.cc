// Automatic mixed precision (kiln/graph/auto_mixed_precision.h): paint, then rewrite.
//
// Paint: allow-list ops are 16-bit. In topological order an infer or clear op becomes
// 16-bit when every float input it reads from an op comes from a 16-bit op (constants,
// variables and graph inputs do not block it) and at least one does; in reverse order
// an infer op that no 16-bit op reads goes back to f32 (grappler's "between allow
// ops": a ReLU feeding only a softmax gains nothing and would cost a cast). Clear ops
// keep their paint: they only move data.
// Rewrite: the nodes are copied in order into a new graph with casts inserted where a
// value crosses precisions (one cast per value and direction).
#include <cstdlib>
#include <map>

#include "kiln/core/error.h"
#include "kiln/core/op_def.h"
#include "kiln/graph/auto_mixed_precision.h"

namespace kiln::graph {

const AmpLists& default_amp_lists() {
  // From the ops' traits (OpTraits::amp, src/ops/op_traits.cc).
  static const AmpLists lists = [] {
    AmpLists l;
    for (const OpDef* d : OpRegistry::global().all()) switch (d->traits.amp) {
        case AmpClass::kAllow: l.allow.insert(d->name); break;
        case AmpClass::kInfer: l.infer.insert(d->name); break;
        case AmpClass::kClear: l.clear.insert(d->name); break;
        case AmpClass::kDeny: break;
      }
    return l;
  }();
  return lists;
}

int auto_mixed_precision(Graph& g, DType low, const AmpLists& lists) {
  if (low != DType::kBF16 && low != DType::kF16)
    throw InvalidArgumentError("auto_mixed_precision: the 16-bit type must be bf16 or f16, got " +
                               std::string(dtype_name(low)));
  const size_t n = g.nodes.size();
  enum Role : uint8_t { kNone, kAllow, kInfer, kClear };
  std::vector<Role> role(n, kNone);
  // Candidates: listed ops whose float inputs and outputs are all f32 and which have a
  // 16-bit kernel.
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (nd.kind != NodeKind::kOp || nd.stateful()) continue;
    const std::string& name = nd.op->name;
    const Role r = lists.allow.count(name) ? kAllow : lists.infer.count(name) ? kInfer : lists.clear.count(name) ? kClear : kNone;
    if (r == kNone || !nd.op->kernel(DeviceType::kCPU, low)) continue;
    bool ok = true, any = false;
    for (ValueRef v : nd.inputs) {
      const DType d = g.meta(v).dtype;
      any |= d == DType::kF32;
      ok &= d == DType::kF32 || !is_floating(d);
    }
    for (const TensorMeta& m : nd.outputs) ok &= m.dtype == DType::kF32 || !is_floating(m.dtype);
    if (ok && any) role[i] = r;
  }
  std::vector<char> lowp(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (role[i] == kAllow) {
      lowp[i] = 1;
      continue;
    }
    if (role[i] != kInfer && role[i] != kClear) continue;
    bool fed = false, blocked = false;
    for (ValueRef v : g.nodes[i].inputs) {
      const Node& src = g.nodes[static_cast<size_t>(v.node)];
      if (src.kind != NodeKind::kOp || g.meta(v).dtype != DType::kF32) continue;
      (lowp[static_cast<size_t>(v.node)] ? fed : blocked) = true;
    }
    lowp[i] = fed && !blocked;
  }
  std::vector<char> read_by_low(n, 0);
  for (size_t i = n; i-- > 0;) {
    if (lowp[i] && role[i] == kInfer && !read_by_low[i]) lowp[i] = 0;
    if (lowp[i])
      for (ValueRef v : g.nodes[i].inputs) read_by_low[static_cast<size_t>(v.node)] = 1;
  }

  // Rewrite into a new node list.
  const OpDef& cast_op = OpRegistry::global().get("cast");
  Graph out;
  out.num_inputs = g.num_inputs;
  std::map<ValueRef, ValueRef> moved;               // old value -> new value
  std::map<std::pair<ValueRef, DType>, ValueRef> cast_of;  // new value, dtype -> its cast
  auto cast = [&](ValueRef v, DType to) -> ValueRef {
    if (out.meta(v).dtype == to) return v;
    auto [it, fresh] = cast_of.try_emplace({v, to});
    if (!fresh) return it->second;
    const Node& src = out.nodes[static_cast<size_t>(v.node)];
    Node c;
    if (src.kind == NodeKind::kConstant) {  // converted once, not on every run
      c.kind = NodeKind::kConstant;
      c.constant = src.constant.to(to);
      c.outputs = {{src.constant.shape(), to}};
    } else {
      c.kind = NodeKind::kOp;
      c.op = &cast_op;
      c.attrs.set("dtype", to);
      c.inputs = {v};
      c.outputs = {{out.meta(v).shape, to}};
    }
    it->second = ValueRef{out.add(std::move(c)), 0};
    return it->second;
  };
  int converted = 0;
  for (size_t i = 0; i < n; ++i) {
    Node nd = g.nodes[i];
    for (ValueRef& v : nd.inputs) {
      const DType was = g.meta(v).dtype;
      v = moved.at(v);
      if (lowp[i] && was == DType::kF32) v = cast(v, low);
      else if (!lowp[i] && was == DType::kF32) v = cast(v, DType::kF32);  // a value that became 16-bit
    }
    if (lowp[i]) {
      std::vector<TensorMeta> in;
      for (ValueRef v : nd.inputs) in.push_back(out.meta(v));
      nd.outputs = nd.op->infer(in, nd.attrs);
      ++converted;
    }
    const size_t outputs = nd.outputs.size();
    const int at = out.add(std::move(nd));
    for (size_t k = 0; k < outputs; ++k) moved[{static_cast<int>(i), static_cast<int>(k)}] = {at, static_cast<int>(k)};
  }
  auto restore = [&](ValueRef v) { return cast(moved.at(v), g.meta(v).dtype); };
  for (ValueRef& v : g.outputs) v = restore(v);
  for (Assignment& a : g.assignments) a.value = restore(a.value);
  out.outputs = std::move(g.outputs);
  out.assignments = std::move(g.assignments);
  g = std::move(out);
  return converted;
}

}  // namespace kiln::graph
