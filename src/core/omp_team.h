#pragma once
// One OpenMP parallel region, whatever the compiler. Where the compiler emits OpenMP for
// the runtime kiln links (gcc and libgomp, the runtime oneDNN uses too) this is
// `#pragma omp parallel`; where it cannot (clang emits OpenMP only for its own libomp: the
// asan preset), it is the libgomp call that gcc emits for that pragma, so that every
// build runs the same thread team.
#include <omp.h>

#if !defined(_OPENMP)
extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
#endif

namespace kiln::detail {

// Runs body(thread, team_size) on a team of up to n threads (the calling thread is thread
// 0), returning when all are done. body must not throw.
template <typename F>
void omp_team(int n, const F& body) {
#if defined(_OPENMP)
#pragma omp parallel num_threads(n)
  body(omp_get_thread_num(), omp_get_num_threads());
#else
  GOMP_parallel(+[](void* p) { (*static_cast<const F*>(p))(omp_get_thread_num(), omp_get_num_threads()); },
                const_cast<F*>(&body), static_cast<unsigned>(n), 0);
#endif
}

}  // namespace kiln::detail
