#pragma once
// Allocator interface and statistics. Tensor buffers on every device come from an
// Allocator owned by that device's backend.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

struct AllocatorStats {
  int64_t num_allocs = 0;            // allocations served since creation
  int64_t bytes_in_use = 0;          // bytes handed out now (rounded chunk sizes)
  int64_t peak_bytes_in_use = 0;
  int64_t largest_alloc_size = 0;
  int64_t bytes_reserved = 0;        // bytes held from the system (all regions)
  int64_t bytes_limit = 0;           // 0 = no limit
  int64_t largest_free_block = 0;
  int64_t num_regions = 0;
  std::string str() const;
};

// Thread-safe: every method may be called concurrently.
class Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  virtual ~Allocator() = default;
  virtual const char* name() const = 0;
  // Returns a kAlignment-aligned block of at least `bytes` (nullptr for 0 bytes).
  // Throws ResourceExhaustedError (with the request and the stats) when the memory
  // limit or the system refuses; never aborts.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual AllocatorStats stats() const = 0;
};

// Raw memory of a device, in big regions: what a BFC allocator carves up.
class SubAllocator {
 public:
  virtual ~SubAllocator() = default;
  // Returns nullptr when the device cannot provide the region.
  virtual void* alloc_region(size_t bytes) = 0;
  virtual void free_region(void* ptr, size_t bytes) = 0;
};

}  // namespace kiln
