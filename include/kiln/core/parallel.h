#pragma once
// The intra-op thread pool.
//
// kiln has exactly one intra-op pool per process: the OpenMP runtime, which oneDNN
// (Debian's build uses OpenMP threading) also runs on. Sharing it means kiln's own
// loops and oneDNN's kernels never spin two pools on the same cores. The size is the
// number of cores, or KILN_NUM_THREADS if set, or set_num_threads().
#include <cstdint>
#include <functional>

namespace kiln {

// The threads the calling thread's parallel regions use: the pool size, or less under a
// ThreadLimitScope.
int num_threads();
// Sets the pool size for subsequent parallel regions (>= 1).
void set_num_threads(int n);

// Caps the calling thread's parallel regions (kiln's loops and oneDNN's, which read the
// thread's OpenMP thread count) at `n` threads (>= 1) for the scope's lifetime. For a
// thread that shares the cores with others doing the same work, e.g. the replica threads
// of a distribution strategy: N replicas of 1 thread each instead of N x the pool.
// Scopes nest (the inner one wins until it ends); a cap above the pool size changes
// nothing.
class ThreadLimitScope {
 public:
  explicit ThreadLimitScope(int n);
  ~ThreadLimitScope();
  ThreadLimitScope(const ThreadLimitScope&) = delete;
  ThreadLimitScope& operator=(const ThreadLimitScope&) = delete;

 private:
  int previous_;
};

// Runs fn(begin, end) over [0, n) split into contiguous ranges of at least `grain`
// iterations, on the intra-op pool. Runs inline when n <= grain or when called from
// inside a parallel region. fn must not throw.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& fn);

// Runs a and b at the same time on two threads of the pool (inter-op parallelism: the
// graph executor's independent branches). Each sees a parallel region, so kiln's loops
// and oneDNN primitives inside run on its thread alone. Sequential (a, then b) with one
// thread or when called inside a parallel region. An exception from either is rethrown
// (a's first) after both have finished.
void parallel_invoke(const std::function<void()>& a, const std::function<void()>& b);

// Ends the calling thread's idle pool workers; its next parallel region starts them
// again. For a thread done with parallel work for long (one that loaded models and now
// waits): the OpenMP runtime keeps workers for every thread that ever ran a parallel
// region, and once it holds more threads than there are CPUs, libgomp stops spinning
// between regions, so each region of the threads still working waits for its workers to
// wake (a served language model decoded 25% slower per token with the loading thread's
// workers kept; docs/perf-decisions/029-idle-openmp-teams.md). No-op inside a parallel
// region.
void release_idle_workers();

// memcpy split across the pool for large copies (one thread cannot saturate memory
// bandwidth); plain memcpy below a few hundred KiB.
void parallel_memcpy(void* dst, const void* src, int64_t nbytes);

namespace detail {
void parallel_for_impl(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
bool in_parallel_region();
}  // namespace detail

template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  if (n <= grain || num_threads() == 1 || detail::in_parallel_region()) {
    fn(int64_t{0}, n);
    return;
  }
  detail::parallel_for_impl(n, grain, std::function<void(int64_t, int64_t)>(fn));
}

}  // namespace kiln
