#pragma once
// Runtime instruction-set dispatch for kiln's own CPU kernels. The library is compiled
// for x86-64-v3 (AVX2, FMA, F16C) as its baseline; kernels that pay from AVX-512 are
// compiled a second time for it in their own translation units and chosen once, at
// first use, from what CPUID says this CPU runs. One binary serves AVX2-only and
// AVX-512 machines.
//
// KILN_CPU_ISA (kiln/core/flags.h) or set_cpu_isa_cap() caps the level below what the CPU
// has (tests run every path the machine can run; benchmarks compare them); a cap above
// it is ignored. Thread-safety: reads are safe from any thread; set the cap before the
// kernels first run (kernels that chose already keep their choice).
#include <string_view>

namespace kiln {

enum class CpuIsa : int {
  kAvx2 = 0,        // x86-64-v3: AVX2, FMA, F16C (the build's baseline)
  kAvx512 = 1,      // + AVX-512 F, BW, VL, DQ
  kAvx512Vnni = 2,  // + AVX-512 VNNI (int8 dot products)
  kAvx512Bf16 = 3,  // + AVX-512 BF16 (bf16 dot products)
  kAmx = 4,         // + AMX tiles with int8 and bf16 products, the OS granting the tile state
};
constexpr CpuIsa kBestCpuIsa = CpuIsa::kAmx;  // the highest level kiln has kernels for

const char* cpu_isa_name(CpuIsa isa);
// kAvx2 for "avx2", ...; InvalidArgumentError naming the accepted names otherwise.
CpuIsa parse_cpu_isa(std::string_view name);

// What this CPU (and OS, for the wide registers' and tiles' state) runs. On a CPU with
// AMX the first call asks Linux for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, for
// the whole process); where that is refused the level stops at kAvx512Bf16.
CpuIsa detected_cpu_isa();
// What kiln's kernels use: the detected level, capped by KILN_CPU_ISA / set_cpu_isa_cap.
CpuIsa cpu_isa();
bool cpu_has(CpuIsa isa);  // cpu_isa() >= isa
void set_cpu_isa_cap(CpuIsa cap);

}  // namespace kiln
