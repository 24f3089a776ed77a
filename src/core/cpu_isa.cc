#include "kiln/core/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

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
    case CpuIsa::kAmx: return "amx";
  }
  return "unknown";
}

CpuIsa parse_cpu_isa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512Bf16, CpuIsa::kAmx})
    if (name == cpu_isa_name(isa)) return isa;
  throw InvalidArgumentError("CPU instruction set must be avx2, avx512, avx512_vnni, avx512_bf16 or amx, got '" +
                             std::string(name) + "'");
}

namespace {

std::atomic<int> g_cap{-1};  // -1: not read from the flags yet

// AMX-TILE, AMX-INT8 and AMX-BF16 (CPUID leaf 7 EDX bits 24, 25, 22), the OS saving the
// tile state (XCR0 bits 17 and 18), and Linux granting it to this process.
bool amx_usable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  constexpr unsigned kTile = 1u << 24, kInt8 = 1u << 25, kBf16 = 1u << 22;
  if ((d & (kTile | kInt8 | kBf16)) != (kTile | kInt8 | kBf16)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  constexpr unsigned kTileState = (1u << 17) | (1u << 18);
  if ((lo & kTileState) != kTileState) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

CpuIsa detected_cpu_isa() {
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    // __builtin_cpu_supports checks the OS saves the wide registers (XCR0) too.
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
      return CpuIsa::kAvx2;
    if (!__builtin_cpu_supports("avx512vnni")) return CpuIsa::kAvx512;
    if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512Vnni;
    return amx_usable() ? CpuIsa::kAmx : CpuIsa::kAvx512Bf16;
  }();
  return isa;
}

CpuIsa cpu_isa() {
  int cap = g_cap.load(std::memory_order_acquire);
  if (cap < 0) {
    const std::string& flag = flags().cpu_isa;
    cap = flag.empty() ? static_cast<int>(kBestCpuIsa) : static_cast<int>(parse_cpu_isa(flag));
    int expected = -1;
    g_cap.compare_exchange_strong(expected, cap);
    cap = g_cap.load(std::memory_order_acquire);
  }
  return static_cast<CpuIsa>(std::min(cap, static_cast<int>(detected_cpu_isa())));
}

bool cpu_has(CpuIsa isa) { return static_cast<int>(cpu_isa()) >= static_cast<int>(isa); }

void set_cpu_isa_cap(CpuIsa cap) { g_cap.store(static_cast<int>(cap), std::memory_order_release); }

}  // namespace kiln
