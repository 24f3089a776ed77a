#include "demo.h"
namespace kiln::tools {
int run_demo(int64_t) { return 0; }
}  // namespace kiln::tools
