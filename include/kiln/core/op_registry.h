#pragma once
// The one op registry.
//
// Each op has a name, an attribute schema, shape/dtype inference, a gradient slot
// (vjp, filled by the autodiff layer) and kernels per (backend, dtype). Op
// definitions are registered by the ops layer, kernels by each backend, both by name
// at static-initialisation time; `call_op` is the single dispatch path that eager
// calls (and later graph execution) go through.
//
// Thread-safety: registration happens during static initialisation; afterwards the
// registry is read-only and may be used from any thread.
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/tensor.h"

namespace kiln {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, DType>;

// A small ordered list of named attributes.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}
  void set(std::string name, AttrValue v);
  bool has(std::string_view name) const { return find(name) != nullptr; }
  int64_t get_int(std::string_view name) const;
  int64_t get_int(std::string_view name, int64_t dflt) const;
  double get_float(std::string_view name) const;
  double get_float(std::string_view name, double dflt) const;
  bool get_bool(std::string_view name, bool dflt) const;
  const std::string& get_string(std::string_view name) const;
  std::string get_string(std::string_view name, const std::string& dflt) const;
  const std::vector<int64_t>& get_ints(std::string_view name) const;
  std::vector<int64_t> get_ints(std::string_view name, const std::vector<int64_t>& dflt) const;
  DType get_dtype(std::string_view name) const;
  DType get_dtype(std::string_view name, DType dflt) const;
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string str() const;

 private:
  const AttrValue* find(std::string_view name) const;
  const AttrValue& require(std::string_view name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

struct TensorMeta {
  Shape shape;
  DType dtype;
};

enum class AttrType { kInt, kFloat, kBool, kString, kInts, kDType };
struct AttrSpec {
  std::string name;
  AttrType type;
  std::string doc;
};

struct OpDef;

struct OpContext {
  const OpDef& op;
  std::span<const Tensor> in;
  std::span<Tensor> out;
  const Attrs& attrs;
};

// Validates inputs and attrs and returns the outputs' shapes and dtypes; throws a
// typed kiln::Error on bad input. Must not touch tensor data.
using InferFn = std::vector<TensorMeta> (*)(std::span<const TensorMeta> in, const Attrs& attrs);
// Computes outputs (already allocated with the inferred shapes) from inputs.
using KernelFn = void (*)(OpContext& ctx);
// What a vector-Jacobian product sees: the op's inputs, outputs and attrs as they
// were when it ran, the cotangents of every output (zeros where an output got
// none), and which inputs need a gradient.
struct VjpContext {
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  std::span<const Tensor> cotangents;
  const Attrs& attrs;
  std::span<const uint8_t> needs_grad;  // per input; empty = all
  bool needs(size_t i) const { return needs_grad.empty() || (i < needs_grad.size() && needs_grad[i]); }
};
// Vector-Jacobian product: the gradient w.r.t. each input, one entry per input, with
// the input's shape and dtype; an undefined Tensor for an input that gets none (an
// integer input, or one with needs(i) == false). Built from ops, so an enclosing
// gradient tape records it (gradients of gradients).
using VjpFn = std::vector<Tensor> (*)(const VjpContext& ctx);

enum class Differentiable : uint8_t { kUnknown, kYes, kNo };

struct OpDef {
  std::string name;
  std::string doc;
  int num_inputs = -1;       // -1: variadic
  int dispatch_input = 0;    // input whose dtype selects the kernel; -1: output 0's dtype
  std::vector<AttrSpec> attrs;
  InferFn infer = nullptr;
  VjpFn vjp = nullptr;
  Differentiable differentiable = Differentiable::kUnknown;
  // Stateful random ops (random_uniform, dropout, ...): writes fresh randomness from
  // the default generator into the attrs (seed/key/offset). A traced graph calls it
  // before every run of such a node, so each run draws new numbers, as stateful random
  // ops do inside tf.function; passes never fold, merge or duplicate these nodes.
  // nullptr: a deterministic op.
  void (*redraw)(Attrs& attrs) = nullptr;
  // (output, input) pairs whose buffers may be one: every kernel of the op, on every
  // device, computes element i of that output from elements at index i of the inputs
  // and reads them before it writes it (elementwise ops, optimizer updates). A caller
  // that owns the input (nothing else reads it afterwards) may pass it as the output
  // (call_op_into); the graph executor writes such outputs over dead inputs and over
  // the variables they update. The shapes and dtypes must still match. Input -1: any
  // input (a variadic op).
  std::vector<std::pair<int, int>> overwritable;
  bool may_overwrite(int output, int input) const {
    for (const auto& [o, i] : overwritable)
      if (o == output && (i == input || i == -1)) return true;
    return false;
  }
  // kernels[device type][dtype]
  std::array<std::array<KernelFn, kNumDTypes>, kNumDeviceTypes> kernels{};

  KernelFn kernel(DeviceType dev, DType dt) const {
    return kernels[static_cast<int>(dev)][static_cast<int>(dt)];
  }
};

class OpRegistry {
 public:
  static OpRegistry& global();
  // Returns the definition, creating an empty one on first mention (ops and kernels
  // may register in any order).
  OpDef& def(const std::string& name);
  // Throws NotFoundError for an unknown op.
  const OpDef& get(const std::string& name) const;
  const OpDef* find(const std::string& name) const;
  void register_kernel(const std::string& op, DeviceType dev, DType dt, KernelFn fn);
  std::vector<const OpDef*> all() const;

 private:
  std::map<std::string, OpDef, std::less<>> ops_;
};

// Observes every op executed eagerly on this thread (used by gradient tapes).
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void on_op(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                     const Attrs& attrs) = 0;
};
// Installs an observer for the current thread; returns the previous one.
OpObserver* set_op_observer(OpObserver* observer);
// The current thread's observer (nullptr if none).
OpObserver* op_observer();
// Reports an op that ran without call_op (e.g. a buffer-sharing reshape) to the
// current thread's observer, if any.
void notify_op_observer(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                        const Attrs& attrs);

// Runs `op` eagerly: infers output metadata (validating), allocates outputs on the
// inputs' device (or `device` for ops without inputs), runs the kernel.
std::vector<Tensor> call_op(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                            Device device = Device::cpu());
// As call_op, into outputs the caller allocated with the shapes, dtypes and device that
// inference gives (InvalidArgumentError otherwise). An output may share its buffer with
// an input only as op.overwritable allows, as that very tensor (InvalidArgumentError
// otherwise); the caller gives up that input's old value. Reported to the op observer
// like call_op.
void call_op_into(const OpDef& op, std::span<const Tensor> inputs, std::span<Tensor> outputs, const Attrs& attrs);
// Single-output convenience.
Tensor call_op1(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                Device device = Device::cpu());

// Runs the kernel of `op` for `device` on outputs already allocated with the shapes its
// infer gives (one kernel composing others, e.g. a fused op's fallback); the kernel is
// chosen as call_op chooses it. Throws UnimplementedError when there is none.
void run_kernel(const char* op, DeviceType device, std::span<const Tensor> inputs, std::span<Tensor> outputs,
                const Attrs& attrs);

// Static registration helpers.
struct OpRegistration {
  explicit OpRegistration(OpDef def);
};
// Attaches a vjp to an op (the op is created on first mention, any order works).
struct VjpRegistration {
  VjpRegistration(const char* op, VjpFn fn);
};
struct KernelRegistration {
  KernelRegistration(const char* op, DeviceType dev, std::initializer_list<DType> dtypes, KernelFn fn);
  KernelRegistration(const char* op, DeviceType dev, DType dtype, KernelFn fn);
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_REGISTER_OP(...) \
  static ::kiln::OpRegistration KILN_CONCAT(kiln_op_reg_, __COUNTER__)(__VA_ARGS__)
#define KILN_REGISTER_VJP(op, fn) \
  static ::kiln::VjpRegistration KILN_CONCAT(kiln_vjp_reg_, __COUNTER__)(op, fn)
#define KILN_REGISTER_KERNEL(op, dev, dtypes, fn) \
  static ::kiln::KernelRegistration KILN_CONCAT(kiln_kernel_reg_, __COUNTER__)(op, dev, dtypes, fn)
