#include "kiln/train/mixed_precision.h"

#include <mutex>

#include "kiln/core/error.h"

namespace kiln::train {

DTypePolicy::DTypePolicy(const std::string& name) : name_(name) {
  if (name == "float32") {
    compute_ = DType::kF32;
  } else if (name == "mixed_bfloat16") {
    compute_ = DType::kBF16;
  } else if (name == "mixed_float16") {
    compute_ = DType::kF16;
  } else {
    throw InvalidArgumentError("unknown dtype policy '" + name +
                               "'; expected float32, mixed_bfloat16 or mixed_float16");
  }
  variable_ = DType::kF32;
}

namespace {
std::mutex g_mu;
DTypePolicy& global() {
  static DTypePolicy p;
  return p;
}
}  // namespace

void set_global_policy(const DTypePolicy& policy) {
  std::lock_guard<std::mutex> lock(g_mu);
  global() = policy;
}
void set_global_policy(const std::string& name) { set_global_policy(DTypePolicy(name)); }
DTypePolicy global_policy() {
  std::lock_guard<std::mutex> lock(g_mu);
  return global();
}

}  // namespace kiln::train
