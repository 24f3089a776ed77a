#pragma once
// Running an op eagerly, and watching what runs.
//
// call_op validates (through the op's inference), allocates outputs and runs the kernel
// chosen by (device type, dtype); the graph executor runs the same kernels on planned
// buffers (kiln/graph/executor.h), and run_kernel lets one kernel run another's.
//
// Thread-safety: all functions may be called from any thread; the observer is per thread.
#include <span>
#include <vector>

#include "kiln/core/attrs.h"
#include "kiln/core/device.h"
#include "kiln/core/kernel.h"
#include "kiln/core/tensor.h"

namespace kiln {

struct OpDef;

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

// The kernel of ctx.op for ctx.device, chosen as call_op chooses it, prepared for
// ctx's shapes and constants: a two-phase kernel's prepare step, a plain kernel as it
// is. What the graph executor runs, and how one kernel prepares another it composes
// (a quantised convolution's f32 route). Throws UnimplementedError when there is none.
std::unique_ptr<const PreparedKernel> prepare_kernel(const PrepareContext& ctx);

}  // namespace kiln
