#pragma once
// Per-op profiles of graph execution as a Chrome trace (JSON "traceEvents", complete
// "X" events in microseconds), viewable in Perfetto or chrome://tracing: one event per
// executed op node with its name, node number and output shape, on the thread that
// ran it; and, under "kernelFallbacks", how often kernels could not take their fast
// path while profiling ({op, why, count}; kiln::kernel_fallbacks()).
//
// Turn it on with start_profiling() or the KILN_PROFILE=path environment variable
// (read when the first graph runs); with the variable set, the trace is written to
// that path (atomically) when the process exits. Collection is bounded (the first
// 1,000,000 events are kept).
//
// Thread-safety: every function may be called from any thread.
#include <string>

namespace kiln::graph {

void start_profiling();
bool profiling();
// Stops collecting and returns the events gathered so far as Chrome-trace JSON.
std::string stop_profiling();
// Writes the events gathered so far to `path` (atomically) and keeps collecting.
void write_profile(const std::string& path);

namespace detail {
// Called by the executor: one op of `node` in graph run, from start_us for dur_us.
void record_op(const std::string& name, int node, const std::string& shape, double start_us, double dur_us);
double now_us();
}  // namespace detail

}  // namespace kiln::graph
