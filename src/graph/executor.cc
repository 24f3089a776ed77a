#include "kiln/graph/executor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <list>
#include <optional>
#include <set>

#include "kiln/core/allocator.h"
#include "kiln/core/denormals.h"
#include "kiln/core/dispatch.h"
#include "kiln/core/error.h"
#include "kiln/core/flags.h"
#include "kiln/core/op_def.h"
#include "kiln/core/parallel.h"
#include "kiln/graph/profiler.h"
#include "meta_key.h"

namespace kiln::graph {
namespace {

// The plan cache's key: the device, then each input's dtype and shape.
std::string key_of(const std::vector<TensorMeta>& in, Device device) {
  std::string k;
  detail::append_key(k, static_cast<int64_t>(device.type));
  detail::append_key(k, device.index);
  for (const TensorMeta& m : in) detail::append_key(k, m.dtype, m.shape);
  return k;
}

size_t align_up(size_t n) { return (n + Allocator::kAlignment - 1) / Allocator::kAlignment * Allocator::kAlignment; }

// First-fit free list over [0, end): returns offsets, reuses freed ranges best-fit.
class ArenaPlanner {
 public:
  size_t allocate(size_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    if (best == free_.end()) {
      // Grow: merge with a free block that ends at the current end.
      if (!free_.empty() && free_.back().first + free_.back().second == end_) {
        size_t off = free_.back().first;
        free_.pop_back();
        end_ = off + bytes;
        return off;
      }
      size_t off = end_;
      end_ += bytes;
      return off;
    }
    size_t off = best->first;
    if (best->second == bytes) {
      free_.erase(best);
    } else {
      best->first += bytes;
      best->second -= bytes;
    }
    return off;
  }
  void release(size_t off, size_t bytes) {
    auto it = free_.begin();
    while (it != free_.end() && it->first < off) ++it;
    it = free_.insert(it, {off, bytes});
    // Coalesce with neighbours.
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  size_t end() const { return end_; }

 private:
  std::list<std::pair<size_t, size_t>> free_;  // sorted by offset
  size_t end_ = 0;
};

bool is_view_op(const OpDef* op) { return op && op->traits.view; }

// Execution order: one stage per node in graph order, except that two independent heavy
// nodes (matmuls and convolutions, within kPairWindow nodes of each other, of similar
// work) share a stage and run at once, each on one thread (kiln::parallel_invoke). The
// later node joins the earlier one only when every op it reads runs before it.
// It pays only where kernels scale poorly over the pool; on the 2-core development VM
// they scale ~1.8x and pairs gained nothing (docs/benchmarks.md), so it is off unless
// KernelPreferences::parallel_branches (KILN_PARALLEL_BRANCHES=1). Stage = {node, partner or -1}.
using Stage = std::array<int, 2>;
constexpr size_t kPairWindow = 16;
constexpr double kMinPairWork = 1e6;  // ~ multiply-adds: smaller kernels finish before the pair pays
constexpr double kPairBalance = 0.6;  // the lighter node has at least this share of the heavier's work

bool parallel_branches_enabled() {
  return kernel_preferences().parallel_branches && num_threads() >= 2;
}

std::vector<Stage> schedule(const Graph& g, const std::function<const TensorMeta&(ValueRef)>& meta, bool pairs) {
  const size_t n = g.nodes.size();
  // Work of a heavy node: sqrt(|a| |b| |out|), M*K*N for a matmul (the same order for a
  // convolution and its gradients); 0 for everything else.
  std::vector<double> work(n, 0.0);
  for (size_t i = 0; pairs && i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (nd.kind != NodeKind::kOp || nd.inputs.size() < 2) continue;
    if (!nd.op->traits.heavy) continue;  // OpTraits::heavy: matmuls, convolutions
    work[i] = std::sqrt(static_cast<double>(meta(nd.inputs[0]).shape.numel()) *
                        static_cast<double>(meta(nd.inputs[1]).shape.numel()) *
                        static_cast<double>(nd.outputs[0].shape.numel()));
  }
  // Inputs, constants and variable reads first: they depend on nothing (variables are
  // assigned after the run), so a moved node never waits for one.
  std::vector<char> taken(n, 0);
  std::vector<Stage> stages;
  for (size_t i = 0; i < n; ++i)
    if (g.nodes[i].kind != NodeKind::kOp) {
      taken[i] = 1;
      stages.push_back({static_cast<int>(i), -1});
    }
  for (size_t a = 0; a < n; ++a) {
    if (taken[a]) continue;
    int partner = -1;
    for (size_t b = a + 1; work[a] >= kMinPairWork && b < n && b <= a + kPairWindow && partner < 0; ++b) {
      if (taken[b] || work[b] < kMinPairWork || std::min(work[a], work[b]) < kPairBalance * std::max(work[a], work[b]))
        continue;
      bool ready = true;
      for (ValueRef v : g.nodes[b].inputs)
        ready &= static_cast<size_t>(v.node) < a || g.nodes[static_cast<size_t>(v.node)].kind != NodeKind::kOp;
      if (ready) partner = static_cast<int>(b);
    }
    if (partner >= 0) taken[static_cast<size_t>(partner)] = 1;
    stages.push_back({static_cast<int>(a), partner});
  }
  return stages;
}

}  // namespace

struct Executor::Plan {
  // kOverwrite: an assigned value written over its variable's buffer (input
  // `overwrite` of the node) when the run finds that buffer exclusive, else pinned.
  enum class Where : uint8_t { kExternal, kArena, kPinned, kView, kOverwrite };
  struct Buf {
    Where where = Where::kExternal;
    size_t offset = 0;
    TensorMeta meta;
    int overwrite = -1;  // kOverwrite: the input it overwrites
    size_t update = 0;   // kOverwrite: its variable in Plan::updated
  };
  // What one run writes: an arena and the per-node handles (kept from run to run so a
  // run allocates nothing per op). Concurrent runs of one plan take distinct states.
  struct RunState {
    std::vector<std::vector<Tensor>> in, out;  // per node
    std::vector<std::unique_ptr<Attrs>> redrawn;  // per node: a random op's attrs for this run
    std::shared_ptr<Storage> arena;
    std::vector<uint8_t> exclusive;  // per updated variable: its buffer may be overwritten this run
  };
  Device device;                       // where the plan runs
  std::vector<Tensor> constants;       // per node: a constant copied to `device` (off the CPU only)
  std::vector<std::vector<Buf>> bufs;  // per node, per output
  // Per op node: its kernel prepared for this plan's shapes (null: a view, no kernel),
  // and the PrepareFn that made it (null: a plain kernel).
  std::vector<std::unique_ptr<const PreparedKernel>> kernels;
  std::vector<PrepareFn> prepared_by;
  std::vector<Stage> stages;                 // execution order (schedule())
  std::vector<std::vector<size_t>> outputs_at;  // per stage: the graph outputs its nodes make
  size_t arena_bytes = 0;
  std::vector<Variable> updated;  // variables whose assigned values are kOverwrite buffers
  MemoryPlanStats stats;
  std::mutex pool_mu;
  std::vector<std::unique_ptr<RunState>> pool;  // idle run states

  std::unique_ptr<RunState> acquire() {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (!pool.empty()) {
        auto s = std::move(pool.back());
        pool.pop_back();
        return s;
      }
    }
    auto s = std::make_unique<RunState>();
    s->in.resize(bufs.size());
    s->out.resize(bufs.size());
    s->redrawn.resize(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) s->out[i].resize(bufs[i].size());
    if (arena_bytes > 0) s->arena = std::make_shared<Storage>(arena_bytes, device);
    return s;
  }
  void release(std::unique_ptr<RunState> s) {
    std::lock_guard<std::mutex> lock(pool_mu);
    pool.push_back(std::move(s));
  }
  Buf& buf(ValueRef v) { return bufs[static_cast<size_t>(v.node)][static_cast<size_t>(v.index)]; }
  // The buffer a value lives in: views resolved to what they view.
  ValueRef root(const Graph& g, ValueRef v) const {
    while (bufs[static_cast<size_t>(v.node)][static_cast<size_t>(v.index)].where == Where::kView)
      v = g.nodes[static_cast<size_t>(v.node)].inputs[0];
    return v;
  }
};

// When each buffer is last read: the stage of every node and, per buffer root, the
// stage of its last reader.
struct Executor::Liveness {
  std::vector<size_t> stage_of;       // per node
  std::map<ValueRef, size_t> last_use;  // per buffer root
};

Executor::Executor(Graph graph) : graph_(std::move(graph)) {
  graph_.check();
  // Random nodes that shared their randomness in the trace share it in every run: a
  // dropout and its gradient (the same op and attrs) apply one mask.
  redraw_from_.assign(graph_.nodes.size(), -1);
  std::map<std::string, int> first;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (!n.stateful()) continue;
    redraw_from_[i] = first.emplace(n.op->name + "|" + n.attrs.str(), static_cast<int>(i)).first->second;
  }
}
Executor::~Executor() = default;

Device Executor::run_device(const std::vector<Tensor>& inputs) const {
  std::optional<Device> dev;
  for (const Node& node : graph_.nodes) {
    if (node.kind != NodeKind::kVariable) continue;
    const Device d = node.variable.peek().device();
    if (dev && *dev != d && !(dev->type == DeviceType::kCPU && d.type == DeviceType::kCPU))
      throw InvalidArgumentError("graph: its variables are on several devices (" + dev->str() + " and " + d.str() +
                                 "); a graph runs on one device");
    if (!dev) dev = d;
  }
  if (!dev)
    for (const Tensor& t : inputs)
      if (t.defined() && t.device().type != DeviceType::kCPU) {
        dev = t.device();
        break;
      }
  // Outputs and the arena go on that device (for a logical CPU device: its allocator).
  return dev ? *dev : Device::cpu();
}

// An assignment var := output k of node N is written over var's buffer when N's op may
// overwrite its input j with output k (OpDef::overwritable), input j is var's value
// itself (not a view of it), and every other read of that value (through views too)
// runs in an earlier stage; the value is then neither a graph output nor assigned to
// another variable. Each run still checks that the buffer is exclusive (nothing outside
// the variable holds it: Variable::value_is_exclusive) and pins a new buffer if not.
void Executor::plan_variable_updates(Plan& p, const std::vector<size_t>& stage_of) const {
  auto buf = [&](ValueRef v) -> Plan::Buf& { return p.buf(v); };
  auto root = [&](ValueRef v) { return p.root(graph_, v); };
  for (const Assignment& a : graph_.assignments) {
    const ValueRef val = a.value;
    const Node& n = graph_.nodes[static_cast<size_t>(val.node)];
    if (n.kind != NodeKind::kOp || buf(val).where != Plan::Where::kPinned) continue;
    int j = -1;
    for (size_t q = 0; q < n.inputs.size(); ++q) {
      const Node& src = graph_.nodes[static_cast<size_t>(n.inputs[q].node)];
      if (src.kind == NodeKind::kVariable && src.variable.is_same(a.variable) &&
          n.op->may_overwrite(val.index, static_cast<int>(q)))
        j = static_cast<int>(q);
    }
    if (j < 0) continue;
    auto is_var = [&](ValueRef v) {
      const Node& src = graph_.nodes[static_cast<size_t>(root(v).node)];
      return src.kind == NodeKind::kVariable && src.variable.is_same(a.variable);
    };
    const size_t at = stage_of[static_cast<size_t>(val.node)];
    bool ok = true;
    for (size_t i = 0; ok && i < graph_.nodes.size(); ++i)
      for (size_t q = 0; ok && q < graph_.nodes[i].inputs.size(); ++q)
        if (is_var(graph_.nodes[i].inputs[q]) && !(i == static_cast<size_t>(val.node) && q == static_cast<size_t>(j)))
          ok = stage_of[i] < at;
    for (ValueRef o : graph_.outputs) ok = ok && !is_var(o);
    for (const Assignment& b : graph_.assignments) ok = ok && !is_var(b.value);
    if (!ok) continue;
    Plan::Buf& b = buf(val);
    b.where = Plan::Where::kOverwrite;
    b.overwrite = j;
    b.update = p.updated.size();
    p.updated.push_back(a.variable);
  }
}

// 1. Shapes and kernels: every node's output metas (the inputs checked against the
// graph, the ops' shape inference) and its kernel for the plan's device, prepared for
// these shapes with the graph's constants (seen through reshape views); `previous` (may
// be null), another plan of this graph, lends its prepared kernels to share from.
void Executor::plan_shapes(Plan& p, const std::vector<TensorMeta>& inputs, const Plan* previous) const {
  const size_t n = graph_.nodes.size();
  p.kernels.clear();
  p.kernels.resize(n);
  p.prepared_by.assign(n, nullptr);
  auto constant_of = [&](ValueRef v, const TensorMeta& meta) {
    while (is_view_op(graph_.nodes[static_cast<size_t>(v.node)].op)) v = graph_.nodes[static_cast<size_t>(v.node)].inputs[0];
    const Node& src = graph_.nodes[static_cast<size_t>(v.node)];
    if (src.kind != NodeKind::kConstant) return Tensor();
    const Tensor& t = p.constants.empty() ? src.constant : p.constants[static_cast<size_t>(v.node)];
    return t.shape() == meta.shape ? t : t.reshape(meta.shape);
  };
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph_.nodes[i];
    std::vector<TensorMeta> metas;
    switch (node.kind) {
      case NodeKind::kInput: {
        const TensorMeta& got = inputs[static_cast<size_t>(node.input_index)];
        if (got.dtype != node.outputs[0].dtype)
          throw InvalidArgumentError("graph: input " + std::to_string(node.input_index) + " should be " +
                                     std::string(dtype_name(node.outputs[0].dtype)) + ", got " +
                                     std::string(dtype_name(got.dtype)));
        metas = {got};
        break;
      }
      case NodeKind::kConstant:
      case NodeKind::kVariable: metas = node.outputs; break;
      case NodeKind::kOp: {
        std::vector<TensorMeta> in;
        for (ValueRef v : node.inputs) in.push_back(p.buf(v).meta);
        try {
          metas = node.op->infer(in, node.attrs);
        } catch (const Error& e) {
          throw InvalidArgumentError("graph: node %" + std::to_string(i) + " (" + node.op->name +
                                     ") rejects these input shapes: " + e.message());
        }
        if (is_view_op(node.op)) break;
        const DType key = node.op->dispatch_input >= 0 ? in.at(static_cast<size_t>(node.op->dispatch_input)).dtype
                                                       : metas.at(0).dtype;
        if (!node.op->kernel(p.device.type, key))
          throw UnimplementedError("graph: op '" + node.op->name + "' has no " + device_type_name(p.device.type) +
                                   " kernel for dtype " + std::string(dtype_name(key)));
        std::vector<Tensor> constants(node.inputs.size());
        for (size_t j = 0; j < node.inputs.size(); ++j) constants[j] = constant_of(node.inputs[j], in[j]);
        p.prepared_by[i] = node.op->prepare(p.device.type, key);
        const PreparedKernel* prev =
            previous && p.prepared_by[i] && previous->prepared_by[i] == p.prepared_by[i] ? previous->kernels[i].get()
                                                                                      : nullptr;
        try {
          p.kernels[i] = prepare_kernel({*node.op, p.device.type, in, metas, constants, node.attrs, prev});
        } catch (const Error& e) {
          throw InvalidArgumentError("graph: node %" + std::to_string(i) + " (" + node.op->name +
                                     ") cannot be prepared for these input shapes: " + e.message());
        }
        break;
      }
    }
    p.bufs[i].resize(metas.size());
    for (size_t k = 0; k < metas.size(); ++k) {
      Plan::Buf& b = p.bufs[i][k];
      b.meta = metas[k];
      if (node.kind == NodeKind::kOp) b.where = is_view_op(node.op) ? Plan::Where::kView : Plan::Where::kArena;
    }
  }
}

// 2. The schedule and liveness on buffer roots (a view's reads keep its root alive);
// pins the outputs and assigned values and marks the variable updates made in place.
Executor::Liveness Executor::plan_liveness(Plan& p) const {
  auto meta = [&](ValueRef v) -> const TensorMeta& { return p.buf(v).meta; };
  p.stages = schedule(graph_, meta, p.device.type == DeviceType::kCPU && parallel_branches_enabled());
  Liveness l;
  l.stage_of.resize(graph_.nodes.size());
  for (size_t s = 0; s < p.stages.size(); ++s)
    for (int i : p.stages[s])
      if (i >= 0) l.stage_of[static_cast<size_t>(i)] = s;
  for (size_t i = 0; i < graph_.nodes.size(); ++i)
    for (ValueRef v : graph_.nodes[i].inputs) {
      size_t& lu = l.last_use[p.root(graph_, v)];
      lu = std::max(lu, l.stage_of[i]);
    }
  auto pin = [&](ValueRef v) {
    Plan::Buf& b = p.buf(p.root(graph_, v));
    if (b.where == Plan::Where::kArena) b.where = Plan::Where::kPinned;
  };
  for (ValueRef o : graph_.outputs) pin(o);
  for (const Assignment& a : graph_.assignments) pin(a.value);
  p.outputs_at.assign(p.stages.size(), {});
  for (size_t k = 0; k < graph_.outputs.size(); ++k)
    p.outputs_at[l.stage_of[static_cast<size_t>(graph_.outputs[k].node)]].push_back(k);
  plan_variable_updates(p, l.stage_of);
  return l;
}

// 3. Offsets: allocate a stage's outputs, then release what it read for the last time
// (the two nodes of a stage run at once: neither may reuse what the other reads).
// A lone node whose output may overwrite an input (OpDef::overwritable) takes over the
// buffer of such an input of its output's shape and dtype whose last reader it is;
// that buffer then lives as long as the output.
void Executor::plan_offsets(Plan& p, const Liveness& l) const {
  auto bytes_of = [](const TensorMeta& m) { return static_cast<int64_t>(m.shape.numel()) * static_cast<int64_t>(dtype_size(m.dtype)); };
  ArenaPlanner arena;
  std::map<size_t, std::vector<ValueRef>> frees;  // stage -> buffers whose last reader it holds
  std::set<ValueRef> taken_over;                  // buffers an in-place output now owns
  auto in_place_source = [&](size_t i, size_t st) -> std::optional<ValueRef> {
    const Node& node = graph_.nodes[i];
    if (p.device.type != DeviceType::kCPU || p.stages[st][1] >= 0 || node.outputs.size() != 1 ||
        node.op->overwritable.empty())
      return std::nullopt;
    const TensorMeta& out = p.bufs[i][0].meta;
    for (size_t q = 0; q < node.inputs.size(); ++q) {
      const ValueRef v = node.inputs[q];
      if (!node.op->may_overwrite(0, static_cast<int>(q))) continue;
      const ValueRef r = p.root(graph_, v);
      if (p.buf(r).where == Plan::Where::kArena && !taken_over.count(r) && l.last_use.at(r) == st &&
          p.buf(v).meta.shape == out.shape && p.buf(v).meta.dtype == out.dtype)
        return r;
    }
    return std::nullopt;
  };
  for (size_t st = 0; st < p.stages.size(); ++st) {
    for (const int node : p.stages[st]) {
      if (node < 0) continue;
      const size_t i = static_cast<size_t>(node);
      for (size_t k = 0; k < p.bufs[i].size(); ++k) {
        Plan::Buf& b = p.bufs[i][k];
        const int64_t bytes = bytes_of(b.meta);
        if (b.where == Plan::Where::kPinned) p.stats.pinned_bytes += bytes;
        if (b.where == Plan::Where::kOverwrite) ++p.stats.updated_in_place;
        if (b.where != Plan::Where::kArena) continue;
        const size_t sz = align_up(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
        if (const std::optional<ValueRef> src = in_place_source(i, st)) {
          b.offset = p.buf(*src).offset;
          taken_over.insert(*src);
          ++p.stats.in_place;
        } else {
          b.offset = arena.allocate(sz);
        }
        p.stats.naive_bytes += static_cast<int64_t>(sz);
        ++p.stats.num_buffers;
        const ValueRef self{node, static_cast<int>(k)};
        auto lu = l.last_use.find(self);
        frees[lu == l.last_use.end() ? st : lu->second].push_back(self);  // unread outputs die at once
      }
    }
    if (auto f = frees.find(st); f != frees.end())
      for (ValueRef v : f->second) {
        if (taken_over.count(v)) continue;
        const Plan::Buf& b = p.buf(v);
        arena.release(b.offset, align_up(static_cast<size_t>(std::max<int64_t>(bytes_of(b.meta), 1))));
      }
  }
  p.stats.arena_bytes = static_cast<int64_t>(arena.end());
  p.arena_bytes = arena.end();
}

std::shared_ptr<Executor::Plan> Executor::plan_for(const std::vector<TensorMeta>& inputs, Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string key = key_of(inputs, device);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  if (static_cast<int>(inputs.size()) != graph_.num_inputs)
    throw InvalidArgumentError("graph: expected " + std::to_string(graph_.num_inputs) + " inputs, got " +
                               std::to_string(inputs.size()));
  auto p = std::make_shared<Plan>();
  p->device = device;
  const size_t n = graph_.nodes.size();
  p->bufs.resize(n);
  if (device.type != DeviceType::kCPU) {
    p->constants.resize(n);
    for (size_t i = 0; i < n; ++i)
      if (graph_.nodes[i].kind == NodeKind::kConstant) p->constants[i] = graph_.nodes[i].constant.to(device);
  }
  plan_shapes(*p, inputs, plan_order_.empty() ? nullptr : plans_.at(plan_order_.back()).get());
  plan_offsets(*p, plan_liveness(*p));
  // Bounded: callers with ever-new shapes (a server's batch sizes) must not grow the
  // cache without limit. Evicted plans live on while a run holds them.
  if (plans_.size() >= kMaxPlans) {
    plans_.erase(plan_order_.front());
    plan_order_.erase(plan_order_.begin());
  }
  plan_order_.push_back(key);
  return plans_.emplace(key, std::move(p)).first->second;
}

MemoryPlanStats Executor::memory_stats(const std::vector<TensorMeta>& inputs) { return plan_for(inputs)->stats; }

std::vector<TensorMeta> Executor::output_metas(const std::vector<TensorMeta>& inputs) {
  std::shared_ptr<Plan> p = plan_for(inputs);
  std::vector<TensorMeta> out;
  for (ValueRef o : graph_.outputs) out.push_back(p->bufs[static_cast<size_t>(o.node)][static_cast<size_t>(o.index)].meta);
  return out;
}

std::shared_ptr<Executor::Plan> Executor::plan_for_run(const std::vector<Tensor>& inputs, Device device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_plan_ && last_device_ == device && detail::same_metas(last_metas_, inputs)) return last_plan_;
  }
  std::vector<TensorMeta> metas = detail::metas_of(inputs);
  std::shared_ptr<Plan> plan = plan_for(metas, device);
  std::lock_guard<std::mutex> lock(mu_);
  last_metas_ = std::move(metas);
  last_device_ = device;
  last_plan_ = plan;
  return plan;
}

std::vector<Tensor> Executor::run(const std::vector<Tensor>& inputs, const OutputReady& ready) {
  kiln::detail::DenormalScope denormals;  // the kernels below are called directly, not through ops
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined()) throw InvalidArgumentError("graph: input " + std::to_string(i) + " is undefined");
  const Device device = run_device(inputs);
  // Inputs on another device are copied to the run's (a host step counter for a
  // graph on the GPU, say); CPU inputs on any logical CPU device stay as they are.
  std::vector<Tensor> moved;
  const std::vector<Tensor>* args = &inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Device d = inputs[i].device();
    if (d == device || (d.type == DeviceType::kCPU && device.type == DeviceType::kCPU)) continue;
    if (moved.empty()) moved = inputs;
    moved[i] = inputs[i].to(device);
    args = &moved;
  }
  std::shared_ptr<Plan> plan = plan_for_run(*args, device);
  Plan& p = *plan;
  std::unique_ptr<Plan::RunState> state = p.acquire();
  Plan::RunState& rs = *state;
  // Checked before the variable nodes take their handles.
  rs.exclusive.resize(p.updated.size());
  for (size_t u = 0; u < p.updated.size(); ++u) rs.exclusive[u] = p.updated[u].value_is_exclusive();
  const bool profile = profiling();
  const size_t n = graph_.nodes.size();
  auto run_node = [&](size_t i) {
    const Node& node = graph_.nodes[i];
    std::vector<Tensor>& out = rs.out[i];
    switch (node.kind) {
      case NodeKind::kInput: out[0] = (*args)[static_cast<size_t>(node.input_index)]; return;
      case NodeKind::kConstant: out[0] = p.constants.empty() ? node.constant : p.constants[i]; return;
      case NodeKind::kVariable: out[0] = node.variable.peek(); return;
      case NodeKind::kOp: break;
    }
    std::vector<Tensor>& in = rs.in[i];
    in.resize(node.inputs.size());
    for (size_t j = 0; j < node.inputs.size(); ++j)
      in[j] = rs.out[static_cast<size_t>(node.inputs[j].node)][static_cast<size_t>(node.inputs[j].index)];
    for (size_t k = 0; k < out.size(); ++k) {
      const Plan::Buf& b = p.bufs[i][k];
      if (b.where == Plan::Where::kView) out[k] = in[0].reshape(b.meta.shape);
      else if (b.where == Plan::Where::kOverwrite && rs.exclusive[b.update])
        out[k] = in[static_cast<size_t>(b.overwrite)];
      else if (b.where == Plan::Where::kPinned || b.where == Plan::Where::kOverwrite)
        out[k] = Tensor::empty(b.meta.shape, b.meta.dtype, p.device);
      else out[k] = Tensor(rs.arena, b.offset, b.meta.shape, b.meta.dtype);
    }
    if (p.kernels[i] && p.bufs[i][0].where != Plan::Where::kView) {
      const Attrs* attrs = &node.attrs;
      if (const int from = redraw_from_[i]; from >= 0) {  // fresh random numbers for this run
        std::unique_ptr<Attrs>& a = rs.redrawn[static_cast<size_t>(from)];
        if (from == static_cast<int>(i)) {
          if (!a) a = std::make_unique<Attrs>(node.attrs);
          node.op->redraw(*a);
        }
        attrs = a.get();
      }
      OpContext ctx{*node.op, in, out, *attrs};
      if (profile) {
        const double t0 = detail::now_us();
        p.kernels[i]->run(ctx);
        const TensorMeta& m = p.bufs[i][0].meta;
        detail::record_op(node.op->name, static_cast<int>(i), std::string(dtype_name(m.dtype)) + m.shape.str(), t0,
                          detail::now_us() - t0);
      } else {
        p.kernels[i]->run(ctx);
      }
    }
  };
  auto value = [&](ValueRef v) { return rs.out[static_cast<size_t>(v.node)][static_cast<size_t>(v.index)]; };
  std::vector<Tensor> results(graph_.outputs.size());
  auto make_result = [&](size_t k) {
    // A constant returned as is would let callers write into the graph's weights (or
    // into a read-only mapped package): give them a copy.
    const ValueRef o = graph_.outputs[k];
    ValueRef r = o;
    while (is_view_op(graph_.nodes[static_cast<size_t>(r.node)].op)) r = graph_.nodes[static_cast<size_t>(r.node)].inputs[0];
    const bool constant = graph_.nodes[static_cast<size_t>(r.node)].kind == NodeKind::kConstant;
    results[k] = constant ? value(o).clone() : value(o);
    if (ready) ready(k, results[k]);
  };
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const Stage& st = p.stages[s];
    if (st[1] < 0) {
      run_node(static_cast<size_t>(st[0]));
    } else {
      parallel_invoke([&] { run_node(static_cast<size_t>(st[0])); }, [&] { run_node(static_cast<size_t>(st[1])); });
    }
    for (size_t k : p.outputs_at[s]) make_result(k);
  }
  for (const Assignment& a : graph_.assignments) a.variable.assign(value(a.value));
  // Drop the per-node handles so arena views do not outlive the run.
  for (size_t i = 0; i < n; ++i) {
    for (Tensor& t : rs.in[i]) t = Tensor();
    for (Tensor& t : rs.out[i]) t = Tensor();
  }
  p.release(std::move(state));
  return results;
}

}  // namespace kiln::graph
