// KernelCache: one make() per slot, shared by concurrent callers; constant-input bits;
// the current cache is per thread and eager op calls inside a kernel see none.
#include "core/kernel_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace kiln {
namespace {

TEST(KernelCache, MakesEachSlotOnceAndKeepsIt) {
  KernelCache cache(0b101);
  EXPECT_TRUE(cache.constant_input(0));
  EXPECT_FALSE(cache.constant_input(1));
  EXPECT_TRUE(cache.constant_input(2));
  EXPECT_FALSE(cache.constant_input(64));
  int makes = 0;
  auto a = cache.get<int>("a", [&] { return ++makes * 10; });
  auto b = cache.get<int>("a", [&] { return ++makes * 10; });
  auto c = cache.get<int>("b", [&] { return ++makes * 10; });
  EXPECT_EQ(*a, 10);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(*c, 20);
  EXPECT_EQ(makes, 2);
}

TEST(KernelCache, AFailedMakeKeepsNothing) {
  KernelCache cache;
  EXPECT_THROW(cache.get<int>("a", []() -> int { throw std::runtime_error("no"); }), std::runtime_error);
  EXPECT_EQ(*cache.get<int>("a", [] { return 3; }), 3);
}

TEST(KernelCache, KeepsTheNewestEntries) {
  KernelCache cache;
  for (size_t i = 0; i < KernelCache::kMaxEntries + 1; ++i) cache.get<size_t>(std::to_string(i), [i] { return i; });
  int makes = 0;
  EXPECT_EQ(*cache.get<size_t>(std::to_string(KernelCache::kMaxEntries), [&] { return static_cast<size_t>(++makes); }),
            KernelCache::kMaxEntries);  // kept
  EXPECT_EQ(*cache.get<size_t>("0", [&] { return size_t{100} + static_cast<size_t>(++makes); }), 101u);  // evicted
  EXPECT_EQ(makes, 1);
}

TEST(KernelCache, ConcurrentCallersShareOneValue) {
  KernelCache cache;
  std::atomic<int> makes{0};
  std::vector<const int*> seen(8);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) seen[t] = cache.get<int>("c", [&] { return ++makes; }).get();
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(makes.load(), 1);
  for (const int* p : seen) EXPECT_EQ(p, seen[0]);
}

TEST(KernelCache, CurrentCacheIsPerThreadAndScoped) {
  KernelCache outer, inner;
  EXPECT_EQ(current_kernel_cache(), nullptr);
  {
    KernelCacheScope s1(&outer);
    EXPECT_EQ(current_kernel_cache(), &outer);
    {
      KernelCacheScope s2(&inner);
      EXPECT_EQ(current_kernel_cache(), &inner);
      std::thread([] { EXPECT_EQ(current_kernel_cache(), nullptr); }).join();
    }
    EXPECT_EQ(current_kernel_cache(), &outer);
  }
  EXPECT_EQ(current_kernel_cache(), nullptr);
}

}  // namespace
}  // namespace kiln
