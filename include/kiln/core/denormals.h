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
// mode is restored when the call returns; off, it is left as the program set it), and
// on the worker threads of the OpenMP pool (kiln/core/parallel.h) that kiln's parallel
// loops and oneDNN's primitives run on, which follow the mode (code of your own that
// runs on that pool sees it too). x86-64 only; elsewhere a no-op.
namespace kiln {

void set_flush_denormals(bool on);
bool flush_denormals();

namespace detail {
// For the lifetime of the scope the calling thread computes in kiln's mode (when on).
// Nests; cheap when already set.
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

// Before a parallel region kiln does not open itself (oneDNN's): gives the calling
// thread's OpenMP team kiln's mode, once per team size and mode. Threads that never
// run one make no team.
void prepare_denormal_team();
}  // namespace detail

}  // namespace kiln
