#pragma once
// Per-node state a kernel keeps across runs of one compiled graph.
//
// The graph executor (kiln/graph/executor.h) owns one KernelCache per op node of each
// plan and makes it current on the running thread while that node's kernel runs.
// Eager calls see none (current_kernel_cache() is null), and neither does any op a
// kernel calls in turn. What a kernel may keep there must follow from its node's attrs,
// its input shapes and dtypes (fixed within a plan) and the data of the inputs for
// which constant_input(i) is true (graph constants: nothing writes them while the plan
// lives): a constant filter re-laid-out for oneDNN, a parsed program. Inputs that are
// graph inputs or variables change between runs and must never be cached.
//
// This is how ONNX Runtime's kernels pre-pack constant initializers and TensorFlow's
// oneDNN kernels cache reordered weights. Thread-safe: concurrent runs of one plan
// share its caches.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace kiln {

class KernelCache {
 public:
  // Bit i of `constant_inputs` set: input i is a graph constant.
  explicit KernelCache(uint64_t constant_inputs = 0) : constant_(constant_inputs) {}
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  bool constant_input(size_t i) const { return i < 64 && ((constant_ >> i) & 1u) != 0; }

  // The value kept in `slot` (a kernel's own numbering), made by make() -> T on first
  // use. make() runs once, under the cache's lock; it may throw (nothing is kept then).
  template <typename T, typename Make>
  std::shared_ptr<const T> get(int slot, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [s, v] : slots_)
      if (s == slot) return std::static_pointer_cast<const T>(v);
    auto value = std::make_shared<const T>(make());
    slots_.emplace_back(slot, value);
    return value;
  }

 private:
  uint64_t constant_;
  std::mutex mu_;
  std::vector<std::pair<int, std::shared_ptr<const void>>> slots_;
};

// The cache of the graph node whose kernel runs on this thread, or null.
KernelCache* current_kernel_cache();

// Makes `cache` (may be null) current on this thread while alive.
class KernelCacheScope {
 public:
  explicit KernelCacheScope(KernelCache* cache);
  ~KernelCacheScope();
  KernelCacheScope(const KernelCacheScope&) = delete;
  KernelCacheScope& operator=(const KernelCacheScope&) = delete;

 private:
  KernelCache* previous_;
};

}  // namespace kiln
