#pragma once
// Runs a kernel test at every ISA level kiln's CPU kernels have paths for and this
// process may use (kiln/core/cpu_isa.h: the CPU's level, capped by KILN_CPU_ISA): AVX2
// always, AVX-512 where it runs. Prints the levels it could not run, and restores the
// level it found.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "kiln/core/cpu_isa.h"

namespace kiln::testing {

template <typename F>
void at_each_isa_level(F&& body) {
  const CpuIsa found = cpu_isa();
  struct Restore {
    CpuIsa level;
    ~Restore() { set_cpu_isa_cap(level); }
  } restore{found};
  for (const CpuIsa level : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (level > found) {
      std::printf("%s path not run: kiln runs %s here (CPU: %s)\n", cpu_isa_name(level), cpu_isa_name(found),
                  cpu_isa_name(detected_cpu_isa()));
      continue;
    }
    set_cpu_isa_cap(level);
    SCOPED_TRACE(std::string("ISA ") + cpu_isa_name(level));
    body();
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace kiln::testing
