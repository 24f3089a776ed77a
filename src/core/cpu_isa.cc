#include "kiln/core/cpu_isa.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/flags.h"

namespace kiln {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Vnni: return "avx512_vnni";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
  }
  return "unknown";
}

CpuIsa parse_cpu_isa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512Bf16})
    if (name == cpu_isa_name(isa)) return isa;
  throw InvalidArgumentError("CPU instruction set must be avx2, avx512, avx512_vnni or avx512_bf16, got '" +
                             std::string(name) + "'");
}

CpuIsa detected_cpu_isa() {
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    // __builtin_cpu_supports checks the OS saves the wide registers (XCR0) too.
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
      return CpuIsa::kAvx2;
    if (!__builtin_cpu_supports("avx512vnni")) return CpuIsa::kAvx512;
    if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512Vnni;
    return CpuIsa::kAvx512Bf16;
  }();
  return isa;
}

namespace {
std::atomic<int> g_cap{-1};  // -1: not read from the flags yet
}  // namespace

CpuIsa cpu_isa() {
  int cap = g_cap.load(std::memory_order_acquire);
  if (cap < 0) {
    const std::string& flag = flags().cpu_isa;
    cap = flag.empty() ? static_cast<int>(CpuIsa::kAvx512Bf16) : static_cast<int>(parse_cpu_isa(flag));
    int expected = -1;
    g_cap.compare_exchange_strong(expected, cap);
    cap = g_cap.load(std::memory_order_acquire);
  }
  return static_cast<CpuIsa>(std::min(cap, static_cast<int>(detected_cpu_isa())));
}

bool cpu_has(CpuIsa isa) { return static_cast<int>(cpu_isa()) >= static_cast<int>(isa); }

void set_cpu_isa_cap(CpuIsa cap) { g_cap.store(static_cast<int>(cap), std::memory_order_release); }

}  // namespace kiln
