#pragma once
// GradientTape: reverse-mode automatic differentiation over eager ops (tf.GradientTape).
//
//   kiln::GradientTape tape;
//   Tensor y = ops::sum(ops::square(w.value()));   // w: a trainable Variable
//   auto grads = tape.gradient(y, {w});            // dy/dw = 2w
//
// While a tape is alive (and not paused) it records every op on this thread whose
// inputs include a watched tensor: tensors passed to `watch`, trainable variables read
// through `Variable::value()` (unless watch_accessed_variables is false), and the
// outputs of recorded ops. `gradient` walks the record backwards through each op's
// vjp (see OpDef::vjp). Ops declared non-differentiable (comparisons, argmax, random
// ...) stop gradients; an op with no vjp on the path is an UnimplementedError.
//
// Tapes nest: an outer tape records what an inner tape's `gradient` computes, which
// gives gradients of gradients. A non-persistent tape allows one `gradient` call and
// frees its record then; a persistent one allows many.
//
// Thread-safety: a tape belongs to the thread that created it and records only that
// thread's ops; destroy tapes in reverse order of creation.
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/autodiff/variable.h"
#include "kiln/core/dispatch.h"

namespace kiln {

// What `gradient` returns for a source the target does not depend on.
enum class UnconnectedGradients { kNone, kZero };

class GradientTape final : public OpObserver {
 public:
  explicit GradientTape(bool persistent = false, bool watch_accessed_variables = true);
  ~GradientTape() override;
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  void watch(const Tensor& t);
  void watch(const Variable& v);

  // d(sum(target * output_gradient)) / d(source) for each source; output_gradient
  // defaults to ones. Integer sources get an undefined tensor. Throws
  // FailedPreconditionError when a non-persistent tape is asked twice.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources,
                               const Tensor& output_gradient = {},
                               UnconnectedGradients unconnected = UnconnectedGradients::kNone);
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable>& sources,
                               const Tensor& output_gradient = {},
                               UnconnectedGradients unconnected = UnconnectedGradients::kNone);

  // Stops recording while alive (tf.GradientTape.stop_recording).
  class Pause {
   public:
    explicit Pause(GradientTape& tape);
    ~Pause();

   private:
    GradientTape& tape_;
    bool was_;
  };

  bool persistent() const { return persistent_; }
  size_t recorded_ops() const { return nodes_.size(); }
  // Forgets everything recorded and watched.
  void reset();

  void on_op(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
             const Attrs& attrs) override;

  // Internal: called by Variable::value() for every active tape on this thread.
  static void notify_variable_read(const Tensor& value, bool trainable);

 private:
  struct Node {
    const OpDef* op;
    std::vector<Tensor> inputs;
    std::vector<Tensor> outputs;
    Attrs attrs;
  };
  bool persistent_;
  bool watch_variables_;
  bool recording_ = true;
  bool used_ = false;
  OpObserver* prev_observer_ = nullptr;
  GradientTape* prev_tape_ = nullptr;
  std::unordered_set<uint64_t> watched_;
  std::vector<Node> nodes_;
};

// True when `t` is a floating dtype (the only ones that carry gradients).
bool is_differentiable_dtype(DType t);

}  // namespace kiln
