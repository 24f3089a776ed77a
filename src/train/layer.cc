#include "kiln/train/layer.h"
#include "kiln/train/device_scope.h"

#include <cctype>
#include <unordered_set>

#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/ops.h"
#include "layer_util.h"

namespace kiln::train {

// ---- helpers -----------------------------------------------------------------------

namespace detail {

std::string layer_label(const Layer& layer) { return layer.type() + " '" + layer.name() + "'"; }

int normalize_axis(const Layer& layer, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) layer_error(layer, "axis ", axis, " is out of range for an input of rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

std::vector<int64_t> pair_arg(const std::string& what, const std::vector<int64_t>& v, bool allow_empty) {
  if (v.empty() && allow_empty) return {};
  KILN_CHECK_ARG(v.size() == 1 || v.size() == 2, what, " needs 1 or 2 entries, got ", v.size());
  std::vector<int64_t> r = v.size() == 1 ? std::vector<int64_t>{v[0], v[0]} : v;
  KILN_CHECK_ARG(r[0] > 0 && r[1] > 0, what, " entries must be positive, got [", r[0], ", ", r[1], "]");
  return r;
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}


}  // namespace detail

std::string snake_case(const std::string& type) {
  // Keras' to_snake_case: "(.)([A-Z][a-z]+)" -> "\1_\2", then "([a-z])([A-Z])" -> "\1_\2",
  // lower-cased, non-word characters dropped.
  std::string s;
  for (char c : type)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') s += c;
  auto upper = [](char c) { return c >= 'A' && c <= 'Z'; };
  auto lower = [](char c) { return c >= 'a' && c <= 'z'; };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && upper(s[i]) && ((i + 1 < s.size() && lower(s[i + 1])) || lower(s[i - 1])) && out.back() != '_')
      out += '_';
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  }
  return out;
}

namespace regularizers {
Regularizer l2(double factor) {
  KILN_CHECK_ARG(factor >= 0, "regularizers::l2: factor must be >= 0, got ", factor);
  return [factor](const Tensor& w) { return ops::sum(ops::square(w)) * factor; };
}
Regularizer l1(double factor) {
  KILN_CHECK_ARG(factor >= 0, "regularizers::l1: factor must be >= 0, got ", factor);
  return [factor](const Tensor& w) { return ops::sum(ops::abs(w)) * factor; };
}
}  // namespace regularizers

// ---- SymbolicTensor, Input ----------------------------------------------------------

const Shape& SymbolicTensor::shape() const {
  if (!node_) throw FailedPreconditionError("SymbolicTensor::shape: the symbolic tensor is undefined");
  return node_->shapes.at(static_cast<size_t>(index_));
}

DType SymbolicTensor::dtype() const {
  if (!node_) throw FailedPreconditionError("SymbolicTensor::dtype: the symbolic tensor is undefined");
  return node_->dtypes.at(static_cast<size_t>(index_));
}

SymbolicTensor Input(const Shape& shape, DType dtype, std::string name) {
  KILN_CHECK_ARG(shape.rank() < Shape::kMaxRank, "Input: a per-sample shape of rank ", shape.rank(),
                 " plus the batch dimension exceeds the maximum rank ", Shape::kMaxRank);
  for (int i = 0; i < shape.rank(); ++i)
    KILN_CHECK_ARG(shape[i] >= 0, "Input: per-sample shape ", shape.str(),
                   " has a negative dimension; only the batch dimension may be unknown");
  auto node = std::make_shared<SymbolicTensor::Node>();
  Shape full = shape;
  full.insert(0, -1);
  node->shapes = {full};
  node->dtypes = {dtype};
  node->input_name = std::move(name);
  return SymbolicTensor(std::move(node), 0);
}

// ---- Layer --------------------------------------------------------------------------

Layer::Layer(std::string name) : name_(std::move(name)), policy_(global_policy()), auto_name_(name_.empty()) {}

namespace {
void check_arity(const Layer& layer, int expected, size_t got) {
  if (expected >= 0 && got != static_cast<size_t>(expected))
    detail::layer_error(layer, "expected ", expected, " input", expected == 1 ? "" : "s", ", got ", got);
  if (got == 0) detail::layer_error(layer, "called with no inputs");
}
}  // namespace

std::vector<Tensor> Layer::operator()(const std::vector<Tensor>& inputs, bool training) {
  check_arity(*this, num_inputs(), inputs.size());
  std::vector<Shape> shapes;
  shapes.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) detail::layer_error(*this, "input ", i, " is an undefined tensor");
    shapes.push_back(inputs[i].shape());
  }
  ensure_built(shapes);
  return call_with_policy(inputs, training);
}

namespace {
// Policy casts touch f32 and the 16-bit floats only: f64 (gradient checks) passes through.
bool castable(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }
}  // namespace

std::vector<Tensor> Layer::call_with_policy(const std::vector<Tensor>& inputs, bool training) {
  const bool mixed = policy_.is_mixed();
  // A float32 layer outside any mixed-precision layer runs untouched; inside one (a
  // float32 output layer of a mixed model) it turns autocasting off and takes its
  // 16-bit inputs in f32.
  if (!mixed && !AutocastScope::current() && !outputs_in_variable_dtype_) return call(inputs, training);
  const DType work = mixed && !computes_in_variable_dtype_ ? policy_.compute_dtype() : policy_.variable_dtype();
  const DType out_dtype = outputs_in_variable_dtype_ ? policy_.variable_dtype() : policy_.compute_dtype();
  std::vector<Tensor> cast_in;
  cast_in.reserve(inputs.size());
  for (const Tensor& x : inputs) cast_in.push_back(castable(x.dtype()) && x.dtype() != work ? ops::cast(x, work) : x);
  std::vector<Tensor> out;
  {
    AutocastScope scope(work == policy_.variable_dtype() ? std::nullopt : std::optional<DType>(work));
    out = call(cast_in, training);
  }
  for (Tensor& y : out)
    if (y.defined() && castable(y.dtype()) && y.dtype() != out_dtype) y = ops::cast(y, out_dtype);
  return out;
}

Tensor Layer::operator()(const Tensor& x, bool training) {
  std::vector<Tensor> out = (*this)(std::vector<Tensor>{x}, training);
  if (out.size() != 1) detail::layer_error(*this, "has ", out.size(), " outputs; call it with a vector of inputs");
  return out[0];
}

std::vector<SymbolicTensor> Layer::operator()(const std::vector<SymbolicTensor>& inputs) {
  LayerPtr self = weak_from_this().lock();
  if (!self)
    throw FailedPreconditionError(detail::layer_label(*this) +
                                  ": a layer called on symbolic tensors must be held by a "
                                  "std::shared_ptr "
                                  "(use the factory functions or std::make_shared)");
  check_arity(*this, num_inputs(), inputs.size());
  // Shapes are inferred by running the layer once on zeros with a batch of 1
  // (this also builds it), the way Keras traces a layer on its symbolic inputs.
  std::vector<Tensor> probes;
  bool batched = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) detail::layer_error(*this, "symbolic input ", i, " is undefined");
    Shape s = inputs[i].shape();
    for (int d = 0; d < s.rank(); ++d) {
      if (s[d] >= 0) continue;
      if (d != 0)
        detail::layer_error(*this, "symbolic input ", i, " has shape ", s.str(),
                            "; only the batch dimension (the first) may be unknown");
      s[d] = 1;
      batched = true;
    }
    probes.push_back(ops::zeros(s, inputs[i].dtype()));
  }
  std::vector<Tensor> outs = (*this)(probes, /*training=*/false);
  auto node = std::make_shared<SymbolicTensor::Node>();
  node->layer = std::move(self);
  node->inputs = inputs;
  for (const Tensor& o : outs) {
    Shape s = o.shape();
    if (batched && s.rank() > 0) s[0] = -1;
    node->shapes.push_back(s);
    node->dtypes.push_back(o.dtype());
  }
  std::vector<SymbolicTensor> result;
  for (size_t i = 0; i < outs.size(); ++i) result.emplace_back(node, static_cast<int>(i));
  return result;
}

SymbolicTensor Layer::operator()(const SymbolicTensor& x) {
  std::vector<SymbolicTensor> out = (*this)(std::vector<SymbolicTensor>{x});
  if (out.size() != 1) detail::layer_error(*this, "has ", out.size(), " outputs; call it with a vector of inputs");
  return out[0];
}

void Layer::ensure_built(const std::vector<Shape>& input_shapes) {
  if (built_) return;
  const size_t n_own = own_.size(), n_sub = sublayers_.size();
  try {
    build(input_shapes);
  } catch (...) {
    // Leave no half-built state behind: a corrected call builds from scratch.
    own_.erase(own_.begin() + static_cast<std::ptrdiff_t>(n_own), own_.end());
    sublayers_.erase(sublayers_.begin() + static_cast<std::ptrdiff_t>(n_sub), sublayers_.end());
    throw;
  }
  built_ = true;
  built_shapes_ = input_shapes;
}

std::vector<Variable> Layer::weights() const {
  std::vector<Variable> out;
  std::unordered_set<uintptr_t> seen;
  auto walk = [&](auto&& self, const Layer& l) -> void {
    for (const Weight& w : l.own_)
      if (seen.insert(w.var.uid()).second) out.push_back(w.var);
    for (const LayerPtr& s : l.sublayers_) self(self, *s);
  };
  walk(walk, *this);
  return out;
}

std::vector<Variable> Layer::trainable_weights() const {
  std::vector<Variable> out;
  std::unordered_set<uintptr_t> seen;
  auto walk = [&](auto&& self, const Layer& l, bool parent) -> void {
    const bool on = parent && l.trainable_;
    for (const Weight& w : l.own_)
      if (on && w.trainable && seen.insert(w.var.uid()).second) out.push_back(w.var);
    for (const LayerPtr& s : l.sublayers_) self(self, *s, on);
  };
  walk(walk, *this, true);
  return out;
}

std::vector<Variable> Layer::non_trainable_weights() const {
  std::unordered_set<uintptr_t> trainable;
  for (const Variable& v : trainable_weights()) trainable.insert(v.uid());
  std::vector<Variable> out;
  for (const Variable& v : weights())
    if (!trainable.count(v.uid())) out.push_back(v);
  return out;
}

int64_t Layer::count_params() const {
  int64_t n = 0;
  for (const Variable& v : weights()) n += v.numel();
  return n;
}

std::vector<Tensor> Layer::regularization_losses() const {
  // As Keras 3: only trainable weights contribute (a frozen layer's penalty is constant).
  std::vector<Tensor> out;
  std::unordered_set<uintptr_t> seen;
  auto walk = [&](auto&& self, const Layer& l, bool parent) -> void {
    const bool on = parent && l.trainable_;
    for (const Weight& w : l.own_)
      if (on && w.trainable && w.regularizer && seen.insert(w.var.uid()).second)
        out.push_back(w.regularizer(w.var.value()));
    for (const LayerPtr& s : l.sublayers_) self(self, *s, on);
  };
  walk(walk, *this, true);
  return out;
}

void Layer::set_trainable(bool t) {
  // Keras semantics: the flag propagates to every sublayer; Variable::trainable
  // follows so that tapes stop watching frozen weights.
  trainable_ = t;
  for (const Weight& w : own_) w.var.set_trainable(w.trainable && t);
  for (const LayerPtr& s : sublayers_) s->set_trainable(t);
}

Variable Layer::add_weight(const std::string& name, const Shape& shape, const Initializer& init, bool trainable,
                           Regularizer regularizer, DType dtype) {
  if (!init) detail::layer_error(*this, "weight '", name, "' has no initializer");
  Tensor value = init(shape, dtype);
  if (!value.defined() || value.shape() != shape || value.dtype() != dtype)
    detail::layer_error(*this, "the initializer of weight '", name, "' returned ",
                        value.defined() ? value.desc() : std::string("an undefined tensor"), ", expected ",
                        dtype_name(dtype), shape.str());
  if (const Device d = DeviceScope::current(); value.device() != d) value = value.to(d);
  Variable var(std::move(value), this->name() + "/" + name, trainable && trainable_);
  own_.push_back(Weight{var, trainable, std::move(regularizer)});
  return var;
}

bool Layer::syncs_replicas() const {
  for (const LayerPtr& l : sublayers_)
    if (l->syncs_replicas()) return true;
  return false;
}

void Layer::track(LayerPtr sub) {
  if (!sub) detail::layer_error(*this, "track: the sublayer is null");
  if (sub.get() == this) detail::layer_error(*this, "track: a layer cannot contain itself");
  for (const LayerPtr& s : sublayers_)
    if (s == sub) return;
  if (!trainable_) sub->set_trainable(false);
  sublayers_.push_back(std::move(sub));
}

}  // namespace kiln::train
