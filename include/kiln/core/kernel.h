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
// Thread-safety: a kernel may run on any thread, concurrently with itself.
#include <initializer_list>
#include <span>

#include "kiln/core/attrs.h"
#include "kiln/core/device.h"
#include "kiln/core/tensor.h"

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

struct KernelRegistration {
  KernelRegistration(const char* op, DeviceType dev, std::initializer_list<DType> dtypes, KernelFn fn);
  KernelRegistration(const char* op, DeviceType dev, DType dtype, KernelFn fn);
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_REGISTER_KERNEL(op, dev, dtypes, fn) \
  static ::kiln::KernelRegistration KILN_CONCAT(kiln_kernel_reg_, __COUNTER__)(op, dev, dtypes, fn)
