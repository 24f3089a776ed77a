#pragma once
// Best-fit-with-coalescing allocator (the design of TensorFlow's BFC allocator).
//
// Memory is obtained from a SubAllocator in regions. Each region is split into
// chunks; free chunks sit in size-class bins (powers of two from 256 bytes) and a
// request takes the smallest free chunk that fits, splitting off the remainder. On
// free, a chunk merges with free neighbours. Regions are kept (not handed back to
// the system) so that a training step that allocates the same buffers every
// iteration never page-faults; `trim()` returns wholly free regions on demand.
//
// allow_growth = true: regions are allocated on demand, doubling in size from
// `initial_region_bytes`. allow_growth = false: one region of `memory_limit` bytes is
// reserved at construction (memory_limit must be set).
//
// Under AddressSanitizer free chunks and the slack after each allocation are
// poisoned, so out-of-bounds accesses inside a region are still caught.
//
// Thread-safe (one mutex).
#include <memory>
#include <mutex>
#include <string>

#include "kiln/core/allocator.h"

namespace kiln {

struct BFCOptions {
  size_t memory_limit = 0;                    // 0 = unlimited
  bool allow_growth = true;
  size_t initial_region_bytes = 2u << 20;     // first region when growing
  size_t max_region_bytes = size_t{1} << 31;  // growth stops doubling here
};

class BFCAllocator final : public Allocator {
 public:
  BFCAllocator(std::unique_ptr<SubAllocator> sub, BFCOptions options, std::string name);
  ~BFCAllocator() override;
  BFCAllocator(const BFCAllocator&) = delete;
  BFCAllocator& operator=(const BFCAllocator&) = delete;

  const char* name() const override { return name_.c_str(); }
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  AllocatorStats stats() const override;
  // Sets peak_bytes_in_use to the current bytes_in_use (tf.config.experimental.reset_memory_stats).
  void reset_peak();
  // Returns regions with no allocation in them to the SubAllocator; returns bytes freed.
  size_t trim();
  // Size of the chunk behind an allocation (>= the request). For tests.
  size_t allocated_size(const void* ptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string name_;
};

// Page-aligned anonymous memory from the OS (mmap), with transparent huge pages
// advised for large regions.
std::unique_ptr<SubAllocator> make_host_sub_allocator();

}  // namespace kiln
