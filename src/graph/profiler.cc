#include "kiln/graph/profiler.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "kiln/core/file_io.h"
#include "kiln/core/flags.h"
#include "kiln/core/kernel.h"

namespace kiln::graph {
namespace {

struct Event {
  std::string name, shape;
  int node;
  double start, dur;
  size_t tid;
};

struct Profiler {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<Event> events;
  std::vector<KernelFallback> fallbacks_before;  // kernel_fallbacks() when profiling started
  std::string exit_path;
};

Profiler& prof() {
  static Profiler* p = [] {
    auto* q = new Profiler();  // never destroyed: the exit hook may run late
    if (const std::string& path = flags().profile; !path.empty()) {
      q->exit_path = path;
      q->on = true;
      std::atexit([] {
        try {
          write_profile(prof().exit_path);
        } catch (...) {
          // Exit must not throw; a failed write loses only the profile.
        }
      });
    }
    return q;
  }();
  return *p;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// Fallbacks counted since profiling started.
std::vector<KernelFallback> new_fallbacks(const std::vector<KernelFallback>& before) {
  std::vector<KernelFallback> now = kernel_fallbacks(), v;
  for (KernelFallback& f : now) {
    for (const KernelFallback& b : before)
      if (b.op == f.op && b.why == f.why) f.count -= b.count;
    if (f.count > 0) v.push_back(std::move(f));
  }
  return v;
}

std::string to_json(const std::vector<Event>& ev, const std::vector<KernelFallback>& fallbacks) {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << "{\"traceEvents\":[";
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    os << (i ? ",\n" : "\n") << "{\"name\":\"" << escape(e.name) << "\",\"cat\":\"op\",\"ph\":\"X\",\"ts\":" << e.start
       << ",\"dur\":" << e.dur << ",\"pid\":1,\"tid\":" << e.tid << ",\"args\":{\"node\":" << e.node
       << ",\"shape\":\"" << escape(e.shape) << "\"}}";
  }
  // Kernels that left their fast path (kiln/core/kernel.h) while profiling: a key
  // Chrome-trace viewers ignore.
  os << "\n],\"kernelFallbacks\":[";
  for (size_t i = 0; i < fallbacks.size(); ++i)
    os << (i ? "," : "") << "{\"op\":\"" << escape(fallbacks[i].op) << "\",\"why\":\"" << escape(fallbacks[i].why)
       << "\",\"count\":" << fallbacks[i].count << "}";
  os << "],\"displayTimeUnit\":\"ms\"}\n";
  return os.str();
}

}  // namespace

void start_profiling() {
  Profiler& p = prof();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.on) p.fallbacks_before = kernel_fallbacks();
  p.on = true;
}
bool profiling() { return prof().on.load(std::memory_order_relaxed); }

std::string stop_profiling() {
  Profiler& p = prof();
  p.on = false;
  std::lock_guard<std::mutex> lock(p.mu);
  std::string j = to_json(p.events, new_fallbacks(p.fallbacks_before));
  p.events.clear();
  return j;
}

void write_profile(const std::string& path) {
  Profiler& p = prof();
  std::string j;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    j = to_json(p.events, new_fallbacks(p.fallbacks_before));
  }
  write_file_atomic(path, j);
}

namespace detail {

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

void record_op(const std::string& name, int node, const std::string& shape, double start_us, double dur_us) {
  Profiler& p = prof();
  const size_t tid = std::hash<std::thread::id>()(std::this_thread::get_id()) % 100000;
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.events.size() < 1000000) p.events.push_back({name, shape, node, start_us, dur_us, tid});
}

}  // namespace detail
}  // namespace kiln::graph
