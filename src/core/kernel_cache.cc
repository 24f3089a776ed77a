#include "kernel_cache.h"

namespace kiln {
namespace {
thread_local KernelCache* t_current = nullptr;
}  // namespace

KernelCache* current_kernel_cache() { return t_current; }

KernelCacheScope::KernelCacheScope(KernelCache* cache) : previous_(t_current) { t_current = cache; }
KernelCacheScope::~KernelCacheScope() { t_current = previous_; }

}  // namespace kiln
