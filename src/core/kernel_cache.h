#pragma once
// Per-node state a kernel keeps across runs of one compiled graph.
//
// Internal (not installed). The graph executor (kiln/graph/executor.h) owns one KernelCache per op node and makes
// it current on the running thread while that node's kernel runs (every plan of the
// node, i.e. every input shape, shares it). Eager calls see none
// (current_kernel_cache() is null), and neither does any op a kernel calls in turn. A
// kernel may keep there what follows from its node's attrs and the data of the inputs
// for which constant_input(i) is true (graph constants: nothing writes them while the
// graph lives) — a constant filter re-laid-out for oneDNN, a parsed program — under a
// key naming everything else it depends on (the layout wanted, which inputs are
// scalars: what input shapes decide). Inputs that are graph inputs or variables change
// between runs and must never be cached.
//
// This is how ONNX Runtime's kernels pre-pack constant initializers and TensorFlow's
// oneDNN kernels cache reordered weights. Thread-safe: concurrent runs share the caches.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
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

  // The value kept under `key` (the kernel's own naming), made by make() -> T on first
  // use. make() runs once per key, under the cache's lock; it may throw (nothing is
  // kept then). At most kMaxEntries keys are kept (the oldest goes first).
  template <typename T, typename Make>
  std::shared_ptr<const T> get(std::string_view key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, v] : entries_)
      if (k == key) return std::static_pointer_cast<const T>(v);
    auto value = std::make_shared<const T>(make());
    if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
    entries_.emplace_back(std::string(key), value);
    return value;
  }
  static constexpr size_t kMaxEntries = 16;

 private:
  uint64_t constant_;
  std::mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<const void>>> entries_;
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
