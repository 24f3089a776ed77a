#pragma once
// What a kernel sees and how it registers: the header kernel files include.
//
// A kernel computes an op's outputs, already allocated with the shapes and dtypes the
// op's inference gives, from its inputs and attributes. Kernels register per (op name,
// device type, dtype) at static-initialisation time with KILN_REGISTER_KERNEL; the op
// itself (kiln/core/op_def.h) is registered by the ops layer. A kernel registered
// under a name no op defines is reported by the registry self-test
// (OpRegistry::verify), never silently dead.
//
// Two-phase kernels (as ONNX Runtime's OpKernel): a kernel that has work to do once per
// node and input shapes — choose its algorithm, parse its attributes, re-lay-out a
// constant filter or weight matrix — registers a PrepareFn with
// KILN_REGISTER_PREPARED_KERNEL. The graph executor prepares each such node once per
// plan (input shapes and dtypes) and runs the PreparedKernel on every run; an eager call
// prepares and runs at once (kernel() of the op is that composition).
//
// Thread-safety: a kernel may run on any thread, concurrently with itself; so may one
// PreparedKernel (run is const).
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/attrs.h"
#include "kiln/core/device.h"
#include "kiln/core/tensor.h"
#include "kiln/core/tensor_spec.h"

namespace kiln {

struct OpDef;

struct OpContext {
  const OpDef& op;
  std::span<const Tensor> in;
  std::span<Tensor> out;
  const Attrs& attrs;
};

// Computes outputs (already allocated with the inferred shapes) from inputs.
using KernelFn = void (*)(OpContext& ctx);

// A kernel prepared for one node and its input shapes and dtypes.
class PreparedKernel {
 public:
  virtual ~PreparedKernel() = default;
  // Computes the outputs for inputs with the shapes and dtypes prepare saw; an input
  // prepare saw as constant is that very tensor's data.
  virtual void run(OpContext& ctx) const = 0;
};

// What prepare sees: the inputs' and outputs' metadata, the attrs, and the inputs whose
// data stays the same for the prepared kernel's whole life (a graph's constants).
struct PrepareContext {
  const OpDef& op;
  DeviceType device;
  std::span<const TensorMeta> in;
  std::span<const TensorMeta> out;
  // Per input: defined = a constant (its data may be read and kept in derived forms);
  // undefined = data known only at run time. Empty: no input is constant (eager).
  std::span<const Tensor> constants;
  const Attrs& attrs;
  // The same node's kernel prepared for other input shapes, or null: what it derived
  // from constants may be shared when it matches (a graph served at many batch sizes
  // then keeps one packed filter). Only ever of the calling kernel's own type.
  const PreparedKernel* previous = nullptr;

  const Tensor* constant(size_t i) const {
    return i < constants.size() && constants[i].defined() ? &constants[i] : nullptr;
  }
};
using PrepareFn = std::unique_ptr<const PreparedKernel> (*)(const PrepareContext& ctx);

struct KernelRegistration {
  KernelRegistration(const char* op, DeviceType dev, std::initializer_list<DType> dtypes, KernelFn fn,
                     PrepareFn prepare = nullptr);
  KernelRegistration(const char* op, DeviceType dev, DType dtype, KernelFn fn, PrepareFn prepare = nullptr);
};

namespace detail {
// The eager form of a prepared kernel: prepare without constants, then run.
void prepare_and_run(PrepareFn prepare, OpContext& ctx);
template <PrepareFn P>
void run_prepared_eagerly(OpContext& ctx) {
  prepare_and_run(P, ctx);
}
}  // namespace detail

// Counts a kernel that could not take its fast path and ran a slower one (a oneDNN
// primitive it could not create, a reorder that failed): `op` and `why` name it in
// kernel_fallbacks() and in the graph profiler's trace. Cheap; any thread.
void note_kernel_fallback(const char* op, const char* why);
struct KernelFallback {
  std::string op, why;
  int64_t count = 0;
};
// Every fallback counted since the process started, by (op, why).
std::vector<KernelFallback> kernel_fallbacks();

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_REGISTER_KERNEL(op, dev, dtypes, fn) \
  static ::kiln::KernelRegistration KILN_CONCAT(kiln_kernel_reg_, __COUNTER__)(op, dev, dtypes, fn)
// A two-phase kernel: `prepare` (a PrepareFn) makes the PreparedKernel a graph keeps per
// node and shapes; eager calls prepare and run at once.
#define KILN_REGISTER_PREPARED_KERNEL(op, dev, dtypes, prepare)                                                    \
  static ::kiln::KernelRegistration KILN_CONCAT(kiln_kernel_reg_, __COUNTER__)(                                   \
      op, dev, dtypes, &::kiln::detail::run_prepared_eagerly<prepare>, prepare)
