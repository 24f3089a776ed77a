#pragma once
// An op's definition and the one op registry.
//
// Each op has a name, an attribute schema, shape/dtype inference, a gradient slot (vjp,
// filled by the ops layer's gradient files), traits that passes and the executor read
// (instead of comparing names), and kernels per (device type, dtype). The ops layer
// registers definitions with KILN_REGISTER_OP, each backend its kernels
// (kiln/core/kernel.h), in any order, at static-initialisation time. Running an op is
// kiln/core/dispatch.h.
//
// Thread-safety: registration happens during static initialisation; afterwards the
// registry is read-only and may be used from any thread.
#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/attrs.h"
#include "kiln/core/kernel.h"
#include "kiln/core/tensor_spec.h"

namespace kiln {

// Validates inputs and attrs and returns the outputs' shapes and dtypes; throws a
// typed kiln::Error on bad input. Must not touch tensor data.
using InferFn = std::vector<TensorMeta> (*)(std::span<const TensorMeta> in, const Attrs& attrs);
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

// What passes and the executor need to know of an op, in one place
// (src/ops/op_traits.cc) instead of lists of names in each of them.
enum class AmpClass : uint8_t {
  kDeny,   // stays in f32 (default): exp, log, softmax, reductions, losses, updates
  kAllow,  // always 16-bit under mixed precision: matmul, convolutions
  kInfer,  // 16-bit between 16-bit ops: elementwise arithmetic, activations, pooling
  kClear,  // follows its inputs: data movement (reshape, transpose, concat, pad)
};
enum class ElementwiseArity : uint8_t { kNone, kUnary, kBinary };
struct OpTraits {
  // Its output is its input's buffer (reshape): the executor plans no memory and runs
  // no kernel for it.
  bool view = false;
  // Work ~ M*K*N (matmuls, convolutions and their gradients): what the executor pairs
  // when it runs independent branches together.
  bool heavy = false;
  // Its class under automatic mixed precision (kiln/graph/auto_mixed_precision.h).
  AmpClass amp = AmpClass::kDeny;
  // fused_elementwise can run it as one instruction of this arity (f32; the same
  // expression as the op's own kernel).
  ElementwiseArity elementwise = ElementwiseArity::kNone;
};

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
  OpTraits traits;  // registered apart (KILN_REGISTER_OP_TRAITS), merged in any order
  bool may_overwrite(int output, int input) const {
    for (const auto& [o, i] : overwritable)
      if (o == output && (i == input || i == -1)) return true;
    return false;
  }

  // The kernel for (device type, dtype), or nullptr.
  KernelFn kernel(DeviceType dev, DType dt) const {
    return kernels_[static_cast<int>(dev)][static_cast<int>(dt)];
  }
  // The kernel's prepare step for (device type, dtype) when it is a two-phase kernel
  // (kiln/core/kernel.h), or nullptr; kernel() is then its eager form.
  PrepareFn prepare(DeviceType dev, DType dt) const {
    return prepares_[static_cast<int>(dev)][static_cast<int>(dt)];
  }
  // Whether any kernel is registered for `dev`.
  bool has_kernels(DeviceType dev) const;

 private:
  friend class OpRegistry;
  // kernels_[device type][dtype]; written only by the registry.
  std::array<std::array<KernelFn, kNumDTypes>, kNumDeviceTypes> kernels_{};
  std::array<std::array<PrepareFn, kNumDTypes>, kNumDeviceTypes> prepares_{};
};

class OpRegistry {
 public:
  static OpRegistry& global();
  // Throws NotFoundError for an op that is not defined (kernels or a vjp alone do not
  // define one).
  const OpDef& get(std::string_view name) const;
  // nullptr for an op that is not defined.
  const OpDef* find(std::string_view name) const;
  // Every defined op, by name.
  std::vector<const OpDef*> all() const;

  // Registration (static initialisation; ops, kernels and vjps in any order).
  void define(OpDef def);
  void register_kernel(std::string_view op, DeviceType dev, DType dt, KernelFn fn, PrepareFn prepare = nullptr);
  void register_vjp(std::string_view op, VjpFn fn);
  void register_traits(std::string_view op, const OpTraits& traits);

  // The registry's self-test: one line per problem (a kernel, vjp or traits registered
  // under a name no op defines — a misspelt registration that would never run —, an op
  // without inference, an op without a CPU kernel for any dtype, a name in `expected`
  // that is not defined). Empty: consistent.
  std::vector<std::string> verify(std::span<const std::string_view> expected = {}) const;

 private:
  OpDef& slot(std::string_view name);
  // Entries that registration created for kernels or vjps before (or without) the
  // op's definition: defined == false.
  struct Entry {
    OpDef def;
    bool defined = false;
    bool has_traits = false;
  };
  std::map<std::string, Entry, std::less<>> ops_;
};

// Static registration helpers.
struct OpRegistration {
  explicit OpRegistration(OpDef def);
};
// Attaches a vjp to an op (registration order does not matter).
struct VjpRegistration {
  VjpRegistration(const char* op, VjpFn fn);
};
// Attaches traits to an op (registration order does not matter).
struct OpTraitsRegistration {
  OpTraitsRegistration(const char* op, const OpTraits& traits);
};

}  // namespace kiln

#define KILN_REGISTER_OP(...) \
  static ::kiln::OpRegistration KILN_CONCAT(kiln_op_reg_, __COUNTER__)(__VA_ARGS__)
#define KILN_REGISTER_VJP(op, fn) \
  static ::kiln::VjpRegistration KILN_CONCAT(kiln_vjp_reg_, __COUNTER__)(op, fn)
#define KILN_REGISTER_OP_TRAITS(op, ...) \
  static ::kiln::OpTraitsRegistration KILN_CONCAT(kiln_traits_reg_, __COUNTER__)(op, __VA_ARGS__)
