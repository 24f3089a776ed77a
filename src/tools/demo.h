#pragma once
#include <cstdint>

namespace kiln::tools {
// Runs the op-library self-check and a matmul timing of size n; returns an exit code.
int run_demo(int64_t n);
}  // namespace kiln::tools
