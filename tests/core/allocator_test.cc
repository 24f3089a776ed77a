#include <thread>
#include <vector>

#include "test_util.h"
#include "kiln/core/allocator.h"
#include "kiln/core/bfc_allocator.h"
#include "kiln/core/error.h"

namespace kiln::testing {
namespace {


TEST(BFCAllocator, AllocatesAlignedAndTracksStats) {
  BFCOptions o;
  BFCAllocator a(make_host_sub_allocator(), o, "test");
  void* p = a.allocate(1000);
  void* q = a.allocate(1);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Allocator::kAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % Allocator::kAlignment, 0u);
  EXPECT_EQ(a.allocated_size(p), 1024u);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_allocs, 2);
  EXPECT_EQ(s.bytes_in_use, 1024 + 256);
  EXPECT_EQ(s.largest_alloc_size, 1000);
  a.deallocate(p);
  a.deallocate(q);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.peak_bytes_in_use, 1024 + 256);
  EXPECT_EQ(a.allocate(0), nullptr);
}

TEST(BFCAllocator, CoalescesFreedNeighbours) {
  BFCOptions o;
  o.initial_region_bytes = 2 << 20;
  BFCAllocator a(make_host_sub_allocator(), o, "test");
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(a.allocate(256 << 10));  // 8 x 256 KiB fills 2 MiB
  EXPECT_EQ(a.stats().num_regions, 1);
  // Free every other block: fragmentation, largest free block is 256 KiB.
  for (int i = 0; i < 8; i += 2) a.deallocate(ps[i]);
  EXPECT_EQ(a.stats().largest_free_block, 256 << 10);
  // Freeing the rest coalesces everything back into one 2 MiB block.
  for (int i = 1; i < 8; i += 2) a.deallocate(ps[i]);
  EXPECT_EQ(a.stats().largest_free_block, 2 << 20);
  void* big = a.allocate(2 << 20);  // fits without a new region
  EXPECT_EQ(a.stats().num_regions, 1);
  a.deallocate(big);
}

TEST(BFCAllocator, BestFitPicksSmallestHole) {
  BFCOptions o;
  o.initial_region_bytes = 2 << 20;
  BFCAllocator a(make_host_sub_allocator(), o, "test");
  void* x = a.allocate(4096);
  void* sep1 = a.allocate(256);
  void* y = a.allocate(1024);
  void* sep2 = a.allocate(256);
  a.deallocate(x);
  a.deallocate(y);
  void* z = a.allocate(1000);  // the 1 KiB hole, not the 4 KiB one
  EXPECT_EQ(z, y);
  a.deallocate(z);
  a.deallocate(sep1);
  a.deallocate(sep2);
}

TEST(BFCAllocator, MemoryLimitGivesResourceExhausted) {
  BFCOptions o;
  o.memory_limit = 4 << 20;
  o.initial_region_bytes = 1 << 20;
  BFCAllocator a(make_host_sub_allocator(), o, "limited");
  void* p = a.allocate(3 << 20);
  EXPECT_KILN_ERROR(a.allocate(2 << 20), kResourceExhausted, "cannot allocate 2097152 bytes");
  try {
    a.allocate(2 << 20);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("limit=4194304"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("largest_free_block"), std::string::npos) << e.what();
  }
  a.deallocate(p);
  // After freeing, the same request succeeds: the allocator is intact.
  void* q = a.allocate(2 << 20);
  EXPECT_NE(q, nullptr);
  a.deallocate(q);
  EXPECT_LE(a.stats().bytes_reserved, 4 << 20);
}

TEST(BFCAllocator, NoGrowthReservesLimitUpFront) {
  BFCOptions o;
  o.memory_limit = 1 << 20;
  o.allow_growth = false;
  BFCAllocator a(make_host_sub_allocator(), o, "fixed");
  EXPECT_EQ(a.stats().bytes_reserved, 1 << 20);
  void* p = a.allocate(1 << 20);
  EXPECT_KILN_ERROR(a.allocate(256), kResourceExhausted, "cannot allocate");
  a.deallocate(p);
  BFCOptions bad;
  bad.allow_growth = false;
  EXPECT_KILN_ERROR(BFCAllocator(make_host_sub_allocator(), bad, "x"), kInvalidArgument, "memory_limit");
}

TEST(BFCAllocator, RegionsGrowAndTrim) {
  BFCOptions o;
  o.initial_region_bytes = 2 << 20;
  BFCAllocator a(make_host_sub_allocator(), o, "grow");
  void* p = a.allocate(2 << 20);
  void* q = a.allocate(3 << 20);  // needs a second region
  EXPECT_EQ(a.stats().num_regions, 2);
  a.deallocate(q);
  EXPECT_GE(a.trim(), size_t{3} << 20);
  EXPECT_EQ(a.stats().num_regions, 1);
  a.deallocate(p);
}

TEST(BFCAllocator, AbsurdRequestIsAnErrorNotACrash) {
  BFCOptions o;
  BFCAllocator a(make_host_sub_allocator(), o, "x");
  EXPECT_KILN_ERROR(a.allocate(size_t{1} << 62), kResourceExhausted, "absurd");
}

TEST(BFCAllocator, ConcurrentAllocFree) {
  BFCOptions o;
  BFCAllocator a(make_host_sub_allocator(), o, "mt");
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&a, t] {
      std::vector<void*> mine;
      for (int i = 0; i < 2000; ++i) {
        mine.push_back(a.allocate(static_cast<size_t>(64 + (i * 37 + t * 101) % 5000)));
        if (i % 3 == 0) {
          a.deallocate(mine.back());
          mine.pop_back();
        }
      }
      for (void* p : mine) a.deallocate(p);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(a.stats().bytes_in_use, 0);
  EXPECT_EQ(a.stats().largest_free_block, a.stats().bytes_reserved > 0 ? a.stats().largest_free_block : 0);
}

}  // namespace
}  // namespace kiln::testing
