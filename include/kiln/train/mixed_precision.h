#pragma once
// Mixed precision (keras.mixed_precision): dtype policies for layers.
//
// A policy names the dtype a layer computes in and the dtype its variables are
// stored in:
//   "float32"         compute f32, variables f32 (the default)
//   "mixed_bfloat16"  compute bf16, variables f32
//   "mixed_float16"   compute f16, variables f32 (train with LossScaleOptimizer)
//
// A layer takes the global policy when it is constructed (set_global_policy changes
// the policy of layers created afterwards) or one given with Layer::set_dtype_policy.
// Under a mixed policy a layer casts its floating-point inputs to the compute dtype and
// reads its variables as the compute dtype (Variable autocasting, see
// kiln/autodiff/variable.h), so the matmuls and convolutions run in 16 bits while the
// optimizer updates f32 variables. Exceptions, as Keras recommends:
//   - normalization layers (BatchNormalization, LayerNormalization) compute their
//     statistics in f32 and return the compute dtype;
//   - a Model's output layers default to float32 (the final activation, softmax
//     included, runs in f32) and a Model's outputs are f32, so losses and metrics are
//     computed in f32.
//
// Thread-safety: the global policy is process-wide; set it before building models.
#include <string>

#include "kiln/core/dtype.h"

namespace kiln::train {

class DTypePolicy {
 public:
  DTypePolicy() = default;  // float32
  // Throws InvalidArgumentError for a name other than the three above.
  explicit DTypePolicy(const std::string& name);
  const std::string& name() const { return name_; }
  DType compute_dtype() const { return compute_; }
  DType variable_dtype() const { return variable_; }
  // compute and variable dtypes differ.
  bool is_mixed() const { return compute_ != variable_; }
  bool operator==(const DTypePolicy& o) const { return name_ == o.name_; }

 private:
  std::string name_ = "float32";
  DType compute_ = DType::kF32;
  DType variable_ = DType::kF32;
};

// The policy layers constructed from now on take.
void set_global_policy(const DTypePolicy& policy);
void set_global_policy(const std::string& name);
DTypePolicy global_policy();

}  // namespace kiln::train
