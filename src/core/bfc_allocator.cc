#include "kiln/core/bfc_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <unordered_map>
#include <vector>

#include "kiln/core/error.h"

#include "core/sanitizers.h"
#ifdef KILN_ASAN
#include <sanitizer/asan_interface.h>
#define KILN_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define KILN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define KILN_POISON(p, n) ((void)(p), (void)(n))
#define KILN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace kiln {
namespace {

constexpr size_t kMinChunk = 256;
constexpr int kNumBins = 21;  // 256 B ... 256 MiB and larger

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

int bin_for(size_t size) {
  int b = 0;
  size_t s = size / kMinChunk;
  while (s > 1 && b < kNumBins - 1) {
    s >>= 1;
    ++b;
  }
  return b;
}

class HostSubAllocator final : public SubAllocator {
 public:
  void* alloc_region(size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
#ifdef MADV_HUGEPAGE
    if (bytes >= (2u << 20)) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
  }
  void free_region(void* ptr, size_t bytes) override { munmap(ptr, bytes); }
};

}  // namespace

std::unique_ptr<SubAllocator> make_host_sub_allocator() { return std::make_unique<HostSubAllocator>(); }

struct BFCAllocator::Impl {
  struct Region;
  struct Chunk {
    char* ptr;
    size_t size;
    size_t requested = 0;
    bool in_use = false;
    Chunk* prev = nullptr;
    Chunk* next = nullptr;
    Region* region;
  };
  struct Region {
    char* base;
    size_t size;
  };
  struct ChunkLess {
    bool operator()(const Chunk* a, const Chunk* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };

  std::unique_ptr<SubAllocator> sub;
  BFCOptions opt;
  mutable std::mutex mu;
  std::set<Chunk*, ChunkLess> bins[kNumBins];
  std::unordered_map<const void*, Chunk*> in_use;
  std::vector<std::unique_ptr<Region>> regions;
  size_t next_region = 0;
  AllocatorStats st;

  void bin_insert(Chunk* c) { bins[bin_for(c->size)].insert(c); }
  void bin_erase(Chunk* c) { bins[bin_for(c->size)].erase(c); }

  Chunk* find_fit(size_t size) {
    for (int b = bin_for(size); b < kNumBins; ++b) {
      auto& bin = bins[b];
      Chunk probe{nullptr, size, 0, false, nullptr, nullptr, nullptr};
      auto it = bin.lower_bound(&probe);
      if (it != bin.end()) {
        Chunk* c = *it;
        bin.erase(it);
        return c;
      }
    }
    return nullptr;
  }

  bool add_region(size_t bytes) {
    void* p = sub->alloc_region(bytes);
    if (!p) return false;
    auto r = std::make_unique<Region>(Region{static_cast<char*>(p), bytes});
    auto* c = new Chunk{r->base, bytes, 0, false, nullptr, nullptr, r.get()};
    KILN_POISON(r->base, bytes);
    regions.push_back(std::move(r));
    st.bytes_reserved += static_cast<int64_t>(bytes);
    st.num_regions = static_cast<int64_t>(regions.size());
    bin_insert(c);
    return true;
  }

  size_t trim_locked() {
    size_t freed = 0;
    for (auto it = regions.begin(); it != regions.end();) {
      Region* r = it->get();
      // A wholly free region is one free chunk spanning it; find it in its bin.
      Chunk probe{r->base, r->size, 0, false, nullptr, nullptr, nullptr};
      auto& bin = bins[bin_for(r->size)];
      auto found = bin.find(&probe);
      if (found != bin.end() && (*found)->region == r) {
        Chunk* c = *found;
        bin.erase(found);
        delete c;
        KILN_UNPOISON(r->base, r->size);
        sub->free_region(r->base, r->size);
        st.bytes_reserved -= static_cast<int64_t>(r->size);
        freed += r->size;
        it = regions.erase(it);
      } else {
        ++it;
      }
    }
    st.num_regions = static_cast<int64_t>(regions.size());
    return freed;
  }

  bool grow(size_t need) {
    size_t size = std::max(next_region, need);
    size = round_up(size, 2u << 20);
    if (opt.memory_limit) {
      size_t left = opt.memory_limit > static_cast<size_t>(st.bytes_reserved)
                        ? opt.memory_limit - static_cast<size_t>(st.bytes_reserved)
                        : 0;
      if (size > left) size = round_up(need, kMinChunk) <= left ? left : 0;
      if (size == 0) return false;
    }
    if (!add_region(size)) {
      if (size == need || !add_region(need)) return false;
    }
    next_region = std::min(std::max(next_region * 2, size_t{kMinChunk}), opt.max_region_bytes);
    return true;
  }

  size_t largest_free() const {
    for (int b = kNumBins - 1; b >= 0; --b)
      if (!bins[b].empty()) return (*bins[b].rbegin())->size;
    return 0;
  }
};

BFCAllocator::BFCAllocator(std::unique_ptr<SubAllocator> sub, BFCOptions options, std::string name)
    : impl_(std::make_unique<Impl>()), name_(std::move(name)) {
  impl_->sub = std::move(sub);
  impl_->opt = options;
  impl_->next_region = std::max<size_t>(options.initial_region_bytes, kMinChunk);
  impl_->st.bytes_limit = static_cast<int64_t>(options.memory_limit);
  if (!options.allow_growth) {
    if (options.memory_limit == 0)
      throw InvalidArgumentError("BFC allocator '" + name_ + "': allow_growth=false needs a memory_limit to reserve");
    if (!impl_->add_region(options.memory_limit))
      throw ResourceExhaustedError("BFC allocator '" + name_ + "': could not reserve " +
                                   std::to_string(options.memory_limit) + " bytes up front");
  }
}

BFCAllocator::~BFCAllocator() {
  // Every chunk is either free (in a bin) or in use (in the map): delete both sets.
  // Buffers still in use at this point leak their tensors' memory; that is the
  // caller's bug, but the process keeps running.
  for (auto& bin : impl_->bins)
    for (Impl::Chunk* c : bin) delete c;
  for (auto& [p, c] : impl_->in_use) {
    (void)p;
    delete c;
  }
  for (auto& r : impl_->regions) {
    KILN_UNPOISON(r->base, r->size);
    impl_->sub->free_region(r->base, r->size);
  }
}

void* BFCAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > (size_t{1} << 60))
    throw ResourceExhaustedError("allocator '" + name_ + "': request of " + std::to_string(bytes) + " bytes is absurd");
  size_t size = round_up(bytes, kMinChunk);
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  Impl::Chunk* c = m.find_fit(size);
  if (!c) {
    if (m.grow(size)) c = m.find_fit(size);
    if (!c && m.trim_locked() > 0 && m.grow(size)) c = m.find_fit(size);
    if (!c) {
      AllocatorStats s = m.st;
      s.largest_free_block = static_cast<int64_t>(m.largest_free());
      throw ResourceExhaustedError("allocator '" + name_ + "' cannot allocate " + std::to_string(bytes) +
                                   " bytes (rounded to " + std::to_string(size) + "): " + s.str());
    }
  }
  if (c->size - size >= kMinChunk) {
    auto* rest = new Impl::Chunk{c->ptr + size, c->size - size, 0, false, c, c->next, c->region};
    if (c->next) c->next->prev = rest;
    c->next = rest;
    c->size = size;
    m.bin_insert(rest);
  }
  c->in_use = true;
  c->requested = bytes;
  m.in_use.emplace(c->ptr, c);
  m.st.num_allocs++;
  m.st.bytes_in_use += static_cast<int64_t>(c->size);
  m.st.peak_bytes_in_use = std::max(m.st.peak_bytes_in_use, m.st.bytes_in_use);
  m.st.largest_alloc_size = std::max(m.st.largest_alloc_size, static_cast<int64_t>(bytes));
  KILN_UNPOISON(c->ptr, bytes);
  return c->ptr;
}

void BFCAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.in_use.find(ptr);
  if (it == m.in_use.end()) {
    std::fprintf(stderr, "kiln: allocator '%s': deallocate of unknown pointer %p ignored\n", name_.c_str(), ptr);
    return;
  }
  Impl::Chunk* c = it->second;
  m.in_use.erase(it);
  m.st.bytes_in_use -= static_cast<int64_t>(c->size);
  c->in_use = false;
  KILN_POISON(c->ptr, c->size);
  if (c->prev && !c->prev->in_use) {
    Impl::Chunk* p = c->prev;
    m.bin_erase(p);
    p->size += c->size;
    p->next = c->next;
    if (c->next) c->next->prev = p;
    delete c;
    c = p;
  }
  if (c->next && !c->next->in_use) {
    Impl::Chunk* n = c->next;
    m.bin_erase(n);
    c->size += n->size;
    c->next = n->next;
    if (n->next) n->next->prev = c;
    delete n;
  }
  m.bin_insert(c);
}

AllocatorStats BFCAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  AllocatorStats s = impl_->st;
  s.largest_free_block = static_cast<int64_t>(impl_->largest_free());
  return s;
}

void BFCAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->st.peak_bytes_in_use = impl_->st.bytes_in_use;
}

size_t BFCAllocator::trim() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->trim_locked();
}

size_t BFCAllocator::allocated_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->in_use.find(ptr);
  return it == impl_->in_use.end() ? 0 : it->second->size;
}

std::string AllocatorStats::str() const {
  return "in_use=" + std::to_string(bytes_in_use) + " peak=" + std::to_string(peak_bytes_in_use) +
         " reserved=" + std::to_string(bytes_reserved) +
         " limit=" + (bytes_limit ? std::to_string(bytes_limit) : std::string("none")) +
         " allocs=" + std::to_string(num_allocs) + " largest_free_block=" + std::to_string(largest_free_block) +
         " regions=" + std::to_string(num_regions);
}

}  // namespace kiln
