// kiln convert: optimised graphs stored, weights lowered to 16 bits, or int8 PTQ.
#include "kiln/package/convert.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "kiln/core/dispatch.h"
#include "kiln/core/error.h"
#include "kiln/core/op_def.h"
#include "kiln/graph/passes.h"
#include "kiln/ops.h"
#include "kiln/package/export.h"
#include "kiln/package/saved_model.h"
#include "kiln/package/tf_saved_model.h"

namespace kiln::package {
namespace fs = std::filesystem;
namespace {

using graph::Graph;
using graph::Node;
using graph::NodeKind;
using graph::ValueRef;

constexpr int64_t kMinLoweredElements = 1024;  // biases and scalars stay f32

// Identity of a constant's bytes (views of one mapped file differ by offset).
using TensorId = std::pair<const Storage*, const void*>;
TensorId id_of(const Tensor& t) { return {t.storage().get(), t.raw_data()}; }

Node constant_node(Tensor t, std::string name) {
  Node n;
  n.kind = NodeKind::kConstant;
  n.outputs = {{t.shape(), t.dtype()}};
  n.constant = std::move(t);
  n.name = std::move(name);
  return n;
}

Node op_node(const char* op, std::vector<ValueRef> inputs, Attrs attrs, std::vector<TensorMeta> outputs) {
  Node n;
  n.kind = NodeKind::kOp;
  n.op = &OpRegistry::global().get(op);
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.outputs = std::move(outputs);
  return n;
}

// Rebuilds a graph node by node: `emit(old node, remap, out)` appends the node's
// replacement to `out` and returns the value that stands for the old node's output k
// (k: index). Nodes that emit nothing special are copied with remapped inputs.
struct Rebuilder {
  const Graph& src;
  Graph out;
  std::vector<std::vector<ValueRef>> map;  // old node -> new value per output
  explicit Rebuilder(const Graph& g) : src(g), map(g.nodes.size()) { out.num_inputs = g.num_inputs; }
  ValueRef remap(ValueRef v) const { return map[static_cast<size_t>(v.node)][static_cast<size_t>(v.index)]; }
  void copy(size_t i) {
    Node n = src.nodes[i];
    for (ValueRef& v : n.inputs) v = remap(v);
    const int id = out.add(std::move(n));
    for (size_t k = 0; k < src.nodes[i].outputs.size(); ++k) map[i].push_back({id, static_cast<int>(k)});
  }
  Graph finish() {
    for (ValueRef o : src.outputs) out.outputs.push_back(remap(o));
    return std::move(out);
  }
};

// ---- fp16 / bf16: weights stored in 16 bits, cast back at load ----------------------

Graph lower_weights(const Graph& g, DType dt, std::map<TensorId, Tensor>& cache, int* lowered) {
  Rebuilder r(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.kind != NodeKind::kConstant || n.constant.dtype() != DType::kF32 || n.constant.numel() < kMinLoweredElements) {
      r.copy(i);
      continue;
    }
    auto [it, fresh] = cache.try_emplace(id_of(n.constant));
    if (fresh) {
      it->second = n.constant.to(dt);
      ++*lowered;
    }
    const int c = r.out.add(constant_node(it->second, n.name));
    const int cast = r.out.add(op_node("cast", {{c, 0}}, {{"dtype", DType::kF32}}, {n.outputs[0]}));
    r.map[i] = {{cast, 0}};
  }
  return r.finish();
}

// ---- int8: calibration -----------------------------------------------------------------

bool quantizable(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::kOp) return false;
  const std::string& op = n.op->name;
  auto const_input = [&](size_t k) {
    return n.inputs.size() > k && g.nodes[static_cast<size_t>(n.inputs[k].node)].kind == NodeKind::kConstant;
  };
  auto f32 = [&](size_t k) { return g.meta(n.inputs[k]).dtype == DType::kF32; };
  if (op == "matmul" || op == "fused_matmul") {
    if (n.inputs.size() < 2 || !f32(0) || !f32(1) || !const_input(1) || n.attrs.get_bool("transpose_a", false))
      return false;
    return g.meta(n.inputs[0]).shape.rank() == 2 && g.meta(n.inputs[1]).shape.rank() == 2 &&
           (n.inputs.size() == 2 || const_input(2));
  }
  if (op == "conv2d" || op == "fused_conv2d") {
    return n.inputs.size() >= 2 && f32(0) && f32(1) && const_input(1) && (n.inputs.size() == 2 || const_input(2)) &&
           n.attrs.get_string("data_format", "NHWC") == "NHWC" && n.attrs.get_int("groups", 1) == 1 &&
           n.outputs.size() == 1;  // (a training graph's conv + pool keeping the conv output: not here)
  }
  return false;
}

// Runs the graph eagerly on one batch and widens [lo, hi] of every quantizable node's
// input 0.
void calibrate(const Graph& g, const std::vector<Tensor>& args, std::map<int, std::pair<float, float>>& ranges) {
  std::vector<std::vector<Tensor>> vals(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    switch (n.kind) {
      case NodeKind::kInput: vals[i] = {args.at(static_cast<size_t>(n.input_index))}; continue;
      case NodeKind::kConstant: vals[i] = {n.constant}; continue;
      case NodeKind::kVariable: vals[i] = {n.variable.peek()}; continue;
      case NodeKind::kOp: break;
    }
    std::vector<Tensor> in;
    for (ValueRef v : n.inputs) in.push_back(vals[static_cast<size_t>(v.node)][static_cast<size_t>(v.index)]);
    if (quantizable(g, n)) {
      const float lo = ops::min(in[0]).item<float>(), hi = ops::max(in[0]).item<float>();
      auto [it, fresh] = ranges.try_emplace(static_cast<int>(i), lo, hi);
      if (!fresh) it->second = {std::min(it->second.first, lo), std::max(it->second.second, hi)};
    }
    if (n.op->name == "reshape") {
      std::vector<TensorMeta> m{{in[0].shape(), in[0].dtype()}};
      vals[i] = {in[0].reshape(n.op->infer(m, n.attrs)[0].shape)};
    } else {
      vals[i] = call_op(*n.op, in, n.attrs);
    }
  }
}

// u8 affine parameters covering [lo, hi] (and 0, so zero padding is exact) with 7 bits:
// values 0..127 ("reduce_range", as PyTorch's fbgemm). Without VNNI, oneDNN sums pairs
// of u8 x s8 products in 16 bits; 127 * 127 * 2 cannot saturate, 255 * 127 * 2 can (the
// kernel then splits the weights and does twice the work).
constexpr double kActivationLevels = 127;
std::pair<double, int64_t> activation_params(float lo, float hi) {
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  if (hi - lo < 1e-8f) return {1.0, 0};
  const double scale = (static_cast<double>(hi) - lo) / kActivationLevels;
  const int64_t zp = std::clamp<int64_t>(std::llround(-lo / scale), 0, static_cast<int64_t>(kActivationLevels));
  return {scale, zp};
}

struct QuantizedWeight {
  Tensor q;      // i8, [K, N] or HWIO
  Tensor scale;  // f32 [N]
};

// Symmetric per-output-channel (last axis) int8.
QuantizedWeight quantize_weight(const Tensor& w) {
  const int64_t n = w.dim(w.rank() - 1), rows = w.numel() / n;
  std::vector<float> v = w.to_vector<float>();
  std::vector<float> scale(static_cast<size_t>(n), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) scale[static_cast<size_t>(c)] = std::max(scale[static_cast<size_t>(c)], std::fabs(v[static_cast<size_t>(r * n + c)]));
  for (float& s : scale) s = s > 0 ? s / 127.0f : 1.0f;
  std::vector<int8_t> q(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const size_t i = static_cast<size_t>(r * n + c);
      q[i] = static_cast<int8_t>(std::clamp<long>(std::lround(v[i] / scale[static_cast<size_t>(c)]), -127, 127));
    }
  return {Tensor::from_vector<int8_t>(q, w.shape()), Tensor::from_vector<float>(scale, {n})};
}

Graph quantize(const Graph& g, const std::map<int, std::pair<float, float>>& ranges,
               std::map<TensorId, QuantizedWeight>& cache, int* count) {
  Rebuilder r(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    auto range = ranges.find(static_cast<int>(i));
    if (!quantizable(g, n) || range == ranges.end()) {
      r.copy(i);
      continue;
    }
    const bool conv = n.op->name == "conv2d" || n.op->name == "fused_conv2d";
    const Node& wn = g.nodes[static_cast<size_t>(n.inputs[1].node)];
    Tensor w = wn.constant;
    const bool transpose_b = !conv && n.attrs.get_bool("transpose_b", false);
    auto [it, fresh] = cache.try_emplace(id_of(w));
    if (fresh) it->second = quantize_weight(transpose_b ? ops::transpose(w, {1, 0}) : w);
    const QuantizedWeight& qw = it->second;
    const int wq = r.out.add(constant_node(qw.q, wn.name + "/int8"));
    const int ws = r.out.add(constant_node(qw.scale, wn.name + "/int8_scale"));
    ValueRef bias;
    if (n.inputs.size() > 2) {
      bias = r.remap(n.inputs[2]);
    } else {
      bias = {r.out.add(constant_node(Tensor::zeros({qw.scale.numel()}, DType::kF32), "")), 0};
    }
    const auto [scale, zp] = activation_params(range->second.first, range->second.second);
    Attrs a;
    if (conv) {
      for (const auto& [k, v] : n.attrs.items())
        if (k != "activation" && k != "max_pool") a.set(k, v);
    }
    // A fused_conv2d with a pooled store (conv_pool_fusion) becomes the quantized
    // convolution and a max_pool2d again (chain_int8 then runs the pool on u8).
    const bool pooled = conv && n.attrs.get_int("max_pool", 0) == 2;
    TensorMeta q_out = n.outputs[0];
    if (pooled) {
      std::vector<TensorMeta> in;
      for (ValueRef v : n.inputs) in.push_back(g.meta(v));
      q_out = OpRegistry::global().get("conv2d").infer(in, a)[0];
    }
    a.set("x_scale", scale);
    a.set("x_zero_point", zp);
    const std::string act = n.attrs.get_string("activation", "");
    a.set("activation", std::string(act == "relu" ? "relu" : "none"));
    int q = r.out.add(op_node(conv ? "qlinear_conv2d" : "qlinear_matmul", {r.remap(n.inputs[0]), {wq, 0}, {ws, 0}, bias},
                              std::move(a), {q_out}));
    if (pooled)
      q = r.out.add(op_node("max_pool2d", {{q, 0}},
                            {{"ksize", std::vector<int64_t>{2, 2}},
                             {"strides", std::vector<int64_t>{2, 2}},
                             {"padding", std::string("valid")},
                             {"data_format", std::string("NHWC")}},
                            {n.outputs[0]}));
    r.map[i] = {{q, 0}};
    ++*count;
  }
  Graph out = r.finish();
  graph::eliminate_dead_code(out);  // the f32 weights the quantized nodes replaced
  return out;
}

// int8 layers in a row pass u8 activations. When a qlinear node's output reaches the
// next qlinear node's x only through max_pool2d and reshape nodes, each value read once,
// the first is requantised with the second's x parameters (y_scale, y_zero_point) and
// the nodes between run on u8: max commutes with quantisation (a non-decreasing map), so
// the values are those of pooling in f32 and quantising after, with 4x less memory
// traffic between the layers and no quantisation pass in the second.
void chain_int8(Graph& g) {
  std::map<ValueRef, int> uses = graph::count_uses(g);
  auto is = [&](const Node& n, const char* op) { return n.kind == NodeKind::kOp && n.op->name == op; };
  auto qlinear = [&](const Node& n) { return is(n, "qlinear_matmul") || is(n, "qlinear_conv2d"); };
  auto reinfer = [&](Node& n) {
    std::vector<TensorMeta> in;
    for (ValueRef v : n.inputs) in.push_back(g.meta(v));
    n.outputs = n.op->infer(in, n.attrs);
  };
  for (size_t b = 0; b < g.nodes.size(); ++b) {
    if (!qlinear(g.nodes[b]) || g.meta(g.nodes[b].inputs[0]).dtype != DType::kF32) continue;
    std::vector<int> between;  // max_pool2d / reshape nodes, last first
    ValueRef v = g.nodes[b].inputs[0];
    while (uses[v] == 1 && (is(g.nodes[static_cast<size_t>(v.node)], "max_pool2d") ||
                            is(g.nodes[static_cast<size_t>(v.node)], "reshape"))) {
      between.push_back(v.node);
      v = g.nodes[static_cast<size_t>(v.node)].inputs[0];
    }
    Node& a = g.nodes[static_cast<size_t>(v.node)];
    if (uses[v] != 1 || !qlinear(a) || a.attrs.has("y_scale")) continue;
    a.attrs.set("y_scale", g.nodes[b].attrs.get_float("x_scale"));
    a.attrs.set("y_zero_point", g.nodes[b].attrs.get_int("x_zero_point", 0));
    reinfer(a);
    for (auto it = between.rbegin(); it != between.rend(); ++it) reinfer(g.nodes[static_cast<size_t>(*it)]);
  }
}

}  // namespace

ConvertReport convert_package(const std::string& src_dir, const std::string& out_dir, const ConvertOptions& opts) {
  const std::string& p = opts.precision;
  if (p != "fp32" && p != "fp16" && p != "bf16" && p != "int8")
    throw InvalidArgumentError("convert: unknown precision '" + p + "' (expected fp32, fp16, bf16 or int8)");
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !opts.overwrite)
    throw FailedPreconditionError("convert: " + out_dir + " exists already");
  if (p == "int8" && (!OpRegistry::global().find("qlinear_matmul") || !OpRegistry::global().find("qlinear_conv2d")))
    throw UnimplementedError("convert: this build has no int8 kernels (qlinear_matmul, qlinear_conv2d)");
  auto src = SavedModel::load(src_dir);
  ConvertReport report;
  std::vector<GraphSignature> out;
  std::map<TensorId, Tensor> lowered;
  std::map<TensorId, QuantizedWeight> quantized;
  for (const Signature& s : src->signatures()) {
    Graph g = src->graph(s.name);
    if (p == "fp16" || p == "bf16") {
      g = lower_weights(g, p == "fp16" ? DType::kF16 : DType::kBF16, lowered, &report.weights_lowered);
    } else if (p == "int8") {
      std::map<int, std::pair<float, float>> ranges;
      int batches = 0;
      for (const auto& batch : opts.calibration) {
        std::vector<Tensor> args;
        for (const TensorInfo& t : s.inputs) {
          auto it = batch.find(t.name);
          if (it == batch.end()) break;
          check_spec(it->second, t.spec, "calibration input '" + t.name + "' of signature '" + s.name + "'");
          args.push_back(it->second);
        }
        if (args.size() != s.inputs.size()) continue;
        calibrate(g, args, ranges);
        ++batches;
      }
      if (batches == 0)
        throw InvalidArgumentError("convert: int8 needs calibration batches for signature '" + s.name +
                                   "' (inputs named like its inputs)");
      report.calibration_batches = std::max(report.calibration_batches, batches);
      g = quantize(g, ranges, quantized, &report.nodes_quantized);
      chain_int8(g);  // u8 activations between int8 layers
    }
    out.push_back({s, std::move(g)});
  }
  Metadata md = src->metadata();
  md.precision = p;
  md.converted_from = src_dir;
  std::vector<std::string> assets, extra;
  if (src->manifest().format == kTfSavedModelFormat) {  // a TF SavedModel: its asset directories as they are
    for (auto [dir, list] : {std::pair{kAssetsDir, &assets}, std::pair{kAssetsExtraDir, &extra}})
      for (const auto& e : fs::directory_iterator(fs::path(src_dir) / dir, ec))
        if (e.is_regular_file()) list->push_back(e.path().string());
  }
  for (const ManifestFile& f : src->manifest().files) {
    const std::string full = (fs::path(src_dir) / f.path).string();
    if (f.path.rfind(std::string(kAssetsDir) + "/", 0) == 0) assets.push_back(full);
    if (f.path.rfind(std::string(kAssetsExtraDir) + "/", 0) == 0) extra.push_back(full);
  }
  write_package(out_dir, out, md, assets, extra, opts.overwrite);
  return report;
}

}  // namespace kiln::package
