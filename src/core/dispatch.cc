#include "kiln/core/dispatch.h"

#include "kiln/core/denormals.h"
#include "kiln/core/op_def.h"

namespace kiln {

namespace {
thread_local OpObserver* t_observer = nullptr;
}

OpObserver* set_op_observer(OpObserver* o) {
  OpObserver* prev = t_observer;
  t_observer = o;
  return prev;
}

OpObserver* op_observer() { return t_observer; }

void notify_op_observer(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                        const Attrs& attrs) {
  if (t_observer) t_observer->on_op(op, inputs, outputs, attrs);
}

namespace {
constexpr int kInlineInputs = 8;

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* pa = static_cast<const char*>(a.raw_data());
  const auto* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// call_op_into's outputs: as inferred, on `device`, sharing memory with an input only as
// that input itself where op.overwritable allows.
void check_given_outputs(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> given,
                         const std::vector<TensorMeta>& want, const Device& device) {
  if (given.size() != want.size())
    throw InvalidArgumentError(
        detail::str_cat("op '", op.name, "' has ", want.size(), " outputs, call_op_into got ", given.size()));
  for (size_t k = 0; k < given.size(); ++k) {
    const Tensor& o = given[k];
    if (!o.defined() || o.shape() != want[k].shape || o.dtype() != want[k].dtype || o.device() != device)
      throw InvalidArgumentError(detail::str_cat(
          "op '", op.name, "': output ", k, " must be ", dtype_name(want[k].dtype), want[k].shape.str(), " on ",
          device.str(), ", got ",
          o.defined() ? detail::str_cat(dtype_name(o.dtype()), o.shape().str(), " on ", o.device().str())
                      : std::string("an undefined tensor")));
    for (size_t j = 0; j < inputs.size(); ++j)
      if (overlap(o, inputs[j]) &&
          !(o.is_same(inputs[j]) && op.may_overwrite(static_cast<int>(k), static_cast<int>(j))))
        throw InvalidArgumentError(detail::str_cat("op '", op.name, "': output ", k, " shares memory with input ", j,
                                                   ", which it may not overwrite"));
    for (size_t q = 0; q < k; ++q)
      if (overlap(o, given[q]))
        throw InvalidArgumentError(detail::str_cat("op '", op.name, "': outputs ", q, " and ", k, " share memory"));
  }
}

// Runs op; outputs go into `outs`, allocated here unless `given` (call_op_into).
void run(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, Device device, std::vector<Tensor>& outs,
         std::span<Tensor> given = {}, bool into = false) {
  if (op.num_inputs >= 0 && static_cast<int>(inputs.size()) != op.num_inputs)
    throw InvalidArgumentError(detail::str_cat("op '", op.name, "' takes ", op.num_inputs, " inputs, got ", inputs.size()));
  TensorMeta inline_meta[kInlineInputs];
  std::vector<TensorMeta> heap_meta;
  TensorMeta* meta = inline_meta;
  if (inputs.size() > kInlineInputs) {
    heap_meta.resize(inputs.size());
    meta = heap_meta.data();
  }
  // A one-element CPU tensor among inputs on another device (a Python-like scalar, as
  // in `x * 2.0`) is copied to that device, as PyTorch does for 0-d CPU tensors.
  std::vector<Tensor> moved;
  for (const Tensor& t : inputs) {
    if (!t.defined() || t.device().type == DeviceType::kCPU) continue;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& c = inputs[i];
      if (!c.defined() || c.device().type != DeviceType::kCPU || c.numel() != 1) continue;
      if (moved.empty()) moved.assign(inputs.begin(), inputs.end());
      moved[i] = c.to(t.device());
    }
    if (!moved.empty()) inputs = moved;
    break;
  }
  if (!inputs.empty()) device = inputs[0].device();
  bool mixed_cpu = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) throw InvalidArgumentError(detail::str_cat("op '", op.name, "': input ", i, " is undefined"));
    if (t.device() != device) {
      // Logical CPU devices (kiln/core/device_config.h) all hold host memory, so a CPU
      // kernel reads any of them; other devices must match exactly.
      if (t.device().type != DeviceType::kCPU || device.type != DeviceType::kCPU)
        throw InvalidArgumentError(detail::str_cat("op '", op.name, "': input ", i, " is on ", t.device().str(),
                                                   " but input 0 is on ", device.str()));
      mixed_cpu = true;
    }
    meta[i] = TensorMeta{t.shape(), t.dtype()};
  }
  if (mixed_cpu) {
    // Outputs go with the largest input (the first of equals), so that a constant such
    // as the scalar in `x * 2.0` does not pull them onto cpu:0.
    int64_t best = -1;
    for (const Tensor& t : inputs)
      if (t.numel() > best) {
        best = t.numel();
        device = t.device();
      }
  }
  std::vector<TensorMeta> out_meta = op.infer(std::span<const TensorMeta>(meta, inputs.size()), attrs);
  DType key = op.dispatch_input >= 0 ? meta[op.dispatch_input].dtype : out_meta.at(0).dtype;
  KernelFn k = op.kernel(device.type, key);
  if (!k)
    throw UnimplementedError(detail::str_cat("op '", op.name, "' has no ", device_type_name(device.type),
                                             " kernel for dtype ", dtype_name(key)));
  std::span<Tensor> out = given;
  if (into) {
    check_given_outputs(op, inputs, given, out_meta, device);
  } else {
    outs.clear();
    outs.reserve(out_meta.size());
    for (auto& m : out_meta) outs.push_back(Tensor::empty(m.shape, m.dtype, device));
    out = outs;
  }
  OpContext ctx{op, inputs, out, attrs};
  {
    detail::DenormalScope denormals;
    k(ctx);
  }
  if (t_observer) t_observer->on_op(op, inputs, out, attrs);
}
}  // namespace

std::vector<Tensor> call_op(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, Device device) {
  std::vector<Tensor> outs;
  run(op, inputs, attrs, device, outs);
  return outs;
}

void call_op_into(const OpDef& op, std::span<const Tensor> inputs, std::span<Tensor> outputs, const Attrs& attrs) {
  std::vector<Tensor> unused;
  run(op, inputs, attrs, inputs.empty() || !inputs[0].defined() ? Device::cpu() : inputs[0].device(), unused, outputs,
      /*into=*/true);
}

Tensor call_op1(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, Device device) {
  std::vector<Tensor> outs;
  run(op, inputs, attrs, device, outs);
  return std::move(outs[0]);
}

void run_kernel(const char* name, DeviceType device, std::span<const Tensor> inputs, std::span<Tensor> outputs,
                const Attrs& attrs) {
  const OpDef& op = OpRegistry::global().get(name);
  const DType key =
      op.dispatch_input >= 0 ? inputs[static_cast<size_t>(op.dispatch_input)].dtype() : outputs[0].dtype();
  KernelFn k = op.kernel(device, key);
  if (!k)
    throw UnimplementedError(
        detail::str_cat("op '", op.name, "' has no ", device_type_name(device), " kernel for dtype ", dtype_name(key)));
  OpContext ctx{op, inputs, outputs, attrs};
  detail::DenormalScope denormals;
  k(ctx);
}

namespace {
// A plain kernel as a prepared one.
class Unprepared final : public PreparedKernel {
 public:
  explicit Unprepared(KernelFn fn) : fn_(fn) {}
  void run(OpContext& ctx) const override { fn_(ctx); }

 private:
  KernelFn fn_;
};
}  // namespace

std::unique_ptr<const PreparedKernel> prepare_kernel(const PrepareContext& ctx) {
  const OpDef& op = ctx.op;
  const DType key = op.dispatch_input >= 0 ? ctx.in[static_cast<size_t>(op.dispatch_input)].dtype : ctx.out[0].dtype;
  if (PrepareFn prepare = op.prepare(ctx.device, key)) return prepare(ctx);
  KernelFn k = op.kernel(ctx.device, key);
  if (!k)
    throw UnimplementedError(detail::str_cat("op '", op.name, "' has no ", device_type_name(ctx.device),
                                             " kernel for dtype ", dtype_name(key)));
  return std::make_unique<Unprepared>(k);
}

}  // namespace kiln
