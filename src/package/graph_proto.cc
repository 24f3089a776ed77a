// model.pb <-> kiln's graph, signatures and metadata.
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/op_def.h"
#include "kiln/package/saved_model.h"
#include "package_internal.h"

namespace kiln::package::internal {
namespace {

void spec_to_proto(const TensorSpec& s, TensorSpecProto* p) {
  p->set_dtype(std::string(dtype_name(s.dtype)));
  for (int64_t d : s.shape) p->add_shape(d);
}

DType dtype_of(const std::string& name, const std::string& source, const std::string& what) {
  try {
    return dtype_from_name(name);
  } catch (const Error&) {
    throw DataLossError(source + ": " + what + " has an unknown dtype '" + name + "'");
  }
}

TensorSpec spec_from_proto(const TensorSpecProto& p, const std::string& source, const std::string& what) {
  TensorSpec s;
  s.dtype = dtype_of(p.dtype(), source, what);
  if (p.shape_size() > 8) throw DataLossError(source + ": " + what + " has rank " + std::to_string(p.shape_size()) + " > 8");
  for (int64_t d : p.shape()) {
    if (d < -1) throw DataLossError(source + ": " + what + " has a dimension " + std::to_string(d));
    s.shape.push_back(d);
  }
  return s;
}

void attr_to_proto(const AttrValue& v, AttrValueProto* p) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) p->set_i(x);
        else if constexpr (std::is_same_v<T, double>) p->set_f(x);
        else if constexpr (std::is_same_v<T, bool>) p->set_b(x);
        else if constexpr (std::is_same_v<T, std::string>) p->set_s(x);
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          for (int64_t i : x) p->mutable_ints()->add_values(i);
        } else p->set_dtype(std::string(dtype_name(x)));
      },
      v);
}

}  // namespace

void graph_to_proto(const graph::Graph& g, const std::function<std::string(int)>& key, GraphProto* out) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const graph::Node& n = g.nodes[i];
    NodeProto* p = out->add_nodes();
    switch (n.kind) {
      case graph::NodeKind::kInput:
        p->set_kind(NodeProto::INPUT);
        p->set_input_index(n.input_index);
        break;
      case graph::NodeKind::kConstant:
      case graph::NodeKind::kVariable:
        p->set_kind(NodeProto::CONSTANT);
        p->set_tensor(key(static_cast<int>(i)));
        p->set_name(n.kind == graph::NodeKind::kVariable ? n.variable.name() : n.name);
        break;
      case graph::NodeKind::kOp:
        p->set_kind(NodeProto::OP);
        p->set_op(n.op->name);
        for (const auto& [name, v] : n.attrs.items()) {
          NamedAttr* a = p->add_attrs();
          a->set_name(name);
          attr_to_proto(v, a->mutable_value());
        }
        for (graph::ValueRef v : n.inputs) {
          ValueRefProto* r = p->add_inputs();
          r->set_node(v.node);
          r->set_index(v.index);
        }
        break;
    }
    for (const TensorMeta& m : n.outputs) {
      TensorSpecProto* s = p->add_outputs();
      s->set_dtype(std::string(dtype_name(m.dtype)));
      for (int64_t d : m.shape.dims()) s->add_shape(d);
    }
  }
  for (graph::ValueRef v : g.outputs) {
    ValueRefProto* r = out->add_outputs();
    r->set_node(v.node);
    r->set_index(v.index);
  }
  out->set_num_inputs(g.num_inputs);
}

graph::Graph graph_from_proto(const GraphProto& p, const TensorFile& weights, const std::string& source) {
  graph::Graph g;
  auto bad = [&](int i, const std::string& why) {
    return DataLossError(source + ": node " + std::to_string(i) + " " + why);
  };
  if (p.num_inputs() < 0) throw DataLossError(source + ": negative input count");
  std::set<int> seen_inputs;
  auto ref = [&](const ValueRefProto& r, int i, const char* what) {
    if (r.node() < 0 || r.node() >= i) throw bad(i, std::string(what) + " refers to node " + std::to_string(r.node()) + ", not an earlier node");
    const graph::Node& src = g.nodes[static_cast<size_t>(r.node())];
    if (r.index() < 0 || r.index() >= static_cast<int>(src.outputs.size()))
      throw bad(i, std::string(what) + " refers to output " + std::to_string(r.index()) + " of node " +
                       std::to_string(r.node()) + ", which has " + std::to_string(src.outputs.size()));
    return graph::ValueRef{r.node(), r.index()};
  };
  for (int i = 0; i < p.nodes_size(); ++i) {
    const NodeProto& np = p.nodes(i);
    graph::Node n;
    for (int k = 0; k < np.outputs_size(); ++k) {
      TensorSpec s = spec_from_proto(np.outputs(k), source, "node " + std::to_string(i) + " output " + std::to_string(k));
      for (int64_t d : s.shape)
        if (d < 0) throw bad(i, "has an output with an unknown size");
      n.outputs.push_back({Shape(s.shape), s.dtype});
    }
    switch (np.kind()) {
      case NodeProto::INPUT:
        n.kind = graph::NodeKind::kInput;
        n.input_index = np.input_index();
        if (n.input_index < 0 || n.input_index >= p.num_inputs() || !seen_inputs.insert(n.input_index).second)
          throw bad(i, "is input " + std::to_string(n.input_index) + " (of " + std::to_string(p.num_inputs()) +
                           ", or a duplicate)");
        if (n.outputs.size() != 1) throw bad(i, "(an input) must have one output");
        break;
      case NodeProto::CONSTANT: {
        n.kind = graph::NodeKind::kConstant;
        n.name = np.name();
        const Tensor* t = weights.find(np.tensor());
        if (!t) throw bad(i, "reads weight '" + np.tensor() + "', which is not in " + kWeightsFile);
        if (n.outputs.size() != 1 || n.outputs[0].shape != t->shape() || n.outputs[0].dtype != t->dtype())
          throw bad(i, "expects weight '" + np.tensor() + "' to match its output spec; the weight is " + t->desc());
        n.constant = *t;
        break;
      }
      case NodeProto::OP: {
        n.kind = graph::NodeKind::kOp;
        const OpDef* op = OpRegistry::global().find(np.op());
        if (!op || !op->infer)
          throw NotFoundError(source + ": node " + std::to_string(i) + " uses op '" + np.op() +
                              "', which this build of kiln does not have");
        n.op = op;
        if (op->num_inputs >= 0 && np.inputs_size() != op->num_inputs)
          throw bad(i, "(" + op->name + ") has " + std::to_string(np.inputs_size()) + " inputs, the op takes " +
                           std::to_string(op->num_inputs));
        for (const ValueRefProto& r : np.inputs()) n.inputs.push_back(ref(r, i, "an input"));
        for (const NamedAttr& a : np.attrs()) {
          const AttrValueProto& v = a.value();
          switch (v.value_case()) {
            case AttrValueProto::kI: n.attrs.set(a.name(), v.i()); break;
            case AttrValueProto::kF: n.attrs.set(a.name(), v.f()); break;
            case AttrValueProto::kB: n.attrs.set(a.name(), v.b()); break;
            case AttrValueProto::kS: n.attrs.set(a.name(), v.s()); break;
            case AttrValueProto::kInts:
              n.attrs.set(a.name(), std::vector<int64_t>(v.ints().values().begin(), v.ints().values().end()));
              break;
            case AttrValueProto::kDtype: n.attrs.set(a.name(), dtype_of(v.dtype(), source, "attr " + a.name())); break;
            case AttrValueProto::VALUE_NOT_SET: throw bad(i, "attr '" + a.name() + "' has no value");
          }
        }
        // The stored output specs must be what the op infers (later passes trust them,
        // e.g. constant folding's size limit).
        std::vector<TensorMeta> in;
        for (graph::ValueRef v : n.inputs) in.push_back(g.meta(v));
        std::vector<TensorMeta> inferred;
        try {
          inferred = op->infer(in, n.attrs);
        } catch (const Error& e) {
          throw bad(i, "(" + op->name + ") rejects its inputs or attrs: " + e.message());
        }
        bool same = inferred.size() == n.outputs.size();
        for (size_t k = 0; same && k < inferred.size(); ++k)
          same = inferred[k].shape == n.outputs[k].shape && inferred[k].dtype == n.outputs[k].dtype;
        if (!same) throw bad(i, "(" + op->name + ") declares outputs that differ from what the op computes");
        break;
      }
      default: throw bad(i, "has an unknown kind " + std::to_string(np.kind()));
    }
    g.add(std::move(n));
  }
  if (static_cast<int>(seen_inputs.size()) != p.num_inputs())
    throw DataLossError(source + ": the graph declares " + std::to_string(p.num_inputs()) + " inputs but has " +
                        std::to_string(seen_inputs.size()) + " input nodes");
  g.num_inputs = p.num_inputs();
  const int n = p.nodes_size();
  for (const ValueRefProto& r : p.outputs()) g.outputs.push_back(ref(r, n, "a graph output"));
  return g;
}

void signature_to_proto(const Signature& s, const std::string& function, SignatureDefProto* out) {
  out->set_name(s.name);
  out->set_method_name(s.method);
  out->set_function(function);
  for (const TensorInfo& t : s.inputs) {
    TensorInfoProto* p = out->add_inputs();
    p->set_name(t.name);
    spec_to_proto(t.spec, p->mutable_spec());
  }
  for (const TensorInfo& t : s.outputs) {
    TensorInfoProto* p = out->add_outputs();
    p->set_name(t.name);
    spec_to_proto(t.spec, p->mutable_spec());
  }
}

Signature signature_from_proto(const SignatureDefProto& p, const std::string& source) {
  Signature s;
  s.name = p.name();
  s.method = p.method_name();
  const std::string what = "signature '" + s.name + "'";
  for (const TensorInfoProto& t : p.inputs())
    s.inputs.push_back({t.name(), spec_from_proto(t.spec(), source, what + " input '" + t.name() + "'")});
  for (const TensorInfoProto& t : p.outputs())
    s.outputs.push_back({t.name(), spec_from_proto(t.spec(), source, what + " output '" + t.name() + "'")});
  try {
    validate_signature(s);
  } catch (const Error& e) {
    throw DataLossError(source + ": " + e.message());
  }
  return s;
}

void validate_signature(const Signature& s) {
  const std::string what = "signature '" + s.name + "'";
  if (s.name.empty()) throw InvalidArgumentError("a signature has an empty name");
  if (s.outputs.empty()) throw InvalidArgumentError(what + " has no outputs");
  std::set<std::string> names;
  for (const auto* list : {&s.inputs, &s.outputs}) {
    names.clear();
    for (const TensorInfo& t : *list) {
      if (t.name.empty()) throw InvalidArgumentError(what + " has a tensor with an empty name");
      if (!names.insert(t.name).second) throw InvalidArgumentError(what + " names '" + t.name + "' twice");
    }
  }
  if (s.method == kPredictMethod) return;
  if (s.method == kClassifyMethod) {
    for (const TensorInfo& t : s.outputs)
      if (t.name != "scores" && t.name != "classes")
        throw InvalidArgumentError(what + " (classify) may only output 'scores' and 'classes', not '" + t.name + "'");
    if (s.inputs.size() != 1) throw InvalidArgumentError(what + " (classify) must have one input");
    return;
  }
  if (s.method == kRegressMethod) {
    if (s.outputs.size() != 1 || s.outputs[0].name != "outputs" || s.inputs.size() != 1)
      throw InvalidArgumentError(what + " (regress) must have one input and one output named 'outputs'");
    return;
  }
  throw InvalidArgumentError(what + " has an unknown method '" + s.method + "' (want " + kPredictMethod + ", " +
                             kClassifyMethod + " or " + kRegressMethod + ")");
}

void metadata_to_proto(const Metadata& m, MetadataProto* out) {
  out->set_created_unix_ms(m.created_unix_ms);
  out->set_producer(m.producer);
  out->set_model_name(m.model_name);
  out->set_description(m.description);
  out->set_training_data(m.training_data);
  for (const auto& [k, v] : m.hyperparameters) (*out->mutable_hyperparameters())[k] = v;
  for (const auto& [k, v] : m.metrics) (*out->mutable_metrics())[k] = v;
  for (const auto& [k, v] : m.tags) (*out->mutable_tags())[k] = v;
  out->set_precision(m.precision);
  out->set_converted_from(m.converted_from);
}

Metadata metadata_from_proto(const MetadataProto& p) {
  Metadata m;
  m.created_unix_ms = p.created_unix_ms();
  m.producer = p.producer();
  m.model_name = p.model_name();
  m.description = p.description();
  m.training_data = p.training_data();
  m.hyperparameters.insert(p.hyperparameters().begin(), p.hyperparameters().end());
  m.metrics.insert(p.metrics().begin(), p.metrics().end());
  m.tags.insert(p.tags().begin(), p.tags().end());
  m.precision = p.precision().empty() ? "fp32" : p.precision();
  m.converted_from = p.converted_from();
  return m;
}

}  // namespace kiln::package::internal
