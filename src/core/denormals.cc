#include "kiln/core/denormals.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <omp.h>

#include "kiln/core/flags.h"
#include "kiln/core/parallel.h"
#include "core/omp_team.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KILN_HAVE_MXCSR 1
#endif

namespace kiln {
namespace {

std::atomic<bool>& mode() {
  static std::atomic<bool> on{flags().flush_denormals};
  return on;
}

#ifdef KILN_HAVE_MXCSR
constexpr unsigned kBits = 0x8040;  // FTZ (bit 15) | DAZ (bit 6)
unsigned read() { return _mm_getcsr(); }
void write(unsigned csr) { _mm_setcsr(csr); }
#else
constexpr unsigned kBits = 0;
unsigned read() { return 0; }
void write(unsigned) {}
#endif

// What this thread's OpenMP team was last given: the most threads and the mode (a
// smaller team, as inside onednn::SerialScope, is part of it).
struct Team {
  int threads = 0;
  bool on = false;
};
thread_local Team team;

}  // namespace

void set_flush_denormals(bool on) { mode().store(on, std::memory_order_relaxed); }
bool flush_denormals() { return mode().load(std::memory_order_relaxed); }

namespace detail {

DenormalScope::DenormalScope() {
  if (kBits == 0 || !flush_denormals()) return;
  const unsigned csr = read();
  if ((csr & kBits) == kBits) return;
  saved_ = csr;
  restore_ = true;
  write(csr | kBits);
}

DenormalScope::~DenormalScope() {
  if (restore_) write(saved_);
}

void apply_denormal_mode_on_worker() {
  if (kBits == 0) return;
  const unsigned csr = read(), want = flush_denormals() ? csr | kBits : csr & ~kBits;
  if (csr != want) write(want);
}

void prepare_denormal_team() {
  if (kBits == 0 || in_parallel_region()) return;
  const int n = omp_get_max_threads();
  const bool on = flush_denormals();
  if (team.on == on && team.threads >= n) return;
  omp_team(n, [](int t, int) {
    if (t != 0) apply_denormal_mode_on_worker();
  });
  team = {team.on == on ? std::max(team.threads, n) : n, on};
}

}  // namespace detail
}  // namespace kiln
