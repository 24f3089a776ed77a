#pragma once
// Denormal (subnormal) floats in CPU kernels.
//
// kiln's CPU kernels run with flush-to-zero and denormals-are-zero (the x86 MXCSR FTZ
// and DAZ bits), as TensorFlow's CPU runtime does: arithmetic that reads or makes a
// number below the smallest normal float (1.18e-38 for f32, 2.2e-308 for f64) costs
// many times a normal operation on x86 cores, and training makes such numbers as
// losses fall and Adam's moments of small gradients decay (the traced mlp step's
// 784x256 Adam update after 3000 steps: 55-59 us without, 35-42 us with, and 225-237 us
// in two runs without; docs/benchmarks.md, session 18). With it on, such values read
// and produced by arithmetic are zero; nothing else changes.
//
// On by default; KILN_FLUSH_DENORMALS=0 (read once) or set_flush_denormals(false)
// turns it off. Where: on the calling thread while a kiln op or graph runs (its own
// mode is restored when the call returns), and on the intra-op pool's worker threads
// (kiln/core/parallel.h) from the first op a thread calls until the mode is turned
// off: code of your own that runs on that OpenMP pool meanwhile sees it too. Off,
// kiln leaves every thread's mode as the program set it. x86-64 only; elsewhere a
// no-op.
namespace kiln {

void set_flush_denormals(bool on);
bool flush_denormals();

namespace detail {
// For the lifetime of the scope, the calling thread computes in kiln's denormal mode;
// the first scope on a thread (and the first after the mode or the pool size changed)
// also sets it on that thread's OpenMP team. Nests; cheap when already set.
class DenormalScope {
 public:
  DenormalScope();
  ~DenormalScope();
  DenormalScope(const DenormalScope&) = delete;
  DenormalScope& operator=(const DenormalScope&) = delete;

 private:
  unsigned saved_ = 0;
  bool restore_ = false;
};

// Inside a parallel region, on a worker thread: takes kiln's mode if it differs.
void apply_denormal_mode_on_worker();
}  // namespace detail

}  // namespace kiln
