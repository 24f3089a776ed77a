#include "kiln/core/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <omp.h>
#include <thread>

#include "kiln/core/denormals.h"
#include "kiln/core/flags.h"
#include "core/omp_team.h"

namespace kiln {
namespace {
int initial_threads() {
  if (flags().num_threads >= 1) return flags().num_threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}
std::atomic<int>& threads() {
  static std::atomic<int> n{[] {
    int t = initial_threads();
    omp_set_num_threads(t);  // oneDNN runs on the same OpenMP pool
    return t;
  }()};
  return n;
}
thread_local int t_limit = 0;  // ThreadLimitScope's cap on this thread; 0: none
}  // namespace

int num_threads() {
  const int n = threads().load(std::memory_order_relaxed);
  return t_limit > 0 ? std::min(n, t_limit) : n;
}

void set_num_threads(int n) {
  n = std::max(1, n);
  threads().store(n);
  omp_set_num_threads(t_limit > 0 ? std::min(n, t_limit) : n);
}

ThreadLimitScope::ThreadLimitScope(int n) : previous_(t_limit) {
  t_limit = std::max(1, n);
  omp_set_num_threads(num_threads());  // this thread's OpenMP count: what oneDNN reads
}

ThreadLimitScope::~ThreadLimitScope() {
  t_limit = previous_;
  omp_set_num_threads(num_threads());
}

void parallel_memcpy(void* dst, const void* src, int64_t nbytes) {
  if (nbytes <= 0) return;
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  parallel_for(nbytes, int64_t{256} << 10, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, e - b); });
}

void parallel_invoke(const std::function<void()>& a, const std::function<void()>& b) {
  if (num_threads() < 2 || detail::in_parallel_region()) {
    a();
    b();
    return;
  }
  std::exception_ptr err[2];
  auto guarded = [&](int k) {
    try {
      (k == 0 ? a : b)();
    } catch (...) {
      err[k] = std::current_exception();
    }
  };
  detail::omp_team(2, [&](int t, int T) {
    if (T == 1) {  // the runtime gave one thread: run both here
      guarded(0);
      guarded(1);
    } else if (t < 2) {
      if (t == 1) detail::apply_denormal_mode_on_worker();
      guarded(t);
    }
  });
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
}

void release_idle_workers() {
  if (omp_in_parallel()) return;
  omp_pause_resource(omp_pause_soft, omp_get_initial_device());
}

namespace detail {
bool in_parallel_region() { return omp_in_parallel() != 0; }

void parallel_for_impl(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  int nt = static_cast<int>(std::min<int64_t>(num_threads(), max_chunks));
  omp_team(nt, [&](int t, int T) {
    if (t != 0) apply_denormal_mode_on_worker();  // workers follow kiln's mode (kiln/core/denormals.h)
    int64_t begin = n * t / T, end = n * (t + 1) / T;
    if (begin < end) fn(begin, end);
  });
}
}  // namespace detail

}  // namespace kiln
