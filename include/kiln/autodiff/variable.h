#pragma once
// Variable: a named, mutable tensor slot that models train (Keras's tf.Variable).
//
// A Variable is a handle: copies share the same slot, so a layer, its optimizer and a
// checkpoint all see one value. `value()` returns the current tensor and tells every
// gradient tape recording on this thread (that watches accessed variables) to watch
// it; `assign()` replaces the value (same shape and dtype) and is not recorded.
//
// Autocasting (Keras's AutoCastVariable, for mixed precision): inside an
// AutocastScope(dtype) on the current thread, `value()` of a floating-point variable
// of another floating dtype returns the value cast to `dtype`. The cast is an op, so
// tapes record it and gradients reach the variable in its own dtype. Layers open the
// scope around call() when their dtype policy computes in a narrower type.
//
// Mirrored variables (kiln/distribute/strategy.h): a variable may hold one copy per
// replica of a distribution strategy, each on its replica's device. value(), peek(),
// assign() and value_is_exclusive() then act on the copy of the current thread's
// replica (ReplicaScope); copy 0 (the variable's value before it was mirrored) outside
// any replica scope, so checkpoints, exports and single-device code see copy 0.
//
// Thread-safety: none, except that the replica threads of a strategy may use their own
// copies of one mirrored variable at the same time.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln {

class Variable {
 public:
  Variable() = default;  // undefined: defined() == false
  Variable(Tensor initial, std::string name, bool trainable = true);

  bool defined() const { return state_ != nullptr; }
  // The current value (cast to the autocast dtype, see above); watched by tapes that
  // watch accessed variables.
  Tensor value() const;
  // The current value, without telling tapes (for optimizers, checkpoints, printing).
  const Tensor& peek() const;
  // Replaces the value; throws InvalidArgumentError on a shape or dtype change.
  void assign(const Tensor& v) const;
  // Whether the value's buffer is held by this variable alone (no tensor anyone kept)
  // and owned by an allocator (not borrowed, e.g. a mapped package): an update may then
  // write over it unseen (optimizers, the graph executor). Not a read (no observer).
  bool value_is_exclusive() const;
  const std::string& name() const;
  bool trainable() const;
  void set_trainable(bool t) const;
  const Shape& shape() const { return peek().shape(); }
  DType dtype() const { return peek().dtype(); }
  int64_t numel() const { return peek().numel(); }
  // Stable identity of the slot (same for every copy of the handle).
  uintptr_t uid() const { return reinterpret_cast<uintptr_t>(state_.get()); }
  bool is_same(const Variable& o) const { return state_ == o.state_; }

  // Gives the variable one copy per device: copy 0 (moved to devices[0] if it is
  // elsewhere) and copies r >= 1 of it on devices[r], replacing any earlier copies (so
  // mirroring again makes every copy equal to copy 0 again). An empty list: back to one
  // copy.
  void mirror(const std::vector<Device>& devices) const;
  // 1 unless mirrored.
  int num_replicas() const;
  // Copy r (no observer, no tape); r < num_replicas().
  const Tensor& replica_value(int r) const;
  // Replaces copy r (same shape and dtype; not observed).
  void assign_replica(int r, const Tensor& v) const;

 private:
  struct State {
    Tensor value;                  // copy 0
    std::vector<Tensor> replicas;  // copies 1..N-1 when mirrored
    std::string name;
    bool trainable = true;
    Tensor& current();
  };
  std::shared_ptr<State> state_;
};

// Observes every read (value() and peek()) and assign() of any Variable on the current
// thread: graph tracing (kiln/graph/function.h) captures variables by reference with it.
class VariableObserver {
 public:
  virtual ~VariableObserver() = default;
  virtual void on_read(const Variable& var, const Tensor& value) = 0;
  virtual void on_assign(const Variable& var, const Tensor& value) = 0;
};
// Installs an observer for the current thread; returns the previous one.
VariableObserver* set_variable_observer(VariableObserver* observer);

// The replica the current thread runs (a strategy's replica threads open one): mirrored
// variables read and write that copy. Scopes nest; 0 outside any.
class ReplicaScope {
 public:
  explicit ReplicaScope(int replica);
  ~ReplicaScope();
  ReplicaScope(const ReplicaScope&) = delete;
  ReplicaScope& operator=(const ReplicaScope&) = delete;
  static int current();

 private:
  int previous_;
};

// Sets the autocast dtype of the current thread for its lifetime (nested scopes
// restore the outer one); std::nullopt turns autocasting off inside the scope.
class AutocastScope {
 public:
  explicit AutocastScope(std::optional<DType> dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  // The dtype floating variables are read as on this thread (nullopt: as stored).
  static std::optional<DType> current();

 private:
  std::optional<DType> previous_;
};

}  // namespace kiln
